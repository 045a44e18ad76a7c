"""Process groups: under ``torchrun`` (single node, or multi-node from an Indexed Job) the
ranks come from its environment; as a plain process the Job spawns its own local ranks
(``--ranks``, Gloo on CPU, NCCL with one GPU each) for the phases that need several.

torchrun exports ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK`` (the node) and ``GROUP_WORLD_SIZE``; ``NODE_RANK``, ``NNODES`` and
``NPROC_PER_NODE`` (what an Indexed Job passes to torchrun) are read as fallbacks.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from shardmeter_bench import errors
from shardmeter_bench.errors import BenchError, DistributedError, first_line

_CONTROL: dict[str, Any] = {"group": None}


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    nnodes: int = 1
    launched: bool = False
    """True under torchrun (or any launcher that set RANK/WORLD_SIZE)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> DistContext:
        env = dict(os.environ if env is None else env)
        if "RANK" not in env or "WORLD_SIZE" not in env:
            return cls()

        def num(*names: str, default: int) -> int:
            for n in names:
                if env.get(n, "").strip():
                    try:
                        return int(env[n])
                    except ValueError as exc:
                        raise DistributedError(f"{n}={env[n]!r} is not an integer") from exc
            return default

        rank, world = num("RANK", default=0), num("WORLD_SIZE", default=1)
        local_world = num("LOCAL_WORLD_SIZE", "NPROC_PER_NODE", default=world)
        nnodes = num("GROUP_WORLD_SIZE", "NNODES", default=max(1, world // max(local_world, 1)))
        ctx = cls(
            rank=rank,
            world_size=world,
            local_rank=num("LOCAL_RANK", default=rank % max(local_world, 1)),
            local_world_size=local_world,
            node_rank=num("GROUP_RANK", "NODE_RANK", default=rank // max(local_world, 1)),
            nnodes=nnodes,
            launched=True,
        )
        if not 0 <= rank < world or local_world * nnodes != world:
            raise DistributedError(
                f"inconsistent launch environment: RANK={rank} WORLD_SIZE={world} "
                f"LOCAL_WORLD_SIZE={local_world} nodes={nnodes} (expected nodes × local = world)"
            )
        return ctx


def _where() -> str:
    return (
        f"MASTER_ADDR={os.environ.get('MASTER_ADDR', '?')} "
        f"MASTER_PORT={os.environ.get('MASTER_PORT', '?')}"
    )


def init(ctx: DistContext, device_type: str, timeout_s: float) -> None:
    """Join the process group (Gloo on CPU; NCCL for CUDA tensors plus a Gloo group for
    control messages). A rendezvous that does not complete in ``timeout_s`` is an error."""
    if device_type == "cuda":
        torch.cuda.set_device(ctx.local_rank)
    backend = "gloo" if device_type == "cpu" else "cpu:gloo,cuda:nccl"
    try:
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        _CONTROL["group"] = None if device_type == "cpu" else dist.new_group(backend="gloo")
        barrier(device_type, ctx)
    except (dist.DistError, RuntimeError, ValueError, TimeoutError) as exc:
        raise DistributedError(
            f"torch.distributed ({backend}) did not initialise within {timeout_s:g} s "
            f"(rank {ctx.rank} of {ctx.world_size}, {_where()}): {first_line(exc)}"
        ) from exc


def shutdown(synchronise: bool = False, destroy: bool = True) -> None:
    """Leave the process group. ``synchronise``: every rank reaches this point first; a rank
    that tears Gloo down while a peer still has a collective in flight aborts the peer
    ("terminate called without an active exception"). ``destroy=False`` only synchronises:
    for a process about to end through `exit_now`, where tearing down Gloo's groups can abort
    it ("free(): double free detected in tcache 2", seen here in about one torchrun launch in
    three) after its work is done."""
    if dist.is_available() and dist.is_initialized():
        if synchronise:
            # A peer that already failed reports its own error; do not add a second one.
            with contextlib.suppress(dist.DistError, RuntimeError):
                dist.barrier(group=control_group())
        if not destroy:
            return
        dist.destroy_process_group()
    _CONTROL["group"] = None


def control_group() -> Any:
    return _CONTROL["group"]


def barrier(device_type: str, ctx: DistContext, group: Any = None) -> None:
    if device_type == "cuda" and group is None:
        dist.barrier(device_ids=[ctx.local_rank])
    else:
        dist.barrier(group=group)


def gather_to_main(obj: Any, ctx: DistContext) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (None elsewhere); a list of one without a group."""
    if not dist.is_initialized() or ctx.world_size == 1:
        return [obj]
    out: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, out, dst=0, group=control_group())
    return out


def broadcast_from_main(obj: Any, ctx: DistContext) -> Any:
    if not dist.is_initialized() or ctx.world_size == 1:
        return obj
    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0, group=control_group())
    return box[0]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Phase = Callable[[DistContext, Any], Any]


def _worker(
    index: int,
    nprocs: int,
    port: int,
    device_type: str,
    timeout_s: float,
    threads: int,
    fn: Phase,
    payload: Any,
    folder: str,
    log_json: bool | None,
) -> None:
    from shardmeter_bench import logs

    if device_type == "cpu":
        pin_to_core(index)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(index),
        WORLD_SIZE=str(nprocs),
        LOCAL_RANK=str(index),
        LOCAL_WORLD_SIZE=str(nprocs),
        GROUP_RANK="0",
        GROUP_WORLD_SIZE="1",
    )
    torch.set_num_threads(threads)
    logs.configure(rank=index, json=log_json)
    logs.set_progress(False)
    ctx = DistContext.from_env()
    try:
        init(ctx, device_type, timeout_s)
        result = fn(ctx, payload)
        if ctx.is_main:
            with open(Path(folder) / "result.pkl", "wb") as f:
                pickle.dump(result, f)
        shutdown(synchronise=True)
        exit_now(0)
    except BenchError as exc:
        _write_error(folder, index, exc.code, type(exc).__name__, exc.message)
        raise SystemExit(exc.code) from exc
    except torch.OutOfMemoryError as exc:
        msg = f"out of memory on rank {index}: {first_line(exc)}"
        _write_error(folder, index, errors.EXIT_OOM, "OutOfMemoryError", msg)
        raise SystemExit(errors.EXIT_OOM) from exc
    except dist.DistError as exc:
        msg = f"rank {index}: {type(exc).__name__}: {first_line(exc)}"
        _write_error(folder, index, errors.EXIT_DISTRIBUTED, "DistributedError", msg)
        raise SystemExit(errors.EXIT_DISTRIBUTED) from exc
    finally:
        shutdown()


def pin_to_core(index: int) -> None:
    """Spawned CPU rank ``index`` runs on core ``index mod cores`` (Linux). Unpinned, ranks
    and Gloo's I/O threads migrate between the cores, and a latency-bound collective's time
    swings 2× from one process to the next; a rank's own threads then share its core."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cores and os.environ.get("SHARDMETER_BENCH_PIN", "1") != "0":
        os.sched_setaffinity(0, {cores[index % len(cores)]})


def exit_now(code: int) -> NoReturn:
    """End a rank without interpreter finalisation, once its process group is destroyed and
    its result written. Finalisation can still free tensors held by Gloo's C++ work objects
    after the interpreter is gone, which aborts the rank ("terminate called without an active
    exception", seen here about one run in ten) and fails a run that had succeeded."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _write_error(folder: str, index: int, code: int, kind: str, message: str) -> None:
    path = Path(folder) / f"error-{index}.json"
    path.write_text(json.dumps({"code": code, "kind": kind, "message": message}))


_KINDS: dict[str, type[BenchError]] = {
    cls.__name__: cls
    for cls in (
        BenchError,
        errors.UsageError,
        errors.DeviceUnavailableError,
        errors.OutOfMemoryError,
        DistributedError,
        errors.PublishError,
    )
}


def spawn(
    fn: Phase,
    payload: Any,
    nprocs: int,
    device_type: str,
    timeout_s: float,
    threads: int = 1,
    log_json: bool | None = None,
) -> Any:
    """Run ``fn(ctx, payload)`` on ``nprocs`` fresh local ranks; rank 0's return value.
    A worker's `BenchError` is re-raised here as the same kind with its message."""
    import torch.multiprocessing as mp

    from shardmeter_bench.device import release_freed_memory

    # This process's heap may still hold free pages of a phase's peak; the new ranks need them.
    release_freed_memory()
    with tempfile.TemporaryDirectory(prefix="shardmeter-bench-") as folder:
        port = free_port()
        try:
            mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]  # unannotated
                _worker,
                args=(nprocs, port, device_type, timeout_s, threads, fn, payload, folder, log_json),
                nprocs=nprocs,
                start_method="spawn",
                join=True,
            )
        except Exception as exc:
            reports = sorted(Path(folder).glob("error-*.json"))
            if reports:
                info = json.loads(reports[0].read_text())
                raise _KINDS.get(info["kind"], BenchError)(info["message"]) from exc
            raise BenchError(f"a spawned rank failed: {first_line(exc)}") from exc
        with open(Path(folder) / "result.pkl", "rb") as f:
            return pickle.load(f)


def run_phase(
    fn: Phase,
    payload: Any,
    ctx: DistContext,
    nprocs: int,
    device_type: str,
    timeout_s: float,
    threads: int,
) -> Any:
    """Under a launcher every rank runs ``fn`` now (rank 0 gets the result, others None);
    as a plain process ``nprocs`` local ranks are spawned for it."""
    if ctx.launched:
        return fn(ctx, payload)
    return spawn(fn, payload, nprocs, device_type, timeout_s, threads)
