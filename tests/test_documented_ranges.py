"""Every documented range is enforced (issue 28). The ranges are not listed here: they are
read from what documents them, so a range documented tomorrow without enforcement fails.

* **Plan files and custom resources**: the "range" column of docs/reference/*.md comes from
  the models' metadata (``tools/gendocs.py``: ``ge``/``gt``/``le``/``lt``, lengths, patterns,
  the bounds of unit-reading fields) and the enum and ``Literal`` types give the "type" column;
  the ``int | "auto"`` fields of ``StrategySpec`` (``syncEvery`` "1–10,000" in its description)
  take their bounds from ``AUTO_FIELD_BOUNDS``, which their validator, flags and CRD rule use.
  Walking every field the plan file (``PlanSpec``), a ``TrainingPlan`` and a ``GPUPool`` reach,
  each documented bound is crossed by one value in an otherwise valid document, and
  - ``shardmeter plan FILE`` exits 2 with one line naming the key as written
    (``pools[0].gpu.smCount``);
  - the generated CRD's schema (crds/, validated as the API server does, with the emulator's
    JSON-schema and CEL validation) refuses it at the field's path; where the CRD cannot
    carry the field's schema — inside a "preset name or inline object" field (``model``,
    ``gpu``, the links, ``network``: ``x-kubernetes-preserve-unknown-fields``) — the CRD is
    asserted to be such a node and the operator's validation of the spec refuses it.
* **CLI flags**: every option whose ``--help`` states a range ``(LOW–HIGH…)`` or lists its
  values (``a|b|c``) is given a value beyond it; the command exits 2 with one line naming the
  flag.
"""

from __future__ import annotations

import argparse
import copy
import enum
import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, get_args, get_origin

import annotated_types
import pytest
import yaml
from pydantic import BaseModel, ValidationError

from shardmeter.cli.main import build_parser, main
from shardmeter.plan.schema import PlanSpec
from shardmeter.spec.hardware import (
    GPU_LOOKUP,
    LINK_PRESETS,
    NETWORK_PRESETS,
    GPUSpec,
    LinkSpec,
    NetworkSpec,
)
from shardmeter.spec.model import MODEL_PRESETS, TransformerSpec
from shardmeter.spec.training import AUTO_FIELD_BOUNDS, StrategySpec
from shardmeter_operator.api import GPUPoolSpec, TrainingPlanSpec
from support.kube_emulator import structural

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
PRESET: dict[type, dict[str, Any]] = {
    TransformerSpec: MODEL_PRESETS["llama-3.1-8b"],
    GPUSpec: GPU_LOOKUP["h200"],
    LinkSpec: LINK_PRESETS["ib-ndr"],
    NetworkSpec: NETWORK_PRESETS["8x-ndr"],
}
"""What an absent or preset-named model, GPU, link or network is written out as when a case
sets one of its fields (the preset's fields in full: every such field takes them)."""


def _written(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dict(value)


LOOKUPS = {
    TransformerSpec: MODEL_PRESETS,
    GPUSpec: GPU_LOOKUP,
    LinkSpec: LINK_PRESETS,
    NetworkSpec: NETWORK_PRESETS,
}


def _gendocs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gendocs", REPO / "tools" / "gendocs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


G = _gendocs()


# ---- out-of-range values from a field's documented range ------------------------------------


def _below(value: float, integral: bool) -> float:
    return value - 1 if integral else value - max(abs(value) * 0.5, 0.5)


def _above(value: float, integral: bool) -> float:
    return value + 1 if integral else value + max(abs(value) * 0.5, 0.5)


def _is(annotation: Any, kind: type) -> bool:
    return any(m is kind for m in G._members(annotation))


def bad_values(field: Any) -> Iterator[tuple[str, Any]]:
    """(the documented bound, a value just beyond it) for every bound ``field`` documents."""
    integral = _is(field.annotation, int) and not _is(field.annotation, float)
    listy = any(get_origin(m) in (list, tuple) for m in G._members(field.annotation))
    mapping = any(get_origin(m) is dict for m in G._members(field.annotation))
    for m in G._metadata(field):
        if isinstance(m, annotated_types.Ge):
            yield f"≥ {m.ge}", _below(m.ge, integral)
        elif isinstance(m, annotated_types.Gt):
            yield f"> {m.gt}", m.gt
        elif isinstance(m, annotated_types.Le):
            yield f"≤ {m.le}", _above(m.le, integral)
        elif isinstance(m, annotated_types.Lt):
            yield f"< {m.lt}", m.lt
        elif isinstance(m, annotated_types.MaxLen):
            n = m.max_length + 1
            if mapping:
                yield f"at most {m.max_length}", {f"k{i}": "v" for i in range(n)}
            elif listy:
                yield f"at most {m.max_length}", [f"p{i}" for i in range(n)]
            else:
                yield f"at most {m.max_length} long", "a" * n
        elif isinstance(m, annotated_types.MinLen) and m.min_length:
            yield f"at least {m.min_length}", [] if listy else ""
        elif hasattr(m, "pattern") and isinstance(m.pattern, str):
            yield f"matches {m.pattern}", "Not_A-Name!"
        elif (bounds := G._unit_bounds(m)) is not None:
            free = dict(
                zip(
                    m.func.__code__.co_freevars,
                    (c.cell_contents for c in m.func.__closure__),
                    strict=True,
                )
            )
            yield bounds, _below(free["low"], False)
            yield bounds, _above(free["high"], False)
    for member in G._members(field.annotation):
        if isinstance(member, type) and issubclass(member, enum.Enum):
            yield f"one of {[e.value for e in member]}", "no-such-value"
        elif get_origin(member) is Literal:
            values = get_args(member)
            if all(type(v) is int for v in values):
                yield f"one of {values}", max(values) + 1
            elif all(isinstance(v, str) for v in values) and "auto" not in values:
                yield f"one of {values}", "no-such-value"


# ---- the fields a document reaches ----------------------------------------------------------


@dataclass(frozen=True)
class Case:
    path: tuple[str | int, ...]
    """Keys as written (camelCase) and list indices, from the document's root."""
    models: tuple[type[BaseModel], ...]
    """The model of each step of ``path`` that opens a sub-model (for presets)."""
    bound: str
    value: Any

    @property
    def shown(self) -> str:
        out = ""
        for p in self.path:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
        return out

    def __str__(self) -> str:
        return f"{self.shown} {self.bound}: {self.value!r}"[:120]


def cases(
    model: type[BaseModel], path: tuple[Any, ...] = (), seen: tuple[type, ...] = ()
) -> Iterator[Case]:
    for name, field in model.model_fields.items():
        if field.exclude is True:
            continue
        key = field.alias or name
        for bound, value in bad_values(field):
            yield Case((*path, key), seen, bound, value)
        if model is StrategySpec and name in AUTO_FIELD_BOUNDS:  # `int | "auto"`: their bounds
            low, high = AUTO_FIELD_BOUNDS[name]  # are the spec's (validator, flags, CRD rule)
            yield Case((*path, key), seen, f"{low}–{high} or auto", low - 1)
            yield Case((*path, key), seen, f"{low}–{high} or auto", high + 1)
        for member in G._members(field.annotation):
            inner = member
            step: tuple[Any, ...] = (key,)
            if get_origin(member) in (list, tuple):
                (inner, *_) = get_args(member) or (None,)
                step = (key, 0)
            if isinstance(inner, type) and issubclass(inner, BaseModel) and inner not in seen:
                yield from cases(inner, (*path, *step), (*seen, inner))


def put(doc: dict[str, Any], case: Case) -> dict[str, Any]:
    """``doc`` with ``case.value`` at ``case.path``; a preset-named or absent model, GPU, link
    or network on the way becomes ``{preset: NAME}`` (or the first list item is made)."""
    doc = copy.deepcopy(doc)
    node: Any = doc
    models = iter(case.models[1:])  # the root is the document itself
    for i, step in enumerate(case.path[:-1]):
        nxt = case.path[i + 1]
        if isinstance(step, int):
            while len(node) <= step:
                node.append({})
            child = node[step]
        else:
            child = node.get(step)
        if isinstance(nxt, int):
            if not isinstance(child, list):
                child = []
        elif not isinstance(child, dict):
            cls = next(models, None)
            if isinstance(child, str) and cls in LOOKUPS:
                child = _written(LOOKUPS[cls][child])
            else:
                child = _written(PRESET[cls]) if cls in PRESET else {}
        else:
            next(models, None)
        node[step] = child
        node = child
    node[case.path[-1]] = case.value
    return doc


# ---- plan files -----------------------------------------------------------------------------

PLAN_BASE = yaml.safe_load((EXAMPLES / "case-study.yaml").read_text())
PLAN_CASES = list(cases(PlanSpec, seen=(PlanSpec,)))


def test_the_walk_finds_the_documented_ranges() -> None:
    shown = {c.shown for c in PLAN_CASES}
    for key in ("pools[0].gpusPerNode", "training.gradReduceBytes", "model.hiddenSize"):
        assert key in shown
    assert "pools[0].gpu.smCount" in shown and "pools[0].intraNodeLink.latencyS" in shown
    assert "strategy.syncEvery" in shown
    assert len(PLAN_CASES) > 150


@pytest.mark.parametrize("case", PLAN_CASES, ids=str)
def test_a_plan_file_refuses_every_documented_range(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(put(PLAN_BASE, case)))
    assert main(["plan", str(path)]) == 2, f"{case} was accepted"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f": {case.shown}:" in err[0] or f": {case.shown} " in err[0], err[0]


# ---- the CRDs -------------------------------------------------------------------------------


def _crd_schema(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "crds" / name).read_text())
    return doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def _schema_at(schema: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any] | None:
    """The schema node of ``path`` under ``spec``, or None when a node on the way keeps
    unknown fields without describing them (the field is not in the CRD's schema)."""
    node: dict[str, Any] = schema["properties"]["spec"]
    for step in path:
        if node.get("x-kubernetes-preserve-unknown-fields") and "properties" not in node:
            return None
        node = node["items"] if isinstance(step, int) else node["properties"][step]
    return node


KINDS = {
    "TrainingPlan": (
        TrainingPlanSpec,
        _crd_schema("trainingplans.yaml"),
        yaml.safe_load((EXAMPLES / "trainingplan.yaml").read_text()),
    ),
    "GPUPool": (
        GPUPoolSpec,
        _crd_schema("gpupools.yaml"),
        yaml.safe_load((EXAMPLES / "gpupool-cluster-a.yaml").read_text()),
    ),
}
CRD_CASES = [
    (kind, case) for kind, (model, _, _) in KINDS.items() for case in cases(model, seen=(model,))
]


def test_the_example_resources_pass_their_crds() -> None:
    for model, schema, body in KINDS.values():
        assert structural.schema_errors(body, schema) == []
        model.model_validate(body["spec"])


@pytest.mark.parametrize(("kind", "case"), CRD_CASES, ids=str)
def test_the_crds_refuse_every_documented_range(kind: str, case: Case) -> None:
    model, schema, base = KINDS[kind]
    body = base | {"spec": put(base["spec"], case)}
    if _schema_at(schema, case.path) is None:
        # a preset name or an inline object: the CRD keeps it as given, the operator's
        # validation of the spec (Valid=False naming the field) refuses it
        with pytest.raises(ValidationError):
            model.model_validate(body["spec"])
        return
    errors = structural.schema_errors(body, schema)
    assert errors, f"the {kind} CRD accepts {case}"
    assert any(case.shown.split("[")[0].split(".")[-1] in e for e in errors) or any(
        str(case.path[-1]) in e for e in errors
    ), errors


# ---- CLI flags ------------------------------------------------------------------------------

BASE_ARGS = {
    "predict": ["--model", "llama-3.2-1b", "--gpu", "h100"],
    "simulate": ["--model", "llama-3.2-1b", "--gpu", "h100"],
    "plan": [str(EXAMPLES / "case-study.yaml")],
}
RANGE = re.compile(r"\((-?[\d,.]+)–(-?[\d,.]+)")


def _number(text: str) -> float:
    value = float(text.replace(",", ""))
    return int(value) if value.is_integer() and "." not in text else value


def flag_cases() -> Iterator[tuple[str, str, str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, p in sub.choices.items():
        for action in p._actions:
            if not action.option_strings or not action.help:
                continue
            flag = action.option_strings[-1]
            text = " ".join(action.help.split())
            if match := RANGE.search(text):
                low, high = _number(match.group(1)), _number(match.group(2))
                integral = isinstance(low, int) and isinstance(high, int)
                for value in (_below(low, integral), _above(high, integral)):
                    shown = str(int(value)) if integral else repr(value)
                    yield command, flag, shown
            metavar = action.metavar if isinstance(action.metavar, str) else ""
            if action.choices or (
                "|" in metavar and "FILE" not in metavar and "NAME" not in metavar
            ):
                if "auto" in metavar:
                    continue
                yield command, flag, "no-such-value"


FLAG_CASES = list(flag_cases())


def test_the_flags_document_their_ranges() -> None:
    flags = {f for _, f, _ in FLAG_CASES}
    assert {"--nodes", "--pue", "--grad-reduce-bytes", "--sync-every", "--rounds"} <= flags


@pytest.mark.parametrize(("command", "flag", "value"), FLAG_CASES)
def test_every_flag_refuses_values_beyond_its_documented_range(
    command: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, *BASE_ARGS[command], flag, value]) == 2, f"{flag} {value} accepted"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err


ENUM_CASES = [
    (kind, case)
    for kind, case in CRD_CASES
    if case.bound.startswith("one of") and _schema_at(KINDS[kind][1], case.path) is not None
]


@pytest.mark.parametrize(("kind", "case"), ENUM_CASES, ids=str)
def test_the_crds_refuse_the_enum_members_a_field_refuses(kind: str, case: Case) -> None:
    """A member of a field's enum type the field itself refuses (``training.precision:
    int8``, an outer precision only) is refused by the CRD too."""
    model, schema, base = KINDS[kind]
    node = _schema_at(schema, case.path)
    assert node is not None
    for member in node.get("enum") or []:
        body = base | {"spec": put(base["spec"], Case(case.path, case.models, "", member))}
        try:
            model.model_validate(body["spec"])
        except ValidationError as exc:
            here = [e for e in exc.errors() if tuple(e["loc"][: len(case.path)]) == case.path]
            if here:
                assert structural.schema_errors(body, schema), f"{kind} CRD accepts {member}"
