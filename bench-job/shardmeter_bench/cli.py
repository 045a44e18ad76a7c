"""``python -m shardmeter_bench {compute,comm,all,validate} [options]``.

Bad arguments exit 2 with one line on stderr. Runtime failures exit non-zero (see
`shardmeter_bench.errors` for the codes) with one line on stderr, a structlog event, and —
in a Kubernetes pod — the same line in ``/dev/termination-log`` so the pod status says why.
Results (the fit summary, where things were written, the validation table) go to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from pydantic import TypeAdapter, ValidationError

from shardmeter.errors import ShardMeterError, spec_error_from_validation
from shardmeter.spec.hardware import GPUSpec, LinkSpec
from shardmeter.spec.pool import GPURef, LinkRef
from shardmeter_bench import __version__, errors, logs
from shardmeter_bench.compute.catalog import MAX_CONFIGS
from shardmeter_bench.errors import BenchError, UsageError

PROG = "shardmeter-bench"
MAX_REPEATS = 1000
"""Most profiled iterations per shape."""
MAX_RANKS = 256
"""Most local ranks spawned without torchrun."""
MAX_THREADS = 1024
"""Most intra-op threads per rank."""
MAX_SEED = 2**32 - 1
"""Largest seed (numpy's limit)."""
MAX_TIMEOUT_S = 86_400.0
"""Longest rendezvous/collective timeout (a day)."""
MODES = ("compute", "comm", "all", "validate")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


EPILOG = """\
examples:
  python -m shardmeter_bench all --device cpu --scale small --configs 12 --out c.json
  python -m shardmeter_bench validate --device cpu --scale small --coefficients c.json
  torchrun --nproc-per-node 8 -m shardmeter_bench all --device cuda --gpu h200 \\
      --intra-node-link nvlink4 --pool cluster-a --publish configmap/shardmeter-coefficients-a

Exit status: 0 success, 1 other failure, 2 bad input (one line naming the flag), 3 device
unavailable, 4 out of memory, 5 distributed failure or timeout, 6 publishing failed,
130 interrupted; a failure prints one line (the JSON event when logs are JSON)."""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(errors.EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog=PROG,
        description="Profile a pool, fit ShardMeter coefficients, publish them, validate them.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    p.add_argument(
        "mode",
        choices=MODES,
        help="compute: profile block shapes; comm: time collectives; all: both, then fit; "
        "validate: all, then check predicted against measured FSDP steps",
    )
    g = p.add_argument_group("measurement")
    g.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="device to profile (default: cuda if available, else cpu)",
    )
    g.add_argument(
        "--scale",
        choices=("small", "full"),
        default="full",
        help="shape range: full = the paper's Table I, small = a quick CPU range (default: full)",
    )
    g.add_argument("--configs", type=int, help="catalog shapes (default 16 GPU, 24 CPU, 12 small)")
    g.add_argument(
        "--repeats",
        type=int,
        default=5,
        help=f"profiled iterations per shape (3–{MAX_REPEATS}; default 5)",
    )
    g.add_argument(
        "--seed", type=int, default=0, help=f"catalog and weights seed (0–{MAX_SEED}; default 0)"
    )
    g.add_argument(
        "--precision",
        choices=("bf16", "fp32"),
        help="compute precision (default bf16 on GPUs, fp32 on CPUs)",
    )
    g.add_argument(
        "--ranks",
        type=int,
        default=2,
        help="local ranks to spawn for collectives and FSDP when not under torchrun "
        f"(1–{MAX_RANKS}; default 2)",
    )
    g.add_argument(
        "--threads",
        type=int,
        help=f"intra-op threads per rank (0–{MAX_THREADS}; default 1 on CPU: far steadier; "
        "0 = torch's)",
    )
    g.add_argument(
        "--block",
        choices=("auto", "reference", "torchtitan"),
        default="auto",
        help="profiled block: torchtitan's Llama 3 block with the attention it runs "
        "(FlexAttention on CUDA), the reference block, or auto = torchtitan's on CUDA where "
        "it imports, else the reference (default: auto)",
    )
    g.add_argument(
        "--max-memory-gib",
        type=float,
        help="CPU: budget for this process's peak memory; catalog shapes, batches and "
        "validation models that would not fit are not run (default 5 for --scale full)",
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds to wait for distributed rendezvous and collectives "
        f"(> 0, ≤ {MAX_TIMEOUT_S:g}; default 600)",
    )
    h = p.add_argument_group("hardware description")
    h.add_argument(
        "--gpu",
        help="GPU preset name or a JSON GPU spec, as in a GPUPool (default: recognised "
        "from the device)",
    )
    h.add_argument(
        "--intra-node-link",
        help="link inside a node: preset name or JSON link spec (label and prior) "
        "(default: the GPU preset's, loopback on a CPU)",
    )
    h.add_argument(
        "--inter-node-link",
        help="link between nodes: preset name or JSON link spec (label and prior) "
        "(default: the GPU preset's)",
    )
    h.add_argument("--pool", help="pool name recorded in the document (default: none)")
    o = p.add_argument_group("output")
    o.add_argument(
        "--out",
        help="coefficients JSON to write (default ./shardmeter-coefficients.json unless --publish)",
    )
    o.add_argument(
        "--publish", help="configmap/NAME: patch that ConfigMap's data (default: no publishing)"
    )
    o.add_argument("--namespace", help="namespace of the ConfigMap (default: the pod's)")
    o.add_argument(
        "--report-dir",
        default="shardmeter-validation",
        help="validate: folder for validation.json and validation.md "
        "(default: shardmeter-validation)",
    )
    o.add_argument(
        "--coefficients",
        help="validate: use this file instead of measuring and fitting (default: measure)",
    )
    o.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="log lines on stderr (default: auto = console on a terminal, JSON otherwise)",
    )
    o.add_argument(
        "--verbose", action="store_true", help="debug logs; tracebacks on bugs (default: off)"
    )
    return p


def _check(args: argparse.Namespace) -> None:
    """Our own argument checks (argparse cannot express them); `UsageError` on failure.
    Also turns --gpu and the link options into specs (preset name or inline JSON)."""
    if args.configs is not None and not 1 <= args.configs <= MAX_CONFIGS:
        raise UsageError(f"--configs: must be between 1 and {MAX_CONFIGS} (got {args.configs})")
    if not 3 <= args.repeats <= MAX_REPEATS:
        raise UsageError(
            f"--repeats: must be between 3 (for a median) and {MAX_REPEATS} (got {args.repeats})"
        )
    if not 1 <= args.ranks <= MAX_RANKS:
        raise UsageError(f"--ranks: must be between 1 and {MAX_RANKS} (got {args.ranks})")
    if args.threads is not None and not 0 <= args.threads <= MAX_THREADS:
        raise UsageError(f"--threads: must be between 0 and {MAX_THREADS} (got {args.threads})")
    if not 0 <= args.seed <= MAX_SEED:
        raise UsageError(f"--seed: must be between 0 and {MAX_SEED} (got {args.seed})")
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= MAX_TIMEOUT_S):
        raise UsageError(
            f"--timeout: must be a finite number of seconds > 0 and ≤ {MAX_TIMEOUT_S:g} "
            f"(got {args.timeout})"
        )
    if args.max_memory_gib is not None:
        if not (math.isfinite(args.max_memory_gib) and args.max_memory_gib >= 1):
            raise UsageError(f"--max-memory-gib: must be ≥ 1 (got {args.max_memory_gib})")
        if args.device == "cuda":
            raise UsageError(
                "--max-memory-gib: bounds a CPU run; on a GPU the batch sweep stops at "
                "out-of-memory"
            )
    if args.gpu is not None:
        if args.device == "cpu":
            raise UsageError("--gpu: describes a GPU; it cannot describe --device cpu")
        args.gpu = _hardware("--gpu", args.gpu, TypeAdapter(GPURef))
    for flag in ("intra_node_link", "inter_node_link"):
        value = getattr(args, flag)
        if value is not None:
            option = "--" + flag.replace("_", "-")
            setattr(args, flag, _hardware(option, value, TypeAdapter(LinkRef)))
    for flag in ("pool", "namespace"):
        value = getattr(args, flag)
        if value is not None and not (len(value) <= 63 and _DNS_LABEL.fullmatch(value)):
            raise UsageError(f"--{flag}: {value!r} is not a DNS-1123 label")
    if args.publish is not None:
        from shardmeter_bench.publish import parse_target

        parse_target(args.publish)
    if args.coefficients is not None:
        if args.mode != "validate":
            raise UsageError("--coefficients: only validate reads a coefficients file")
        if not os.path.isfile(args.coefficients):
            raise UsageError(f"--coefficients: no such file {args.coefficients!r}")
        if args.publish is not None:
            raise UsageError("--publish: nothing is fitted when --coefficients is given")


def _hardware(option: str, text: str, adapter: TypeAdapter[GPUSpec] | TypeAdapter[LinkSpec]) -> Any:
    """A preset name (``h100-80gb-sxm``) or a JSON spec (``{"preset": "nvlink4", ...}`` or
    every field) — what the operator passes from a GPUPool's spec."""
    value: Any = text
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{option}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        spec = GPUSpec if option == "--gpu" else LinkSpec
        raise UsageError(str(spec_error_from_validation(exc, source=option, model=spec))) from exc


def _resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def _termination_log(message: str) -> None:
    path = os.environ.get("SHARDMETER_TERMINATION_LOG", "/dev/termination-log")
    if path and os.path.exists(path):
        try:
            with open(path, "w") as f:
                f.write(message[:4000])
        except OSError:
            pass


def _looks_like_oom(exc: BaseException) -> bool:
    """torch's OOM (CUDA or CPU allocator) without importing torch here."""
    text = str(exc)
    return type(exc).__name__ == "OutOfMemoryError" or (
        isinstance(exc, RuntimeError)
        and ("can't allocate memory" in text or "out of memory" in text.lower())
    )


_json_logs = {"on": False}
"""Whether this run's logs are JSON lines (set by `main` once the format is known)."""


def fail(exc: BenchError, verbose: bool = False) -> int:
    """Report a failure as one line on stderr (and in the pod's termination log): the
    structlog event itself when logs are JSON (``event``, ``error``, ``exit_code`` for log
    pipelines), the plain line otherwise — never both."""
    line = f"{PROG}: error: {' '.join(exc.message.split())}"
    if _json_logs["on"]:
        logs.get_logger().error(exc.event, error=line, exit_code=exc.code)
    else:
        sys.stderr.write(line + "\n")
    _termination_log(line)
    return exc.code


def main(argv: Sequence[str] | None = None, exits_after: bool = False) -> int:
    """Run the bench; ``exits_after``: the caller ends the process right after (``__main__``
    under a launcher), so the process group is left to the process's end."""
    raw = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(raw)
    try:
        _check(args)
    except UsageError as exc:
        sys.stderr.write(f"{PROG}: error: {exc.message}\n")
        return errors.EXIT_USAGE
    json_logs = {"json": True, "console": False}.get(args.log_format)
    _json_logs["on"] = json_logs if json_logs is not None else not sys.stderr.isatty()
    logs.configure(rank=int(os.environ.get("RANK", "0") or 0), json=json_logs, verbose=args.verbose)
    try:
        import torch

        from shardmeter_bench import pipeline, runconfig
        from shardmeter_bench.collectives.distributed import DistContext
        from shardmeter_bench.device import check_device

        device_type = _resolve_device(args.device)
        threads = args.threads if args.threads is not None else (1 if device_type == "cpu" else 0)
        if threads:
            torch.set_num_threads(threads)
        ctx = DistContext.from_env()
        check_device(device_type)
        cfg = runconfig.RunConfig(
            mode=args.mode,
            device_type=device_type,
            scale=args.scale,
            configs=args.configs,
            repeats=args.repeats,
            seed=args.seed,
            out=args.out,
            publish=args.publish,
            namespace=args.namespace,
            pool=args.pool,
            gpu=args.gpu,
            intra_node_link=args.intra_node_link,
            inter_node_link=args.inter_node_link,
            report_dir=args.report_dir,
            ranks=args.ranks,
            threads=threads or None,
            timeout_s=args.timeout,
            precision=args.precision,
            coefficients=args.coefficients,
            max_memory_gib=args.max_memory_gib,
            block=args.block,
            exits_after=exits_after,
            argv=tuple(raw),
        )
        result = pipeline.run(cfg, ctx)
    except BenchError as exc:
        return fail(exc, args.verbose)
    except ShardMeterError as exc:
        return fail(BenchError(str(exc)), args.verbose)
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return errors.EXIT_INTERRUPTED
    except Exception as exc:
        if _looks_like_oom(exc):
            message = f"out of memory outside the batch sweep: {errors.first_line(exc)}"
            return fail(errors.OutOfMemoryError(message))
        if args.verbose:
            traceback.print_exc()
        message = f"internal error: {type(exc).__name__}: {errors.first_line(exc)}"
        return fail(BenchError(message), args.verbose)
    if ctx.is_main:
        _print_result(result)
    return errors.EXIT_OK


def _print_result(result: object) -> None:
    from shardmeter_bench.fit import render_summary
    from shardmeter_bench.runconfig import RunResult
    from shardmeter_bench.validation.report import render_markdown

    assert isinstance(result, RunResult)
    if result.summary:
        print(render_summary(result.summary))
    for name, where in result.outputs.items():
        print(f"{name}: {where}")
    if result.report is not None:
        print()
        print(render_markdown(result.report))
