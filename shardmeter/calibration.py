"""Published training throughputs as test cases for the model: read a calibration file
(``shared/calibration/published-throughput.json`` and files of the same schema), turn each
point into specs, predict it from datasheet priors, and compare.

A point names its model (a preset, an entry of the file's ``models``, or an inline spec), GPU
(a preset or an inline spec), nodes × GPUs per node, sequence length, micro-batch and
gradient accumulation, activation checkpointing, precision, ``torch_compile``, sharding and
the inter-node link (a preset, an entry of the file's ``links`` — per-GPU `LinkSpec`s, one rail
per GPU — or null for the GPU's usual network), optionally ``power_cap_watts`` and, for HSDP,
``shard_group_nodes`` (or torchtitan's ``data_parallel_shard_degree`` in GPUs). Models and GPUs
may be ``{preset: NAME, <overrides>}``. A point this model cannot express (another
parallelism, an unknown mode) is reported with the reason instead of a prediction.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from shardmeter.cost.model import CostModel
from shardmeter.errors import ShardMeterError, SpecError, spec_error_from_validation
from shardmeter.sim.scenario import IslandShape, IslandStepModel
from shardmeter.spec.hardware import (
    GPU_ALIASES,
    GPU_LOOKUP,
    LINK_PRESETS,
    NETWORK_PRESETS,
    GPUSpec,
    LinkSpec,
    NetworkSpec,
)
from shardmeter.spec.loading import parse_json, read_text
from shardmeter.spec.model import MODEL_PRESETS, TransformerSpec
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.presets import normalise_name, resolve
from shardmeter.spec.training import AttentionKernel, TrainingSpec


@dataclass(frozen=True)
class Prediction:
    """One published point and what the model predicts for it."""

    id: str
    setup: str
    published_tokens_per_s_per_gpu: float
    predicted_tokens_per_s_per_gpu: float
    bottleneck: str
    predicted_mfu: float
    published_mfu: float | None
    fits_in_memory: bool
    gpu_family: str = "?"
    """The GPU preset the point's GPU derives from, upper-cased (``A100``, ``H100``, …)."""
    source: str = "?"
    """The point's ``group`` (else its source repository): one publication's table."""

    @property
    def ratio(self) -> float:
        return self.predicted_tokens_per_s_per_gpu / self.published_tokens_per_s_per_gpu

    @property
    def signed_error(self) -> float:
        """Predicted ÷ published − 1: positive = optimistic."""
        return self.ratio - 1.0

    @property
    def error(self) -> float:
        return abs(self.signed_error)


@dataclass(frozen=True)
class Summary:
    """Error statistics of a set of predictions."""

    n: int
    median_error: float
    max_error: float
    bias: float
    """Median signed error (predicted ÷ published − 1): the model's optimism."""

    @classmethod
    def of(cls, predictions: Sequence[Prediction]) -> Summary:
        if not predictions:
            return cls(0, math.nan, math.nan, math.nan)
        return cls(
            len(predictions),
            statistics.median(p.error for p in predictions),
            max(p.error for p in predictions),
            statistics.median(p.signed_error for p in predictions),
        )


@dataclass(frozen=True)
class Skipped:
    """A point that could not be predicted, and why."""

    id: str
    reason: str


@dataclass(frozen=True)
class Report:
    predictions: list[Prediction]
    skipped: list[Skipped]

    @property
    def median_error(self) -> float:
        return (
            statistics.median(p.error for p in self.predictions) if self.predictions else math.nan
        )

    @property
    def max_error(self) -> float:
        return max((p.error for p in self.predictions), default=math.nan)

    @property
    def bias(self) -> float:
        """Median signed error: positive = the model is optimistic."""
        return Summary.of(self.predictions).bias

    def by(self, key: Callable[[Prediction], str]) -> dict[str, Summary]:
        """Summaries per value of ``key`` (e.g. ``lambda p: p.gpu_family``), sorted."""
        groups: dict[str, list[Prediction]] = {}
        for p in self.predictions:
            groups.setdefault(key(p), []).append(p)
        return {k: Summary.of(v) for k, v in sorted(groups.items())}


def _lookup(value: Any, presets: Mapping[str, Any], extra: Mapping[str, Any], what: str) -> Any:
    if isinstance(value, Mapping):
        # an inline spec, or {preset: NAME, <overrides>}
        try:
            return resolve(dict(value), presets, what)
        except ValueError as exc:
            raise SpecError(what, str(exc)) from exc
    if not isinstance(value, str):
        raise SpecError(what, f"must be a name or an inline spec (got {value!r})")
    if value in extra:
        return extra[value]
    key = normalise_name(value)
    if key in presets:
        return presets[key]
    known = sorted({*presets, *extra})
    raise SpecError(what, f"unknown {what} {value!r}; known: {', '.join(known)}")


_AC = {
    "none": "none",
    "no": "none",
    "false": "none",
    "full": "full",
    "true": "full",
    "selective-layer": "selective-layer",
    "selective_layer": "selective-layer",
    "selective-op": "selective-op",
    "selective_op": "selective-op",
}


_REDUCE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2}
"""``grad_reduce_dtype`` of a point (FSDP's ``reduce_dtype``) → bytes per gradient element."""


def _flag(point: Mapping[str, Any], key: str, default: Any) -> Any:
    value = point.get(key, default)
    return default if value is None else value


def point_specs(
    point: Mapping[str, Any], models: Mapping[str, Any], links: Mapping[str, Any]
) -> tuple[TransformerSpec, TrainingSpec, PoolSpec, int, int, int]:
    """(model, training, pool, micro_batch, accumulation, nodes) for one point."""
    other = point.get("other_parallelism")
    if other not in (None, "", "none", "None"):
        raise SpecError(
            "other_parallelism",
            f"{other!r}: only FSDP/HSDP data parallelism is modelled (no tensor, pipeline or "
            "context parallelism)",
        )
    model_data = _lookup(point.get("model"), MODEL_PRESETS, models, "model")
    model = (
        model_data
        if isinstance(model_data, TransformerSpec)
        else TransformerSpec.model_validate(model_data)
    )
    gpu_data = _lookup(point.get("gpu"), GPU_LOOKUP, {}, "gpu")
    gpu = gpu_data if isinstance(gpu_data, GPUSpec) else GPUSpec.model_validate(gpu_data)
    nodes, gpn = int(point["nodes"]), int(point["gpus_per_node"])
    seq, mb = int(point["seq_len"]), int(point["micro_batch"])
    accumulation = int(_flag(point, "accumulation", 1))
    if min(nodes, gpn, seq, mb, accumulation) < 1:
        raise SpecError("nodes/gpus_per_node/seq_len/micro_batch/accumulation", "must be ≥ 1")
    ac_raw = str(_flag(point, "activation_checkpointing", "none")).strip().lower()
    if ac_raw not in _AC:
        raise SpecError(
            "activation_checkpointing",
            f"unknown mode {ac_raw!r}; known: none, full, selective-layer, selective-op",
        )
    group_nodes = _flag(point, "shard_group_nodes", None)
    degree = _flag(point, "data_parallel_shard_degree", None)  # torchtitan's name, in GPUs
    if group_nodes is None and degree is not None:
        if int(degree) % gpn:
            raise SpecError(
                "data_parallel_shard_degree",
                f"{degree} is not a whole number of {gpn}-GPU nodes; HSDP is modelled with "
                "shard groups of whole nodes",
            )
        group_nodes = max(1, int(degree) // gpn)
    link_name = point.get("inter_node_link")
    inter: LinkSpec | None = None
    if link_name is not None:
        raw = _lookup(link_name, LINK_PRESETS, links, "inter_node_link")
        inter = raw if isinstance(raw, LinkSpec) else LinkSpec.model_validate(raw)
    network: NetworkSpec | None = None
    if point.get("network") is not None:
        raw_net = _lookup(point["network"], NETWORK_PRESETS, {}, "network")
        network = (
            raw_net if isinstance(raw_net, NetworkSpec) else NetworkSpec.model_validate(raw_net)
        )
    recipe = str(_flag(point, "float8_recipe", "tensorwise")).strip().lower()
    if recipe != "tensorwise":
        raise SpecError(
            "float8_recipe",
            f"{recipe!r}: only torchao's tensorwise dynamic scaling is modelled (rowwise scales "
            "and the rowwise-scaled GEMM are not)",
        )
    reduce_dtype = str(_flag(point, "grad_reduce_dtype", "fp32")).strip().lower()
    if reduce_dtype not in _REDUCE_BYTES:
        raise SpecError(
            "grad_reduce_dtype",
            f"unknown dtype {reduce_dtype!r}; known: {', '.join(_REDUCE_BYTES)}",
        )
    training = TrainingSpec.model_validate(
        {
            "seq_len_tokens": seq,
            "global_batch_tokens": seq * mb * accumulation * nodes * gpn,
            "precision": _flag(point, "precision", "bf16"),
            "activation_checkpointing": _AC[ac_raw],
            "activation_checkpointing_every": int(
                _flag(point, "activation_checkpointing_every", 2)
            ),
            "grad_reduce_bytes": _REDUCE_BYTES[reduce_dtype],
            "torch_compile": bool(_flag(point, "torch_compile", False)),
            "torch_compile_loss": bool(_flag(point, "torch_compile_loss", True)),
            "param_all_gather": _flag(point, "param_all_gather", None),
            "attention_kernel": _flag(point, "attention_kernel", "flash2"),
            "sharding": _flag(point, "sharding", "fsdp"),
            "shard_group_nodes": int(group_nodes or 1),
        }
    )
    cap = _flag(point, "power_cap_watts", None)
    pool = PoolSpec(
        name="published",
        gpu=gpu,
        nodes=nodes,
        gpus_per_node=gpn,
        inter_node_link=inter,
        network=network,
        power_cap_watts=float(cap) if cap is not None else None,
    )
    return model, training, pool, mb, accumulation, nodes


def _setup(
    point: Mapping[str, Any], model: TransformerSpec, training: TrainingSpec, pool: PoolSpec
) -> str:
    extras = [training.activation_checkpointing.value]
    if training.precision.value != "bf16":
        extras.append(training.precision.value)
    if training.torch_compile:
        extras.append("compile")
    if training.sharding.value != "fsdp":
        extras.append(training.sharding.value)
    if training.param_all_gather is not None:
        extras.append(f"{training.param_all_gather.value}-gather")
    if training.attention_kernel is not AttentionKernel.FLASH2:
        extras.append(training.attention_kernel.value)
    limit = pool.gpu.power_limit(pool.power_cap_watts)
    if limit < pool.gpu.tdp_watts:
        extras.append(f"{limit:g} W")
    return (
        f"{model.name} {point['nodes']}×{point['gpus_per_node']} "
        f"{point['gpu'] if isinstance(point['gpu'], str) else pool.gpu.name} "
        f"s{training.seq_len_tokens} b{point['micro_batch']}×{_flag(point, 'accumulation', 1)} "
        + " ".join(extras)
    )


def predict_point(
    point: Mapping[str, Any], models: Mapping[str, Any], links: Mapping[str, Any]
) -> Prediction:
    model, training, pool, mb, accumulation, nodes = point_specs(point, models, links)
    cm = CostModel(model, training, pool)
    shape = IslandShape(nodes, pool.gpus_per_node)
    step = IslandStepModel(cm, shape, mb)
    seconds = step.step_s(accumulation)
    tokens = accumulation * mb * training.seq_len_tokens
    published = float(point["published_tokens_per_s_per_gpu"])
    if not published > 0:
        raise SpecError("published_tokens_per_s_per_gpu", f"must be > 0 (got {published!r})")
    mfu = point.get("published_mfu")
    return Prediction(
        id=str(point.get("id", "?")),
        setup=_setup(point, model, training, pool),
        published_tokens_per_s_per_gpu=published,
        predicted_tokens_per_s_per_gpu=tokens / seconds,
        bottleneck=step.simulate(accumulation).verdict,
        predicted_mfu=step.mfu(accumulation),
        published_mfu=float(mfu) if isinstance(mfu, int | float) else None,
        fits_in_memory=step.fits(accumulation),
        gpu_family=_gpu_family(point.get("gpu"), pool.gpu.name),
        source=str(point.get("group") or (point.get("source") or {}).get("repo") or "?"),
    )


def _gpu_family(value: Any, name: str) -> str:
    """``a100`` for ``a100``, ``a100-80gb-sxm`` or ``{preset: a100, …}``; else the GPU name."""
    preset = value.get("preset") if isinstance(value, Mapping) else value
    if isinstance(preset, str):
        key = normalise_name(preset)
        key = GPU_ALIASES.get(key, key)
        if key in GPU_LOOKUP:
            return key.split("-")[0].upper()
    return name


def evaluate(document: Mapping[str, Any]) -> Report:
    """Predict every point of a calibration document."""
    models = document.get("models") or {}
    links = document.get("links") or {}
    points = document.get("points")
    if not isinstance(points, list):
        raise SpecError("points", "must be a list of published points")
    predictions: list[Prediction] = []
    skipped: list[Skipped] = []
    for idx, point in enumerate(points):
        pid = str(point.get("id", f"points[{idx}]")) if isinstance(point, Mapping) else str(idx)
        if not isinstance(point, Mapping):
            skipped.append(Skipped(pid, "not a mapping"))
            continue
        try:
            predictions.append(predict_point(point, models, links))
        except ValidationError as exc:
            skipped.append(Skipped(pid, str(spec_error_from_validation(exc, pid))))
        except ShardMeterError as exc:
            skipped.append(Skipped(pid, str(exc)))
        except (KeyError, TypeError, ValueError) as exc:
            skipped.append(Skipped(pid, f"cannot read the point ({type(exc).__name__}: {exc})"))
    return Report(predictions, skipped)


def apply_setups(document: Mapping[str, Any], setups: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` with the setup facts of a setups file added to the points it names
    (``{"facts": {key: {"value": v, "source": "...", "points": [id, ...]}}}``): facts the
    published file does not record. A fact only adds a key a point lacks — a published
    value or a stated setup is never overridden — and naming an unknown point is an error."""
    points = [dict(p) for p in document.get("points", [])]
    by_id = {str(p.get("id")): p for p in points}
    for key, fact in (setups.get("facts") or {}).items():
        if not (isinstance(fact, Mapping) and fact.get("source") and "value" in fact):
            raise SpecError(f"facts.{key}", "needs a 'value' and the 'source' it comes from")
        for pid in fact.get("points") or []:
            if pid not in by_id:
                raise SpecError(f"facts.{key}.points", f"{pid!r} is not a point of the file")
            if key in by_id[pid]:
                raise SpecError(
                    f"facts.{key}.points",
                    f"{pid!r} already states {key} = {by_id[pid][key]!r}; a fact only adds "
                    "what the published file leaves out",
                )
            by_id[pid][key] = fact["value"]
    return {**document, "points": points}


def load_document(path: str | Path) -> dict[str, Any]:
    """A published-throughput file as its JSON object (errors name the file)."""
    document = parse_json(read_text(path), source=str(path))  # a duplicated key is an error
    if not isinstance(document, dict):
        raise SpecError(str(path), "must be a JSON object with a 'points' list")
    return document


def read(path: str | Path) -> Report:
    return evaluate(load_document(path))
