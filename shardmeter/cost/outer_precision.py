"""DiLoCo's pseudo-gradients on the wire: bytes per value for each outer precision, and the
quantise/dequantise pass the narrower formats cost each island's GPUs.

**Wire bytes.** fp32 and bf16 are plain casts (4 and 2 bytes per value). fp8, int8 and fp4
are quantised as torchft's quantised all_reduce does it (``torchft/quantization.py``,
torchft 0.2.0: each row of a 2-D tensor is one FP32 scale followed by its 8-bit values,
padded to 4-byte alignment): ``bits / 8`` bytes per value plus one 4-byte scale per row.
A row is taken as ``hidden_size`` values (the input width of the attention and gated-MLP
projections and the embedding's rows). fp4 uses the same layout with 4-bit values — torchft
has no 4-bit kernel; Streaming DiLoCo (arXiv:2501.18512) sends FP4 E3M0.

**Quantisation pass.** The pseudo-gradient is FP32 (the master parameters' dtype). Before the
all_reduce each rank converts its shard and after it converts the result back, memory-bound
work at the GPU's streaming bandwidth (``hbm_bandwidth_bytes_per_s × memory_efficiency``):

* a cast (bf16): read 4 + write 2 bytes, then read 2 + write 4 — 12 bytes per value;
* quantised (fp8, int8, fp4; q = bits / 8): quantise (read 4, write q), reduce the shard it
  owns (read the M peers' chunks, q per value of the whole tensor, and write its q),
  dequantise (read q, write 4) — 8 + 3q bytes per value, the shape of torchft's
  ``allreduce_quantized`` (quantise → all-to-all → reduce → all-gather → dequantise);
* fp32: nothing.

`shardmeter.cost.model.CostModel.outer_step_seconds` adds this to each fragment's outer
step, on the island's compute stream.
"""

from __future__ import annotations

from shardmeter.spec.precision import Precision

PSEUDO_GRADIENT_BYTES = 4
"""The pseudo-gradient's own dtype: FP32, as the master parameters (torchft sends this
unless it quantises)."""
SCALE_BYTES = 4
"""One FP32 scale per row (torchft ``SCALE_DTYPE_BYTES``)."""


def wire_bytes_per_value(precision: Precision, row_values: int) -> float:
    """Bytes one pseudo-gradient value takes on the wire, its row's scale shared out."""
    value = precision.bits / 8
    if precision.quantised:
        return value + SCALE_BYTES / max(row_values, 1)
    return value


def conversion_bytes_per_value(precision: Precision) -> float:
    """HBM bytes the conversion to and from ``precision`` moves per value (see the module
    docstring)."""
    if precision is Precision.FP32:
        return 0.0
    q = precision.bits / 8
    if precision.quantised:
        return 2 * PSEUDO_GRADIENT_BYTES + 3 * q
    return 2 * (PSEUDO_GRADIENT_BYTES + q)


def conversion_seconds(
    precision: Precision, values: float, hbm_bandwidth_bytes_per_s: float, memory_efficiency: float
) -> float:
    """Seconds one rank spends converting ``values`` pseudo-gradient values to the wire
    format and back."""
    return (
        values
        * conversion_bytes_per_value(precision)
        / (hbm_bandwidth_bytes_per_s * memory_efficiency)
    )
