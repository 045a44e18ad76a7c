"""``python -m shardmeter_bench``: the benchmark Job's entry point (see `cli`)."""

from __future__ import annotations

from shardmeter_bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
