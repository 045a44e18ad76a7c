"""The base class of every spec and the unit-string parsers the YAML files may use."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict
from pydantic.alias_generators import to_camel


class SpecModel(BaseModel):
    """Frozen, strict-about-extras base: unknown keys are errors, and both ``snake_case``
    (Python) and ``camelCase`` (Kubernetes custom resources, plan files) names are accepted.
    Serialisation uses camelCase so documents round-trip into custom resources."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
    )


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
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}
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


def _parse(
    value: Any, units: Mapping[str, float], what: str, case_sensitive_bits: bool = False
) -> Any:
    if not isinstance(value, str):
        return value
    text = value.strip().replace(" ", "")
    match = re.fullmatch(_NUMBER + r"([A-Za-zµ/]*)", text)
    if not match:
        raise ValueError(f"cannot read {value!r} as {what}")
    number, unit = float(match.group(1)), match.group(2)
    if not unit:
        return number
    key = unit.lower()
    if case_sensitive_bits:
        # "Gb/s" means gigabits, "GB/s" gigabytes: the case of the b decides.
        if re.fullmatch(r"[kmgtKMGT]?i?b/s", unit) and unit.endswith("b/s"):
            key = unit[:-3].lower() + "bit/s"
        elif unit == "B/s":
            key = "b/s_bytes"
    if key not in units:
        raise ValueError(
            f"unknown unit {unit!r} in {value!r} for {what}; use one of {sorted(units)}"
        )
    return number * units[key]


def parse_bandwidth(value: Any) -> Any:
    """``"10 Gbit/s"``, ``"10Gbps"``, ``"25 GB/s"`` → bytes per second; numbers pass through."""
    return _parse(value, _BANDWIDTH_UNITS, "a bandwidth", case_sensitive_bits=True)


def parse_seconds(value: Any) -> Any:
    """``"30 ms"``, ``"5us"`` → seconds; numbers pass through."""
    return _parse(value, _TIME_UNITS, "a duration")


def parse_bytes(value: Any) -> Any:
    """``"80 GiB"``, ``"141GB"`` → bytes; numbers pass through."""
    return _parse(value, _BYTES_UNITS, "a size in bytes")


def _positive(value: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise ValueError("must be a finite number")
    if not value > 0:
        raise ValueError("must be greater than 0")
    return value


def _non_negative(value: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise ValueError("must be a finite number")
    if not value >= 0:
        raise ValueError("must be 0 or greater")
    return value


BytesPerSecond = Annotated[float, BeforeValidator(parse_bandwidth), AfterValidator(_positive)]
Seconds = Annotated[float, BeforeValidator(parse_seconds), AfterValidator(_non_negative)]
Bytes = Annotated[int, BeforeValidator(parse_bytes), AfterValidator(_positive)]
