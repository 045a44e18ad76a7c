"""Generate the CustomResourceDefinitions from the pydantic models.

    python -m shardmeter_operator.api.crdgen crds/        (make crds)

Pydantic's JSON Schema is turned into a Kubernetes *structural* schema: ``$ref``s inlined,
``Optional`` as ``nullable``, ``int | "auto"`` as ``x-kubernetes-int-or-string`` with a CEL
rule, "preset name or inline object" fields (``model``, ``gpu``, links) as
``x-kubernetes-preserve-unknown-fields`` (the operator validates them with the same
pydantic models), titles dropped, defaults and bounds kept. A test fails when ``crds/``
drifts from this output.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from shardmeter_operator.api import (
    GROUP,
    VERSION,
    GPUPoolSpec,
    GPUPoolStatus,
    TrainingPlanSpec,
    TrainingPlanStatus,
)

Schema = dict[str, Any]
_DROP = {"title", "additionalProperties"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
            extra = {k: v for k, v in node.items() if k != "$ref"}
            return _resolve({**target, **extra}, defs)
        return {k: _resolve(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def _structural(node: Any) -> Any:
    """Rewrite one resolved JSON Schema node into its structural OpenAPI form."""
    if isinstance(node, list):
        return [_structural(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "anyOf" in node:
        options = node.pop("anyOf")
        nullable = any(o.get("type") == "null" for o in options)
        rest = [o for o in options if o.get("type") != "null"]
        types = {o.get("type") for o in rest}
        if len(rest) == 1:
            node = {**_structural(rest[0]), **node}
        elif types == {"integer", "string"}:
            consts = [o["const"] for o in rest if "const" in o]
            node["x-kubernetes-int-or-string"] = True
            if consts:
                allowed = " || ".join(f"self == '{c}'" for c in consts)
                node.setdefault("x-kubernetes-validations", []).append(
                    {
                        "rule": f"type(self) == int || {allowed}",
                        "message": "must be an integer or " + " or ".join(repr(c) for c in consts),
                    }
                )
        elif "string" in types and "object" in types:
            # a preset name or an inline object: validated by the operator's pydantic models
            node["x-kubernetes-preserve-unknown-fields"] = True
        else:
            raise ValueError(f"cannot express anyOf {options} structurally")
        if nullable:
            node["nullable"] = True
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        # JSON Schema 2020 writes an exclusive bound as a number; Kubernetes' OpenAPI v3.0
        # schema (JSONSchemaProps) only accepts `minimum: x` plus `exclusiveMinimum: true`.
        value = node.get(exclusive)
        if isinstance(value, int | float) and not isinstance(value, bool):
            node[bound] = value if bound not in node else _tighter(bound, node[bound], value)
            if node[bound] == value:
                node[exclusive] = True
            else:
                del node[exclusive]
    props = node.get("properties")
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP and not (key == "additionalProperties" and "properties" not in node):
            continue
        if key == "properties":
            out[key] = {k: _structural(v) for k, v in value.items()}
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _structural(value)
            # `true` is what x-kubernetes-preserve-unknown-fields says structurally
        elif key in ("items",):
            out[key] = _structural(value)
        elif key == "default" and value is None:
            continue
        else:
            out[key] = value
    if props is not None:
        out.setdefault("type", "object")
    if (
        out.get("x-kubernetes-preserve-unknown-fields")
        and "type" not in out
        and "properties" not in out
    ):
        out.pop("default", None)
    return out


def _tighter(bound: str, inclusive: float, exclusive: float) -> float:
    return max(inclusive, exclusive) if bound == "minimum" else min(inclusive, exclusive)


def openapi_schema(model: type[BaseModel]) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(_resolve(raw, defs))  # type: ignore[no-any-return]


def _condition_column(name: str, type_: str) -> dict[str, str]:
    return {
        "name": name,
        "type": "string",
        "jsonPath": f'.status.conditions[?(@.type=="{type_}")].status',
    }


def crd(
    kind: str,
    plural: str,
    scope: str,
    spec: type[BaseModel],
    status: type[BaseModel],
    columns: list[dict[str, Any]],
    short: list[str],
) -> dict[str, Any]:
    spec_schema = openapi_schema(spec)
    # pruned as any structural schema is: kube-apiserver refuses an explicit
    # ``x-kubernetes-preserve-unknown-fields: false`` ("must be true or undefined")
    status_schema = openapi_schema(status)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "shardmeter"},
        },
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "plural": plural,
                "singular": kind.lower(),
                "listKind": f"{kind}List",
                "shortNames": short,
                "categories": ["shardmeter"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (spec.__doc__ or "").strip().splitlines()[0],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                            "required": ["spec"],
                        }
                    },
                }
            ],
        },
    }


def all_crds() -> dict[str, dict[str, Any]]:
    age = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    gpupool = crd(
        "GPUPool",
        "gpupools",
        "Cluster",
        GPUPoolSpec,
        GPUPoolStatus,
        [
            {"name": "GPU", "type": "string", "jsonPath": ".spec.gpu"},
            {"name": "Nodes", "type": "integer", "jsonPath": ".spec.nodes"},
            {"name": "GPUs/Node", "type": "integer", "jsonPath": ".spec.gpusPerNode"},
            {"name": "$/GPU-h", "type": "number", "jsonPath": ".spec.pricePerGpuHourUsd"},
            {"name": "Coefficients", "type": "string", "jsonPath": ".status.source"},
            {"name": "Observed", "type": "number", "jsonPath": ".status.observed.computeScale"},
            _condition_column("Ready", "CoefficientsReady"),
            age,
        ],
        ["gpool"],
    )
    plan = crd(
        "TrainingPlan",
        "trainingplans",
        "Namespaced",
        TrainingPlanSpec,
        TrainingPlanStatus,
        [
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            _condition_column("Planned", "Planned"),
            {"name": "Islands", "type": "integer", "jsonPath": ".status.islandCount"},
            {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus"},
            {
                "name": "Tokens/s",
                "type": "number",
                "jsonPath": ".status.predictions.tokensPerSecond",
            },
            {"name": "Hours", "type": "number", "jsonPath": ".status.predictions.hours"},
            {"name": "Cost", "type": "number", "jsonPath": ".status.predictions.costUsd"},
            {
                "name": "Blocking",
                "type": "number",
                "jsonPath": ".status.predictions.outerStepBlockingSeconds",
            },
            _condition_column("Drift", "PredictionDrift"),
            {
                "name": "Workload",
                "type": "string",
                "jsonPath": ".status.launch.workload",
                "priority": 1,
            },
            {**_condition_column("Admitted", "Admitted"), "priority": 1},
            {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1},
            age,
        ],
        ["tplan"],
    )
    return {"gpupools.yaml": gpupool, "trainingplans.yaml": plan}


def render(doc: dict[str, Any]) -> str:
    header = (
        "# Generated by `make crds` (python -m shardmeter_operator.api.crdgen) from the pydantic models.\n"
        "# Do not edit: a test fails when this file drifts from the generator.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True)


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "crds")
    folder.mkdir(parents=True, exist_ok=True)
    for name, doc in all_crds().items():
        (folder / name).write_text(render(doc))
        print(f"wrote {folder / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
