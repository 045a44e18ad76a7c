"""The coefficients document: a versioned JSON record of one pool's fitted (or prior) cost
models, with the raw samples they came from so they can be re-fitted.

It serialises to a file and to the ``data`` of a Kubernetes ConfigMap (a dict of string
keys and string values) without importing kubernetes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shardmeter.cost.features import CANDIDATE_FEATURES, Target
from shardmeter.cost.observed import ObservedCorrection, digest
from shardmeter.errors import SpecError, spec_error_from_validation
from shardmeter.spec.hardware import GPUSpec
from shardmeter.spec.loading import parse_json
from shardmeter.spec.training import AttentionKernel, Precision

SCHEMA_VERSION = 1
CONFIGMAP_KEY = "coefficients.json"
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")


class Source(StrEnum):
    MEASURED = "measured"
    PRIOR = "prior"


class LinkRole(StrEnum):
    """Where a collective runs: among the GPUs of one node, or across nodes."""

    INTRA_NODE = "intra_node"
    INTER_NODE = "inter_node"


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinearFit(_Doc):
    """One compute target: seconds = Σ coefficients[f] · f."""

    coefficients: dict[str, float]
    cv_mape: float | None = None
    """Cross-validated mean absolute percentage error (fraction)."""
    leave_one_model_out_mape: float | None = None
    """MAPE predicting each architecture's samples from a fit on the other architectures
    (fraction): the error on a model the fit never saw. Features are selected by it."""
    n_samples: int = 0
    architectures: int = 0
    """Distinct architectures among the samples (the folds of leave-one-model-out)."""
    floors: dict[str, float] = Field(default_factory=dict)
    """Lower bounds the fit respected, seconds per feature unit: FLOPs per unit ÷ peak
    FLOP/s (`shardmeter.cost.floors`), so no coefficient implies a rate above peak."""

    @model_validator(mode="after")
    def _non_negative(self) -> LinearFit:
        bad = {k: v for k, v in self.coefficients.items() if not v >= 0}
        if bad:
            raise ValueError(f"coefficients must be ≥ 0 (got {bad})")
        return self


class CollectiveFit(_Doc):
    """One collective on one link role: T = k·(P−1)·(latency_s + seconds_per_byte·D/P).

    Inside a node ``seconds_per_byte`` is 1/bus bandwidth of one GPU's link. Across nodes
    it belongs to one ring of the samples; ``parallel_rings`` rings ran at once, each over
    its own NIC rail, so the node's inter-node bus bandwidth is ``parallel_rings /
    seconds_per_byte`` (`shardmeter.cost.collectives`). Documents written before the field
    existed measured per-GPU rails: None means one rail per GPU of the pool's nodes."""

    latency_s: float = Field(ge=0)
    seconds_per_byte: float = Field(ge=0)
    mape: float | None = None
    n_samples: int = 0
    link: str = ""
    """The link the samples crossed (preset name or description)."""
    parallel_rings: int | None = Field(default=None, ge=1)
    """Inter-node only: rings measured at once, one per rail (1 = already per node)."""


class MemoryCoefficients(_Doc):
    """Knobs of the memory model (see `shardmeter.cost.memory`); the bench Job calibrates
    ``activation_scale`` from measured peak memory."""

    activation_scale: float = Field(default=1.0, gt=0)
    """Multiplies the analytic activation bytes per token (1.0 = the documented formula)."""
    logits_bytes_per_element: float = Field(default=10.0, ge=0)
    """Bytes per logit: BF16 logits + FP32 copy for the loss + FP32 gradient."""
    reserve_bytes: int = Field(default=2 * 2**30, ge=0)
    """CUDA context, NCCL buffers: memory never available to tensors."""
    reserve_fraction: float = Field(default=0.05, ge=0, lt=1)
    """Allocator fragmentation headroom, as a fraction of device memory."""
    gathered_units_in_flight: int = Field(default=2, ge=1, le=8)
    """Unsharded units resident at once (current + prefetched)."""


class ComputeSample(_Doc):
    """One measured compute time (median over repeats)."""

    target: Target
    model: dict[str, Any]
    """TransformerSpec fields of the shape measured."""
    micro_batch: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    params_local: float = 0.0
    seconds: float = Field(gt=0)
    group: str = ""
    """Which model the shape came from (for leave-one-model-out validation)."""
    kernel_seconds: float | None = Field(default=None, gt=0)
    """Diagnostic, GPU only: the summed device time of the kernels the unit launched (the
    profiler's figure); ``seconds`` is what the step paid, launch gaps included. Not fitted."""


class CommSample(_Doc):
    collective: Literal["all_gather", "reduce_scatter", "all_reduce"]
    role: LinkRole
    payload_bytes: float = Field(gt=0)
    ranks: int = Field(ge=2)
    seconds: float = Field(gt=0)
    parallel_rings: int = Field(default=1, ge=1)
    """Identical rings timed at once (the benchmark Job runs one inter-node ring per local
    GPU, each on its own rail)."""


class MemorySample(_Doc):
    model: dict[str, Any]
    micro_batch: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    ranks: int = Field(ge=1)
    peak_bytes: float = Field(gt=0)
    """Peak allocated bytes minus what was allocated before the step (activations + temps)."""
    activation_checkpointing: bool = False


class Samples(_Doc):
    compute: list[ComputeSample] = Field(default_factory=list)
    communication: list[CommSample] = Field(default_factory=list)
    memory: list[MemorySample] = Field(default_factory=list)


class ValidationVerdict(_Doc):
    """How the document and the datasheet priors of its GPU predicted whole models the fit
    never saw (the benchmark Job's ``validate``: forward and backward of unseen released
    architectures, each point's error counted): the document earns its place only where it
    predicts them at least as well as the priors, median and maximum."""

    points: int = Field(ge=0)
    """(model, size) points, each with a forward and a backward error."""
    suite: str = Field(default="", max_length=200)
    """What was measured (architectures, sizes), for the status message."""
    document_median_error: float = Field(ge=0)
    document_max_error: float = Field(ge=0)
    priors_median_error: float = Field(ge=0)
    priors_max_error: float = Field(ge=0)

    @property
    def beats_priors(self) -> bool:
        return (
            self.document_median_error <= self.priors_median_error
            and self.document_max_error <= self.priors_max_error
        )

    def describe(self) -> str:
        """``document 6.1 % median / 14.0 % max vs priors 7.3 % / 21.0 % over 14 points``."""
        return (
            f"document {100 * self.document_median_error:.1f} % median / "
            f"{100 * self.document_max_error:.1f} % max vs priors "
            f"{100 * self.priors_median_error:.1f} % / {100 * self.priors_max_error:.1f} % "
            f"over {self.points} points" + (f" ({self.suite})" if self.suite else "")
        )


class CoefficientsDocument(_Doc):
    """Everything the predictor needs for one pool, plus provenance."""

    schema_version: Literal[1] = 1
    source: Source
    gpu: GPUSpec
    """The device the coefficients describe (its peak FLOP/s feeds the roofline guard)."""
    precision: Precision = Precision.BF16
    pool: str | None = None
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    measured_at: datetime | None = None
    software: dict[str, str] = Field(default_factory=dict)
    attention_kernel: AttentionKernel | None = None
    """The fused attention kernel the measured attention ran (the benchmark Job on CUDA:
    ``cudnn``, torchtitan's order); unset: priors (FlashAttention-2's rates) or not known
    (a CPU pool), and no kernel ratio is applied to measured coefficients."""
    compute: dict[Target, LinearFit]
    communication: dict[LinkRole, dict[str, CollectiveFit]]
    memory: MemoryCoefficients = Field(default_factory=MemoryCoefficients)
    notes: list[str] = Field(default_factory=list)
    samples: Samples = Field(default_factory=Samples)
    observed: ObservedCorrection | None = None
    """The correction learned from running training on the pool (`shardmeter.cost.observed`):
    a separate section on top of the fitted or prior coefficients above, which it never
    changes. None: no observations."""
    validation: ValidationVerdict | None = None
    """The benchmark Job's check of this document against the datasheet priors on unseen
    models (``validate``); None: not checked. On priors: the verdict of the measured document
    they were kept over."""

    @model_validator(mode="after")
    def _complete(self) -> CoefficientsDocument:
        missing = [t.value for t in Target if t not in self.compute]
        if missing:
            raise ValueError(f"compute coefficients missing for {', '.join(missing)}")
        for target, fit in self.compute.items():
            unknown = set(fit.coefficients) - set(CANDIDATE_FEATURES[target])
            if unknown:
                raise ValueError(f"compute.{target.value}: unknown features {sorted(unknown)}")
        for role in LinkRole:
            fits = self.communication.get(role, {})
            lacking = [c for c in COLLECTIVES if c not in fits]
            if lacking:
                raise ValueError(f"communication.{role.value} lacks {', '.join(lacking)}")
        if self.source is Source.MEASURED and self.measured_at is None:
            raise ValueError("a measured document needs measured_at")
        return self

    # ---- summaries ------------------------------------------------------------------------
    def fit_mape(self) -> float | None:
        """The worst cross-validated MAPE over compute targets (leave-one-model-out where
        measured, the error on unseen models) and collectives (None for priors), the figure
        the operator exports and alerts on."""
        headline = [
            f.leave_one_model_out_mape if f.leave_one_model_out_mape is not None else f.cv_mape
            for f in self.compute.values()
        ]
        values = [v for v in headline if v is not None]
        values += [
            c.mape
            for fits in self.communication.values()
            for c in fits.values()
            if c.mape is not None and c.n_samples > 0
        ]
        return max(values) if values else None

    @property
    def compute_scale(self) -> float:
        """The observed correction's compute factor (1.0 when none is active)."""
        scale = self.observed.compute_scale if self.observed is not None else None
        return scale if scale is not None else 1.0

    def base(self) -> CoefficientsDocument:
        """The fitted or prior coefficients alone (without the observed correction)."""
        return self if self.observed is None else self.model_copy(update={"observed": None})

    def base_digest(self) -> str:
        """Identifies the base coefficients that observed samples are fitted against."""
        return digest(self.base().to_json(indent=None))

    def age_seconds(self, now: datetime | None = None) -> float:
        stamp = self.measured_at or self.created_at
        return ((now or datetime.now(UTC)) - stamp).total_seconds()

    # ---- (de)serialisation ----------------------------------------------------------------
    def to_json(self, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent)

    def write(self, path: str | Path) -> Path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.to_json() + "\n")
        return target

    def to_configmap_data(self) -> dict[str, str]:
        """A ConfigMap ``data`` dict: the document plus a few flat keys for ``kubectl get``."""
        return {
            CONFIGMAP_KEY: self.to_json(indent=None),
            "source": self.source.value,
            "gpu": self.gpu.name,
            "schema-version": str(self.schema_version),
            "measured-at": self.measured_at.isoformat() if self.measured_at else "",
            "observed-compute-scale": (
                str(self.observed.compute_scale)
                if self.observed is not None and self.observed.compute_scale is not None
                else ""
            ),
        }

    @classmethod
    def from_json(cls, text: str, where: str = "coefficients") -> CoefficientsDocument:
        """The document in ``text`` (``where`` names it in errors: a file, a ConfigMap key);
        invalid JSON and a duplicated key are errors (`shardmeter.spec.loading.parse_json`)."""
        return cls.from_dict(parse_json(text, field=where), where)

    @classmethod
    def from_dict(cls, raw: Any, where: str = "coefficients") -> CoefficientsDocument:
        if isinstance(raw, dict) and raw.get("schema_version") not in (None, SCHEMA_VERSION):
            raise SpecError(
                f"{where}.schema_version",
                f"unsupported version {raw.get('schema_version')!r}; "
                f"this ShardMeter reads version {SCHEMA_VERSION}",
            )
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise spec_error_from_validation(exc, where) from exc

    @classmethod
    def read(cls, path: str | Path) -> CoefficientsDocument:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise SpecError(str(path), f"cannot read coefficients file ({exc.strerror})") from exc
        return cls.from_dict(parse_json(text, source=str(path)), str(path))

    @classmethod
    def from_configmap_data(
        cls, data: dict[str, str] | None, where: str = "configmap"
    ) -> CoefficientsDocument:
        if not data or CONFIGMAP_KEY not in data:
            raise SpecError(f"{where}.data", f"has no {CONFIGMAP_KEY!r} key")
        return cls.from_json(data[CONFIGMAP_KEY], f"{where}.data[{CONFIGMAP_KEY}]")
