"""Number formats: `Precision`, the one type for a training run's compute precision
(`shardmeter.spec.training.TrainingSpec.precision`) and for DiLoCo's pseudo-gradients on the
wire (`shardmeter.spec.training.StrategySpec.outer_precision`)."""

from __future__ import annotations

from shardmeter.spec.base import SpecEnum


class Precision(SpecEnum):
    """A number format. As the **compute** precision (`TrainingSpec.precision`): ``bf16``
    (BF16 compute with FP32 master weights), ``fp8`` (the same with float8 matmuls, torchao
    ``Float8Linear``, dynamic tensorwise scaling; H100/H200 only; ``float8`` is accepted) or
    ``fp32`` (everything in FP32).

    As the **outer** precision (`StrategySpec.outer_precision`, the format of DiLoCo's
    pseudo-gradients on the wire) any of the five: ``fp32`` and ``bf16`` as plain casts;
    ``fp8`` (E4M3), ``int8`` and ``fp4`` (E2M1/E3M0-style 4-bit) quantised with one FP32
    scale per tensor row, as torchft's quantised all_reduce sends them
    (``torchft/quantization.py``: "fp32 scale followed by fp8 values" per row; see
    `shardmeter.cost.outer_precision`). ``int8`` and ``fp4`` are outer formats only."""

    BF16 = "bf16"
    FP32 = "fp32"
    FP8 = "fp8"
    INT8 = "int8"
    FP4 = "fp4"

    @classmethod
    def _missing_(cls, value: object) -> Precision | None:
        if isinstance(value, str) and value.strip().lower() in ("float8", "fp8", "float8_e4m3fn"):
            return cls.FP8
        if isinstance(value, str) and value.strip().lower() in ("bfloat16", "float32"):
            return cls.BF16 if value.strip().lower() == "bfloat16" else cls.FP32
        return None

    @property
    def bits(self) -> int:
        """Bits of one element in this format (scales of the quantised formats not counted)."""
        return {
            Precision.BF16: 16,
            Precision.FP32: 32,
            Precision.FP8: 8,
            Precision.INT8: 8,
            Precision.FP4: 4,
        }[self]

    @property
    def bytes(self) -> int:
        """Bytes of one element of a compute precision (`ValueError` for fp4, which packs two
        elements per byte: use `bits`)."""
        if self.bits % 8:
            raise ValueError(f"{self.value} has no whole-byte element; use Precision.bits")
        return self.bits // 8

    @property
    def quantised(self) -> bool:
        """An outer format sent as scaled integers or minifloats (fp8, int8, fp4) rather than
        a plain cast (fp32, bf16)."""
        return self in (Precision.FP8, Precision.INT8, Precision.FP4)

    @property
    def is_compute(self) -> bool:
        """Whether training can compute in this format (bf16, fp8, fp32)."""
        return self in COMPUTE_PRECISIONS

    @property
    def base(self) -> Precision:
        """The precision of everything but the float8 matmuls (activations, gathered
        parameters, coefficients): bf16 for fp8 training."""
        return Precision.BF16 if self is Precision.FP8 else self


COMPUTE_PRECISIONS = (Precision.BF16, Precision.FP32, Precision.FP8)
"""The formats `TrainingSpec.precision` accepts (int8 and fp4 are outer formats only)."""
