"""Short stable hashes that objects publish for others to follow: a GPUPool's
``coefficientsRevision`` (:mod:`~.gpupool.correction`), a launch decision's revision
(:mod:`~.launch.rules`) and a launch's spec digest (:mod:`~.observe.read`). One function, imported by
both kinds' reconcilers, so neither depends on the other's planning code."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def revision(*parts: Any) -> str:
    """A short stable hash of JSON-able parts (pool spec + coefficients, a launch decision)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
