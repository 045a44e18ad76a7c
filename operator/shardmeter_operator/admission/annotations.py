"""The annotations a workload opts in to placement with, parsed into the planning request of
the TrainingPlan that records it. Pure. Every error names the annotation to change."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from shardmeter.errors import SpecError

PREFIX = "shardmeter.io/"
PLACEMENT = PREFIX + "placement"
"""``auto``: place this workload (its namespace must be opted in); ``off`` or absent: leave it."""
MODEL = PREFIX + "model"
"""A model preset, e.g. ``llama-3.1-8b``."""
MODEL_CONFIGMAP = PREFIX + "model-configmap"
"""A ConfigMap of the workload's namespace whose ``model.yaml`` holds the architecture (a
TransformerSpec, or ``{preset: NAME, <overrides>}``), instead of :data:`MODEL`."""
TOTAL_TOKENS = PREFIX + "total-tokens"
GLOBAL_BATCH_TOKENS = PREFIX + "global-batch-tokens"
SEQ_LEN_TOKENS = PREFIX + "seq-len-tokens"
OBJECTIVE = PREFIX + "objective"
"""``min-time``, ``min-cost``, ``throughput-fraction`` (default), ``min-energy``, ``min-co2``."""
QUALITY_ADJUSTED = PREFIX + "quality-adjusted"
"""``true`` (default) ranks plans by time and cost to data-parallel's loss; ``false`` by raw
throughput, as the paper does."""
STRATEGY = PREFIX + "strategy"
"""``streaming-diloco`` (default), ``diloco`` or ``fsdp``."""
POOLS = PREFIX + "pools"
"""Comma-separated GPUPools the plan may use (default: every valid GPUPool)."""
MAX_ISLANDS = PREFIX + "max-islands"
ACTIVATION_CHECKPOINTING = PREFIX + "activation-checkpointing"

DEFAULT_STRATEGY = "streaming-diloco"
MODEL_KEY = "model.yaml"
"""The key of :data:`MODEL_CONFIGMAP` that holds the architecture."""

SPEC_FIELDS = {
    "spec.model": MODEL,
    "spec.training.totalTokens": TOTAL_TOKENS,
    "spec.training.globalBatchTokens": GLOBAL_BATCH_TOKENS,
    "spec.training.seqLenTokens": SEQ_LEN_TOKENS,
    "spec.training.activationCheckpointing": ACTIVATION_CHECKPOINTING,
    "spec.objective.qualityAdjusted": QUALITY_ADJUSTED,
    "spec.objective": OBJECTIVE,
    "spec.strategy": STRATEGY,
    "spec.pools": POOLS,
    "spec.constraints.maxIslands": MAX_ISLANDS,
}
SPEC_FIELDS.update(
    {k.removeprefix("spec."): v for k, v in SPEC_FIELDS.items() if k.count(".") > 1}
)  # the planner's messages name the request's fields without ``spec.``
"""The TrainingPlan fields each annotation sets: a message about one names the annotation."""


class AnnotationError(SpecError):
    """An annotation (``field``) of a workload opted in to placement is missing or invalid."""


@dataclass(frozen=True)
class PlacementRequest:
    """What a workload's annotations ask for."""

    model: str | None
    """A preset name (None: :attr:`model_configmap`)."""
    model_configmap: str | None
    total_tokens: int
    global_batch_tokens: int
    seq_len_tokens: int
    objective: str
    strategy: str
    """Empty: the workload's default (:data:`DEFAULT_STRATEGY` for a JobSet)."""
    pools: tuple[str, ...]
    """Empty: every valid GPUPool."""
    max_islands: int | None
    activation_checkpointing: str | None
    quality_adjusted: bool | None = None


def opted_in(annotations: Mapping[str, str]) -> bool:
    """Whether the workload asks to be placed. Raises for a value that is neither on nor off."""
    value = annotations.get(PLACEMENT, "off").strip().lower()
    if value not in ("auto", "off"):
        raise AnnotationError(PLACEMENT, f"is {value!r}: use auto (place it) or off")
    return value == "auto"


def _int(annotations: Mapping[str, str], key: str, *, required: bool) -> int | None:
    raw = annotations.get(key)
    if raw is None or not raw.strip():
        if required:
            raise AnnotationError(key, "is required for placement (an integer, e.g. 1e9 or 4096)")
        return None
    text = raw.strip().replace("_", "")
    try:
        value = float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise AnnotationError(key, f"is {raw!r}: must be an integer") from None
    if value != int(value) or value < 1:
        raise AnnotationError(key, f"is {raw!r}: must be a positive integer")
    return int(value)


def parse(annotations: Mapping[str, str]) -> PlacementRequest:
    """The placement request of an opted-in workload's annotations."""
    model = (annotations.get(MODEL) or "").strip() or None
    configmap = (annotations.get(MODEL_CONFIGMAP) or "").strip() or None
    if (model is None) == (configmap is None):
        raise AnnotationError(
            MODEL,
            f"set exactly one of {MODEL} (a preset, e.g. llama-3.1-8b) and {MODEL_CONFIGMAP}",
        )
    pools = tuple(p.strip() for p in (annotations.get(POOLS) or "").split(",") if p.strip())
    total = _int(annotations, TOTAL_TOKENS, required=True)
    batch = _int(annotations, GLOBAL_BATCH_TOKENS, required=True)
    seq = _int(annotations, SEQ_LEN_TOKENS, required=True)
    assert total is not None and batch is not None and seq is not None
    quality = (annotations.get(QUALITY_ADJUSTED) or "").strip().lower()
    if quality not in ("", "true", "false"):
        raise AnnotationError(QUALITY_ADJUSTED, f"is {quality!r}: use true or false")
    return PlacementRequest(
        model=model,
        model_configmap=configmap,
        total_tokens=total,
        global_batch_tokens=batch,
        seq_len_tokens=seq,
        objective=(annotations.get(OBJECTIVE) or "throughput-fraction").strip(),
        strategy=(annotations.get(STRATEGY) or "").strip(),
        pools=pools,
        max_islands=_int(annotations, MAX_ISLANDS, required=False),
        activation_checkpointing=(annotations.get(ACTIVATION_CHECKPOINTING) or "").strip() or None,
        quality_adjusted=None if not quality else quality == "true",
    )


def model_from_configmap(name: str, configmap: Mapping[str, Any] | None) -> Any:
    """The architecture a :data:`MODEL_CONFIGMAP` ConfigMap holds (validated with the plan)."""
    if configmap is None:
        raise AnnotationError(MODEL_CONFIGMAP, f"names ConfigMap {name}, which does not exist")
    text = (configmap.get("data") or {}).get(MODEL_KEY)
    if not text:
        raise AnnotationError(MODEL_CONFIGMAP, f"ConfigMap {name} has no key {MODEL_KEY}")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AnnotationError(
            MODEL_CONFIGMAP, f"ConfigMap {name} key {MODEL_KEY} is not YAML: {exc}"
        ) from None


def plan_fields(request: PlacementRequest, model: Any, pools: Sequence[str]) -> dict[str, Any]:
    """The TrainingPlan spec fields the request sets (the template and launch come apart)."""
    training: dict[str, Any] = {
        "seqLenTokens": request.seq_len_tokens,
        "globalBatchTokens": request.global_batch_tokens,
        "totalTokens": request.total_tokens,
    }
    if request.activation_checkpointing:
        training["activationCheckpointing"] = request.activation_checkpointing
    kind = request.strategy or DEFAULT_STRATEGY
    strategy: dict[str, Any] = {"kind": kind}
    if kind != "fsdp":
        strategy.update(syncEvery="auto", fragments="auto", fragmentSyncDelay="auto")
    spec: dict[str, Any] = {
        "model": model,
        "training": training,
        "strategy": strategy,
        "objective": {"kind": request.objective}
        if request.quality_adjusted is None
        else {"kind": request.objective, "qualityAdjusted": request.quality_adjusted},
        "pools": [{"name": p} for p in pools],
    }
    if request.max_islands is not None:
        spec["constraints"] = {"maxIslands": request.max_islands}
    return spec


def name_annotation(message: str) -> str:
    """``message`` with the TrainingPlan fields an annotation sets named by the annotation."""
    for field, key in sorted(SPEC_FIELDS.items(), key=lambda kv: -len(kv[0])):
        message = message.replace(field, key)
    return message
