"""Local stand-ins for what a launched plan runs: its pods as processes (``kubelet``),
torchtitan's trainer on a CPU (``cpu_trainer``), and torchtitan's own argument parser in a
separate process (``parse_args``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TRITON_SITE = Path(sys.prefix) / "triton-site"
"""Where the Makefile installs triton (torchtitan's models import it; torch's CPU wheel lacks
it): outside site-packages, because torch.profiler imports triton whenever it can and that
skews the benchmark Job's CPU timings."""


def torchtitan_pythonpath() -> str:
    """PYTHONPATH for a process that imports torchtitan: this test tree, then triton."""
    if not (TRITON_SITE / "triton").is_dir():
        raise RuntimeError(f"no triton in {TRITON_SITE}: run `make .venv/.full` (the Makefile)")
    return os.pathsep.join([str(TESTS), str(TRITON_SITE)])
