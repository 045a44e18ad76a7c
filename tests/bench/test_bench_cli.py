"""``python -m shardmeter_bench``: bad arguments exit 2 with one line; runtime failures exit
with their own status, one line and a structlog event."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardmeter_bench.cli import main
from shardmeter_bench.collectives.distributed import free_port
from shardmeter_bench.errors import EXIT_DEVICE, EXIT_DISTRIBUTED, EXIT_FAILURE, EXIT_USAGE


@pytest.fixture(autouse=True)
def keep_torch_threads() -> Iterator[None]:
    """``main`` sets torch's thread count for its process; give the test process its own back."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _bench(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "shardmeter_bench", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compute", "--configs", "0"], "--configs: must be between 1 and 1000 (got 0)"),
        (["all", "--repeats", "1"], "--repeats: must be between 3 (for a median) and 1000"),
        (["all", "--repeats", "1000000000"], "--repeats: must be between 3"),
        (["all", "--timeout", "nan"], "--timeout: must be a finite number of seconds > 0"),
        (["all", "--timeout", "inf"], "--timeout: must be a finite number of seconds > 0"),
        (["all", "--timeout", "0"], "--timeout: must be a finite number of seconds > 0"),
        (["all", "--seed", "-1"], "--seed: must be between 0 and 4294967295 (got -1)"),
        (["all", "--ranks", "100000"], "--ranks: must be between 1 and 256"),
        (["all", "--threads", "100000"], "--threads: must be between 0 and 1024"),
        (["all", "--pool", "pool-a\n"], "is not a DNS-1123 label"),
        (["all", "--gpu", "b200"], "--gpu: unknown GPU preset 'b200'"),
        (["all", "--device", "cpu", "--gpu", "h100"], "cannot describe --device cpu"),
        (["all", "--intra-node-link", "warp"], "--intra-node-link: unknown link preset 'warp'"),
        (["all", "--publish", "secret/x"], "--publish: expected configmap/NAME, got 'secret/x'"),
        (["all", "--publish", "configmap/Bad_Name"], "not a valid ConfigMap name"),
        (["all", "--pool", "Pool A"], "--pool: 'Pool A' is not a DNS-1123 label"),
        (["compute", "--coefficients", "c.json"], "only validate reads a coefficients file"),
        (["validate", "--coefficients", "/nonexistent.json"], "no such file"),
        (["compute", "--max-memory-gib", "0.5"], "--max-memory-gib: must be ≥ 1 (got 0.5)"),
        (["compute", "--max-memory-gib", "nan"], "--max-memory-gib: must be ≥ 1 (got nan)"),
        (["all", "--device", "cuda", "--max-memory-gib", "8"], "--max-memory-gib: bounds a CPU"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize(
    ("args", "message"),
    [(["measure"], "invalid choice: 'measure'"), (["all", "--configs", "x"], "invalid int value")],
)
def test_argparse_errors_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.slow
def test_missing_gpu_exits_3_with_one_line_an_event_or_text() -> None:
    """One line either way: the structlog event when logs are JSON, the plain line on a
    console; the pod's termination log gets the plain line."""
    result = _bench("all", "--device", "cuda", "--log-format", "json")
    assert result.returncode == EXIT_DEVICE
    (line,) = result.stderr.strip().splitlines()
    event = json.loads(line)
    assert event["event"] == "device_unavailable" and event["exit_code"] == 3
    assert event["error"].startswith("shardmeter-bench: error: --device cuda was asked but no CUDA")
    assert result.stdout == ""
    result = _bench("all", "--device", "cuda", "--log-format", "console")
    assert result.returncode == EXIT_DEVICE
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("shardmeter-bench: error: --device cuda was asked but no CUDA")


@pytest.mark.slow
def test_rendezvous_timeout_exits_5() -> None:
    """Rank 1 of 2 under a launcher whose rank 0 never comes: a clear timeout, not a hang."""
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    result = _bench("comm", "--device", "cpu", "--timeout", "3", "--log-format", "json", env=env)
    assert result.returncode == EXIT_DISTRIBUTED
    last = json.loads(result.stderr.strip().splitlines()[-1])["error"]
    assert "did not initialise within 3 s (rank 1 of 2" in last and "MASTER_PORT=" in last
    assert "Traceback" not in result.stderr


def test_comm_without_a_second_rank_is_a_runtime_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["comm", "--device", "cpu", "--ranks", "1", "--log-format", "json"]) == EXIT_FAILURE
    err = capsys.readouterr().err.strip().splitlines()
    event = json.loads(err[-1])
    assert event["event"] == "bench_failed" and event["error"] == (
        "shardmeter-bench: error: collective benchmarks need at least 2 ranks (found 1); "
        "run under torchrun or with --ranks 2 or more"
    )


def test_unreadable_coefficients_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "c.json"
    bad.write_text("{not json")
    args = ["validate", "--device", "cpu", "--coefficients", str(bad), "--log-format", "json"]
    assert main(args) == EXIT_FAILURE
    error = json.loads(capsys.readouterr().err.strip().splitlines()[-1])["error"]
    assert "not valid JSON" in error and str(bad) in error


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["all", "--gpu", '{"preset": "h100"'], "--gpu: not valid JSON"),
        (
            ["all", "--gpu", '{"preset": "h100", "memoryBytes": -1}'],
            "--gpu: memoryBytes: must be between 1 B and 1 PiB (got -1 B)",
        ),
        (["all", "--inter-node-link", '{"name": "x"}'], "--inter-node-link: kind: required"),
    ],
)
def test_bad_inline_specs_name_the_option_and_field(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_the_operators_bench_job_command_parses_to_the_pools_hardware() -> None:
    """The operator passes the GPUPool's GPU and links inline (JSON); the bench CLI must read
    them back as the same specs, custom fields included — not only preset names."""
    import yaml

    from shardmeter_bench.cli import _check, build_parser
    from shardmeter_operator.api import GPUPoolSpec
    from shardmeter_operator.render.benchmark import bench_job

    repo = Path(__file__).resolve().parents[2]
    spec = yaml.safe_load((repo / "examples" / "gpupool-cluster-a.yaml").read_text())["spec"]
    spec["gpu"] = {"preset": "h200-141gb-sxm", "memoryBytes": 120 * 2**30}  # a MIG-like cut
    spec["interNodeLink"] = {"name": "roce-200g", "kind": "ethernet", "latencyS": 8e-6,
                             "bandwidthBytesPerS": "200 Gbit/s"}  # fmt: skip
    pool = GPUPoolSpec.model_validate(spec)
    job, _ = bench_job("cluster-a", pool, namespace="sm", image="bench:1",
                       service_account="bench", generation=1, attempt=1, owner={})  # fmt: skip
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    args = build_parser().parse_args(command[command.index("shardmeter_bench") + 1 :])
    _check(args)
    assert args.gpu == pool.gpu and args.gpu.memory_bytes == 120 * 2**30
    assert args.intra_node_link == pool.intra and args.inter_node_link == pool.inter
    assert args.publish == "configmap/shardmeter-coefficients-cluster-a"


def test_help_shows_every_default_and_examples_that_pass_the_checks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--help`` states each flag's default and ends with examples; every example is accepted
    by the real parser and the CLI's own checks (preset names, DNS names, ranges)."""
    import shlex

    from shardmeter_bench.cli import EPILOG, _check, build_parser

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "examples:\n  python -m shardmeter_bench all " in text and "Exit status:" in text
    parser = build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest not in ("help", "version"):
            assert "default" in (action.help or ""), action.option_strings
    commands = EPILOG.split("examples:\n", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")
    examples = [shlex.split(line) for line in commands.splitlines()]
    assert len(examples) == 3
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.json").write_text("{}")  # what the first example writes, the second reads
    for argv in examples:
        args = argv[argv.index("shardmeter_bench") + 1 :]
        namespace = parser.parse_args(args)
        _check(namespace)  # raises UsageError on a bad example
