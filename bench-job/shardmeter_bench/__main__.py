"""``python -m shardmeter_bench``: the benchmark Job's entry point (see `cli`)."""

from __future__ import annotations

import os
import sys

from shardmeter_bench.cli import main

if __name__ == "__main__":
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
    code = main(exits_after=launched)
    if "torch.distributed" in sys.modules and launched:
        # A torchrun rank: its process group is gone; skip finalisation (see exit_now).
        from shardmeter_bench.collectives.distributed import exit_now

        exit_now(code)
    raise SystemExit(code)
