"""Parse trainer command lines with torchtitan's own ``ConfigManager`` (in its own process:
torchtitan's imports warn and reconfigure logging).

stdin: a JSON list of argument lists (what torchrun hands to ``-m torchtitan.train``).
stdout, last line: a JSON list with, per argument list, either ``{"exit": code, "output":
…}`` when torchtitan (tyro) rejected it, or the parsed values the tests compare with the plan.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import warnings
from typing import Any


def summary(config: Any) -> dict[str, Any]:
    ft, training, par = config.fault_tolerance, config.training, config.parallelism
    spec = config.model_spec
    return {
        "config": type(config).__qualname__,
        "model_spec": type(spec).__name__,
        "flavor": spec.flavor,
        "fragment_fn": getattr(getattr(spec, "fragment_fn", None), "__name__", None),
        "optimizer": type(config.optimizer).__qualname__,
        "checkpoint": type(config.checkpoint).__qualname__,
        "activation_checkpoint": type(config.activation_checkpoint).__qualname__,
        "fault_tolerance": {
            k: getattr(ft, k)
            for k in (
                "enable",
                "replica_id",
                "group_size",
                "min_replica_size",
                "process_group",
                "process_group_timeout_ms",
                "semi_sync_method",
                "sync_steps",
                "num_fragments",
                "fragment_sync_delay",
                "should_quantize",
            )
        },
        "training": {
            k: getattr(training, k)
            for k in (
                "local_batch_size",
                "global_batch_size",
                "seq_len",
                "steps",
                "dtype",
                "mixed_precision_param",
            )
        },
        "parallelism": {
            k: getattr(par, k)
            for k in ("data_parallel_shard_degree", "data_parallel_replicate_degree")
        },
        "compile": config.compile.enable,
        "hf_assets_path": config.hf_assets_path,
    }


def main() -> int:
    warnings.simplefilter("ignore")
    from torchtitan.config import ConfigManager

    out = []
    for argv in json.load(sys.stdin):
        captured = io.StringIO()
        try:
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                config = ConfigManager().parse_args(list(argv))
        except SystemExit as exc:
            out.append({"exit": exc.code, "output": captured.getvalue()[-2000:]})
            continue
        out.append(summary(config))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
