"""Have torchtitan print its metric lines for chosen values: ``MetricsProcessor.log`` (its own
f-strings, colours and rounding) through the root logger as ``init_logger`` formats it — in
its own process (torchtitan's imports warn and reconfigure logging).

stdin: a JSON list of cases ``{step, loss, grad_norm, tokens, seconds, flops_per_token,
quantized, color}``: ``tokens`` counted since the previous line over ``seconds``.
stdout: torchtitan's log lines, one per case (nothing else is printed).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from typing import Any


class _Memory:
    """torchtitan's DeviceMemoryMonitor interface with fixed figures (its own needs CUDA)."""

    def __init__(self) -> None:
        from torchtitan.components.metrics import DeviceMemStats

        self.stats = DeviceMemStats(1.5, 2.0, 12.25, 15.31, 0, 0)

    def get_peak_stats(self) -> Any:
        return self.stats

    def reset_peak_stats(self) -> None:
        pass


class _Dims:
    non_data_parallel_size = 1


def main() -> int:
    warnings.simplefilter("ignore")
    from torchtitan.components.metrics import BaseLogger, MetricsProcessor
    from torchtitan.tools import utils
    from torchtitan.tools.logging import init_logger

    init_logger()
    for case in json.load(sys.stdin):
        processor = MetricsProcessor.__new__(MetricsProcessor)  # __init__ probes a CUDA device
        processor.config = MetricsProcessor.Config(log_freq=10)
        processor.logger = BaseLogger()
        processor.parallel_dims = _Dims()  # type: ignore[assignment]
        processor.device_memory_monitor = _Memory()  # type: ignore[assignment]
        processor.color = utils.Color() if case["color"] else utils.NoColor()
        processor.gpu_peak_flops = 989e12
        processor.has_quantization = bool(case["quantized"])
        processor.num_flops_per_token = int(case["flops_per_token"])
        processor.ntokens_since_last_log = int(case["tokens"])
        processor.data_loading_times = [0.01]
        processor.time_last_log = time.perf_counter() - float(case["seconds"])
        processor.log(case["step"], case["loss"], case["loss"], case["grad_norm"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
