"""What to say about a GPU name that is no preset: a typo gets the nearest preset name; a
variant of a preset (its memory size or form factor in the name: ``a100-40gb``,
``h100-pcie``) gets the way to describe it, the preset with the fields that differ; another
GPU (``b200``, ``a10``) gets how to describe a GPU from its datasheet — never a different
GPU's preset as if it were the same."""

from __future__ import annotations

import difflib
import re

from shardmeter.spec.hardware import GPU_LOOKUP

_MEMORY_PART = re.compile(r"(\d+)gi?b?")
"""A name part that gives a memory size: ``40gb``, ``96g``, ``141gib``."""

TYPO_CUTOFF = 0.85
"""How alike (difflib's ratio) a name and a preset name of the same GPU must be to read as a
typo of it (``h200-141gb-sxn`` → ``h200-141gb-sxm``: 0.93; ``h100-pcie`` → ``h100-sxm``: 0.59)."""

DATASHEET_FIELDS = (
    "name, memoryBytes, peakBf16FlopPerS, peakFp32FlopPerS, hbmBandwidthBytesPerS, tdpWatts"
)
"""The GPU spec's required fields (`shardmeter.spec.hardware.GPUSpec`)."""


def _family(name: str) -> str:
    """The GPU a name stands for, its first part: ``a100`` of ``a100-80gb-sxm``."""
    return name.split("-", 1)[0]


def _memory_gb(name: str) -> int | None:
    for part in name.split("-")[1:]:
        if m := _MEMORY_PART.fullmatch(part):
            return int(m.group(1))
    return None


def explain_unknown_gpu(key: str) -> str:
    """The text after ``unknown GPU preset 'NAME'`` for a normalised name ``key`` that is no
    preset (`shardmeter.spec.presets.lookup` appends the preset list)."""
    family = _family(key)
    same = sorted(n for n in GPU_LOOKUP if _family(n) == family)
    if not same:
        return (
            ": no preset for this GPU; describe it with its datasheet figures, inline or in a "
            f"file ({DATASHEET_FIELDS}: GPUSpec in docs/reference/plan-file.md)"
        )
    typo = difflib.get_close_matches(key, same, n=1, cutoff=TYPO_CUTOFF)
    memory = _memory_gb(key)
    preset_memories = {m for n in same if (m := _memory_gb(n)) is not None}
    short = family if family in GPU_LOOKUP else same[0]
    base = GPU_LOOKUP[short].name
    if memory is not None and memory not in preset_memories:
        return (
            f": no {memory} GB variant of the {short} preset ({base}); describe the variant as "
            f"that preset with its own figures, e.g. {{preset: {short}, memoryBytes: {memory} GB}} "
            "(override every figure that differs, e.g. hbmBandwidthBytesPerS; every field: "
            "GPUSpec in docs/reference/plan-file.md)"
        )
    if typo:
        return f" (did you mean {typo[0]!r}?)"
    return (
        f": not a preset; if it is a variant of the {short} preset ({base}), describe it as "
        f"that preset with the figures that differ: {{preset: {short}, tdpWatts: W, "
        "hbmBandwidthBytesPerS: B, …} (every field: GPUSpec in docs/reference/plan-file.md)"
    )
