"""The base class of every spec and the unit-string parsers the YAML files may use."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Annotated, Any, cast

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, GetCoreSchemaHandler
from pydantic.alias_generators import to_camel
from pydantic_core import CoreSchema, core_schema

from shardmeter.errors import SPEC_ROOTS


class SpecModel(BaseModel):
    """Frozen and strict base of every spec (plan files, CLI flags, GPUPool and TrainingPlan
    custom resources — the operator validates with the same models):

    * unknown keys are errors; both ``snake_case`` (Python) and ``camelCase`` (Kubernetes
      custom resources, plan files) names are accepted, and serialisation uses camelCase so
      documents round-trip into custom resources;
    * **strict types**: a number field takes numbers only — ``true`` is not 1, ``"10"`` is
      not 10, ``4.7`` is not an integer (nothing is truncated); a string field takes strings;
    * **finite numbers**: ``.inf`` and ``.nan`` are rejected everywhere;
    * enum fields (`SpecEnum`) still take their names as strings."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
        strict=True,
        allow_inf_nan=False,
    )


SPEC_ROOTS.append(SpecModel)  # its subclasses' errors name fields as the user wrote them


class SpecEnum(StrEnum):
    """Base of the specs' enums: validated from their string values even though `SpecModel`
    is strict (pydantic's strict mode would otherwise demand enum instances from Python
    input, i.e. from every YAML file)."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        schema = handler(source)
        if schema["type"] == "enum":
            cast(core_schema.EnumSchema, schema)["strict"] = False
        return schema


_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"

_BANDWIDTH_UNITS = {
    "b/s": 1 / 8,
    "bit/s": 1 / 8,
    "bps": 1 / 8,
    "kbit/s": 1e3 / 8,
    "kbps": 1e3 / 8,
    "mbit/s": 1e6 / 8,
    "mbps": 1e6 / 8,
    "gbit/s": 1e9 / 8,
    "gbps": 1e9 / 8,
    "tbit/s": 1e12 / 8,
    "tbps": 1e12 / 8,
    "b/s_bytes": 1.0,
    "kb/s": 1e3,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "tb/s": 1e12,
    "kib/s": 2**10,
    "mib/s": 2**20,
    "gib/s": 2**30,
    "tib/s": 2**40,
}
_BANDWIDTH_SHOWN = (
    "bit/s, kbit/s, Mbit/s, Gbit/s, Tbit/s (also Gb/s, Gbps), B/s, kB/s, MB/s, GB/s, TB/s, "
    "KiB/s, MiB/s, GiB/s, TiB/s (b: bits, B: bytes)"
)
"""The bandwidth units as a user writes them (``_BANDWIDTH_UNITS`` keys are normalised)."""
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}
_TIME_SHOWN = "s, ms, us (or µs), ns, min, h"
_BYTES_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BYTES_SHOWN = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB"


def _parse(
    value: Any,
    units: Mapping[str, float],
    what: str,
    shown: str,
    case_sensitive_bits: bool = False,
    integral: bool = False,
) -> Any:
    """A number with an optional unit → the number in base units (an ``int`` when
    ``integral`` and whole: byte counts); anything but a string passes through. ``shown``
    lists the units as a user writes them, for the error on an unknown one."""
    if not isinstance(value, str):
        return value
    text = value.strip().replace(" ", "")
    match = re.fullmatch(_NUMBER + r"([A-Za-zµ/]*)", text)
    if not match:
        raise ValueError(f"cannot read {value!r} as {what}")
    number, unit = float(match.group(1)), match.group(2)
    if not unit:
        return int(number) if integral and number.is_integer() else number
    key = unit.lower()
    if case_sensitive_bits:
        # "Gb/s" means gigabits, "GB/s" gigabytes: the case of the b decides.
        if re.fullmatch(r"[kmgtKMGT]?i?b/s", unit) and unit.endswith("b/s"):
            key = unit[:-3].lower() + "bit/s"
        elif unit == "B/s":
            key = "b/s_bytes"
    if key not in units:
        raise ValueError(f"unknown unit {unit!r} in {value!r} for {what}; use one of: {shown}")
    scaled = number * units[key]
    return (
        round(scaled) if integral and abs(scaled - round(scaled)) <= 1e-6 * abs(scaled) else scaled
    )


def parse_bandwidth(value: Any) -> Any:
    """``"10 Gbit/s"``, ``"10Gbps"``, ``"25 GB/s"`` → bytes per second; numbers pass through."""
    return _parse(
        value, _BANDWIDTH_UNITS, "a bandwidth", _BANDWIDTH_SHOWN, case_sensitive_bits=True
    )


def parse_seconds(value: Any) -> Any:
    """``"30 ms"``, ``"5us"`` → seconds; numbers pass through."""
    return _parse(value, _TIME_UNITS, "a duration", _TIME_SHOWN)


def parse_bytes(value: Any) -> Any:
    """``"80 GiB"``, ``"141GB"`` → bytes; numbers pass through."""
    return _parse(value, _BYTES_UNITS, "a size in bytes", _BYTES_SHOWN, integral=True)


def _within(low: float, high: float, shown: str) -> Callable[[float], float]:
    """An after-validator: a finite value in [low, high], else an error naming the range in
    the unit the user reads (``shown`` formats a base-unit value)."""

    def check(value: float) -> float:
        if math.isnan(value) or math.isinf(value):
            raise ValueError("must be a finite number")
        if not low <= value <= high:
            raise ValueError(
                f"must be between {_show(low, shown)} and {_show(high, shown)} "
                f"(got {_show(value, shown)})"
            )
        return value

    return check


def format_seconds(value: float) -> str:
    """A duration in the unit a reader takes in at a glance, three significant figures:
    0.0000523 → '52.3 µs'; 0.33956 → '340 ms'; 3.3 → '3.30 s'; 36.41355 → '36.4 s';
    194 → '3.23 min'; 12_600 → '3.50 h'. Presentation and the simulator's evidence strings share it."""
    if value == 0:
        return "0"
    rounded = float(f"{value:.3g}")  # the unit follows the figure shown: 0.9996 → '1 s'
    for limit, factor, unit in (
        (1e-6, 1e9, "ns"),
        (1e-3, 1e6, "µs"),
        (1.0, 1e3, "ms"),
        (120.0, 1.0, "s"),
        (7200.0, 1 / 60, "min"),
    ):
        if abs(rounded) < limit:
            return f"{_three_figures(value * factor)} {unit}"
    return f"{_three_figures(value / 3600)} h"


def _three_figures(x: float) -> str:
    """3.3 → '3.30', 339.56 → '340', 1234.5 → '1235' (no exponent)."""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:#.3g}".rstrip(".")


def _show(value: float, unit: str) -> str:
    if unit == "B/s":
        for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if value >= factor:
                return f"{value / factor:g} {prefix}B/s"
        return f"{value:g} B/s"
    if unit == "B":
        for factor, prefix in ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB")):
            if value >= factor:
                return f"{value / factor:g} {prefix}"
        return f"{value:g} B"
    return f"{value:g} {unit}"


MIN_BANDWIDTH_BYTES_PER_S = 1e3
"""Slowest link or memory a spec may describe (1 kB/s): slower would make a step last for
ever."""
MAX_BANDWIDTH_BYTES_PER_S = 1e15
"""Fastest (1 PB/s; NVLink 4 is 450 GB/s per direction, HBM3e 4.8 TB/s)."""
MAX_LATENCY_S = 3600.0
"""Longest one-hop latency a link may have (an hour; a WAN hop is ~0.01–0.1 s)."""
MAX_BYTES = 2**50
"""Largest memory a GPU may have (1 PiB; an H200 has 141 GB)."""

BytesPerSecond = Annotated[
    float,
    BeforeValidator(parse_bandwidth),
    AfterValidator(_within(MIN_BANDWIDTH_BYTES_PER_S, MAX_BANDWIDTH_BYTES_PER_S, "B/s")),
]
"""A bandwidth in bytes per second, between 1 kB/s and 1 PB/s; ``"400 Gbit/s"`` is read."""
Seconds = Annotated[
    float, BeforeValidator(parse_seconds), AfterValidator(_within(0.0, MAX_LATENCY_S, "s"))
]
"""A latency in seconds, between 0 and an hour; ``"30 ms"`` is read."""
Bytes = Annotated[int, BeforeValidator(parse_bytes), AfterValidator(_within(1, MAX_BYTES, "B"))]
"""A size in bytes, between 1 B and 1 PiB; ``"80 GiB"`` is read."""
