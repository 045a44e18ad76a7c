"""ShardMeter's benchmark Job: profile a pool, fit coefficients, publish them, and report
accuracy on models the fit never saw (paper §III-A, §IV-A/B; design notes §4).

Entry point: ``python -m shardmeter_bench {compute,comm,all,validate}`` (see ``cli.py`` and
this package's README). The package measures with torch and fits through ``shardmeter``'s
fitting API; it never carries its own copy of the regression code.

Layout: ``compute`` (how a forward/backward time is measured), ``collectives`` (how
collectives are benchmarked), ``validation`` (how a fit is checked on shapes it never saw);
at the top the command line (``cli``), the run (``pipeline``, ``pipeline_validate``,
``runconfig``), the fit (``fit``), publishing (``publish``) and the shared pieces
(``device``, ``isolation``, ``errors``, ``logs``).
"""

from __future__ import annotations

import os

# Kineto writes two "USDT: ... profiler_start/stop" lines to stderr per profiler session at
# log levels below 6 (USDT is level 5); it reads the variable when torch loads, so this must
# run before torch is imported.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

__version__ = "0.1.0"
