"""Human-readable numbers and plain-text tables for CLI output."""

from __future__ import annotations

from collections.abc import Sequence

from shardmeter.spec.base import format_seconds

seconds = format_seconds
"""0.0123 → '12.3 ms'; 36.41 → '36.4 s'; 5400 → '90.0 min' (`shardmeter.spec.base.format_seconds`)."""


def gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def si(value: float, unit: str = "") -> str:
    """1.2e12 → '1.20 T' + unit."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}".rstrip()


def usd(value: float) -> str:
    return f"${value:,.0f}" if value >= 100 else f"${value:,.2f}"


def energy(kwh: float) -> str:
    """812 → '812 kWh'; 12_345 → '12.3 MWh'; 4.5e6 → '4.50 GWh'."""
    if kwh >= 1e6:
        return f"{kwh / 1e6:.2f} GWh"
    if kwh >= 1e4:
        return f"{kwh / 1e3:,.1f} MWh"
    return f"{kwh:,.0f} kWh"


def mass(kg: float) -> str:
    """CO₂e: 85.3 → '85 kg'; 12_345 → '12.3 t'."""
    if kg >= 1e4:
        return f"{kg / 1e3:,.1f} t"
    return f"{kg:,.0f} kg"


def percent(value: float) -> str:
    return f"{100 * value:.1f} %"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None
) -> str:
    """A plain table; ``align`` is one character per column, 'l' or 'r' (default: first left,
    rest right)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)

    def fmt(row: list[str]) -> str:
        parts = [
            c.ljust(w) if a == "l" else c.rjust(w)
            for c, w, a in zip(row, widths, align, strict=True)
        ]
        return "  ".join(parts).rstrip()

    lines = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def mfu(value: float, peak: dict[str, float | str]) -> str:
    """MFU with the peak it is quoted against: '64.8 % of the dense bf16 peak (989 TFLOP/s)';
    for fp8 training the share of the dense fp8 peak beside it."""
    basis = str(peak["basis"])
    base = float(peak[basis])
    text = f"{percent(value)} of the dense {basis} peak ({si(base, 'FLOP/s')})"
    if "fp8" in peak:
        fp8 = float(peak["fp8"])
        text += f", {percent(value * base / fp8)} of the fp8 peak ({si(fp8, 'FLOP/s')})"
    return text
