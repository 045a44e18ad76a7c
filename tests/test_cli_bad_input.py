"""Bad input never crashes: every mistake of issue #15 (and its neighbours) exits 2 with one
line on stderr naming the flag, or the file and the key as the user wrote it, and what to
change. In-process through ``main`` (the same code path as the console script); a few cases
run the real command to prove the exit status and that no traceback is printed."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardmeter.cli.main import main

REPO = Path(__file__).resolve().parents[1]
CASE = REPO / "examples" / "case-study.yaml"
SMALL = ["--model", "llama-3.2-1b", "--gpu", "a100", "--seq-len", "1024"]
UNITS = [
    {"name": "emb", "forward_s": 0.001, "backward_s": 0.002, "all_gather_s": 0.001},
    {"name": "block", "repeat": 4, "forward_s": 0.01, "backward_s": 0.02, "all_gather_s": 0.005},
]


def case_study() -> dict[str, Any]:
    return dict(yaml.safe_load(CASE.read_text()))


def edit(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    doc = case_study()
    change(doc)
    return doc


def one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``shardmeter argv``; it must exit 2 with exactly one line on stderr."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert captured.out == ""
    return lines[0]


# ---- plan files: (what the file holds, the line's expected text) -----------------------------
def _pool(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda d: d["pools"][0].__setitem__(key, value)


PLAN_FILES: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    (
        "syncEvery 1e9",
        lambda d: d["strategy"].update(syncEvery=10**9, fragments=1, fragmentSyncDelay=0),
        "strategy.syncEvery: must be between 1 and 10,000 or 'auto' (got 1000000000)",
    ),
    (
        "syncEvery 4.7 is not truncated",
        lambda d: d["strategy"].update(syncEvery=4.7),
        "strategy.syncEvery: must be a whole number or 'auto' (got 4.7)",
    ),
    (
        "syncEvery '1e9' (YAML text)",
        lambda d: d["strategy"].update(syncEvery="1e9"),
        "strategy.syncEvery: must be a whole number or 'auto' (got '1e9'; a quoted or "
        "exponent-only number is text in YAML — write 1000000000)",
    ),
    (
        "maxSyncEvery above its bound",
        lambda d: d["strategy"].update(maxSyncEvery=100_000),
        "strategy.maxSyncEvery: must be between 1 and 10,000 (got 100000)",
    ),
    (
        "fragments 33 on a 32-block model",
        lambda d: d["strategy"].update(fragments=33),
        "strategy.fragments 33 > the model's 32 blocks",
    ),
    (
        "pricePerGpuHourUsd .inf",
        _pool("pricePerGpuHourUsd", float("inf")),
        "pools[0].pricePerGpuHourUsd: must be a finite number (got inf)",
    ),
    (
        "pricePerGpuHourUsd true",
        _pool("pricePerGpuHourUsd", True),
        "pools[0].pricePerGpuHourUsd: must be a number (got true, a boolean)",
    ),
    (
        "pricePerGpuHourUsd 1e308",
        _pool("pricePerGpuHourUsd", 1e308),
        "pools[0].pricePerGpuHourUsd: must be between 0 and 10,000 (got 1e+308)",
    ),
    (
        "peakBf16FlopPerS .inf in a preset override keeps its camelCase",
        _pool("gpu", {"preset": "h200", "peakBf16FlopPerS": float("inf")}),
        "pools[0].gpu.peakBf16FlopPerS: must be a finite number (got inf)",
    ),
    (
        "a camelCase override out of range",
        _pool("gpu", {"preset": "h200", "memoryBytes": "0 GiB"}),
        "pools[0].gpu.memoryBytes: must be between 1 B and 1 PiB",
    ),
    (
        "latencyS .inf on a WAN uplink",
        lambda d: d["pools"][0]["wanUplink"].update(latencyS=float("inf")),
        "pools[0].wanUplink.latencyS: must be a finite number (got inf)",
    ),
    (
        "nicBandwidthBytesPerS nan",
        lambda d: d["pools"][0]["network"].update(nicBandwidthBytesPerS=float("nan")),
        "pools[0].network.nicBandwidthBytesPerS: must be a finite number (got nan)",
    ),
    (
        "costBudgetUsd .inf",
        lambda d: d.update(objective={"kind": "cost-budget", "costBudgetUsd": float("inf")}),
        "objective.costBudgetUsd: must be a finite number (got inf)",
    ),
    (
        "throughputFraction nan",
        lambda d: d["objective"].update(throughputFraction=float("nan")),
        "objective.throughputFraction: must be a finite number (got nan)",
    ),
    (
        "maxIslands true",
        lambda d: d["constraints"].update(maxIslands=True),
        "constraints.maxIslands: must be a whole number (got true, a boolean)",
    ),
    (
        "nodes 2.0",
        _pool("nodes", 2.0),
        "pools[0].nodes: must be a whole number (got 2.0)",
    ),
    (
        "nodes '10'",
        _pool("nodes", "10"),
        "pools[0].nodes: must be a whole number (got '10'",
    ),
    (
        "nodes 1e9",
        _pool("nodes", 10**9),
        "pools[0].nodes: must be between 1 and 4096 (got 1000000000)",
    ),
    (
        "maxNodes 1e9",
        _pool("maxNodes", 10**9),
        "pools[0].maxNodes: must be between 0 and 4096 (got 1000000000)",
    ),
    (
        "maxGpus 1e12",
        lambda d: d["constraints"].update(maxGpus=10**12),
        "constraints.maxGpus: must be between 1 and 16,777,216",
    ),
    (
        "allowedPools []",
        lambda d: d["constraints"].update(allowedPools=[]),
        "constraints.allowedPools is empty, so no pool may be used; name at least one of "
        "cluster-a, cluster-b",
    ),
    (
        "a pool name with a newline",
        _pool("name", "cluster-a\n"),
        "pools[0].name: must be a DNS-1123 label",
    ),
    (
        "duplicate pools",
        lambda d: d["pools"].append(dict(d["pools"][0])),
        "pool names must be unique; repeated: cluster-a",
    ),
    (
        "a misspelt key",
        lambda d: d["pools"][0].update(priceperGpuHourUsd=1),
        "pools[0].priceperGpuHourUsd: unknown field (did you mean 'pricePerGpuHourUsd'?)",
    ),
    (
        "a model override in camelCase",
        lambda d: d.update(model={"preset": "llama-3.1-8b", "numLayers": 0}),
        "model.numLayers: must be between 1 and 1024 (got 0)",
    ),
    (
        "a model that is a number",
        lambda d: d.update(model=5),
        "model: must be a preset name or a mapping of fields (got 5)",
    ),
    (
        "seqLenTokens true",
        lambda d: d["training"].update(seqLenTokens=True),
        "training.seqLenTokens: must be a whole number (got true, a boolean)",
    ),
]


@pytest.mark.parametrize(
    ("change", "expected"), [c[1:] for c in PLAN_FILES], ids=[c[0] for c in PLAN_FILES]
)
def test_bad_plan_files(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: Callable[[dict[str, Any]], Any],
    expected: str,
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(edit(change), sort_keys=False))
    line = one_line(capsys, ["plan", str(f), "--no-files"])
    assert line.startswith(f"shardmeter plan: error: {f}: ")
    assert expected in line


def test_training_plan_manifest_errors_name_the_manifest_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((REPO / "examples" / "trainingplan.yaml").read_text())
    doc["spec"]["strategy"]["syncEvery"] = 4.7
    f = tmp_path / "tp.yaml"
    f.write_text(yaml.safe_dump(doc))
    pools = [str(REPO / "examples" / f"gpupool-cluster-{c}.yaml") for c in "ab"]
    argv = ["plan", str(f), "--no-files", "--pool-file", pools[0], "--pool-file", pools[1]]
    assert f"{f}: spec.strategy.syncEvery: must be a whole number" in one_line(capsys, argv)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"model: caf\xe9\n", "not UTF-8 text: byte 0xe9 on line 1; save it as UTF-8"),
        (b"model: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested deeper than 32 levels"),
        (b"a: " + b"{b: " * 3000 + b"1" + b"}" * 3000 + b"\n", "nested deeper than 32 levels"),
        (b"a: &a [*a]\n", "nested deeper than 32 levels"),
        (  # a "billion laughs" alias bomb
            b"a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
            + b"".join(
                f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n".encode()
                for p, c in zip("abcdefgh", "bcdefghi", strict=True)
            ),
            "holds more than 100,000 values",
        ),
        (b"model: [1,\n", "invalid YAML"),
        (b"- 1\n- 2\n", "must hold one plan"),
    ],
    ids=[
        "latin-1",
        "nested lists",
        "nested maps",
        "recursive alias",
        "alias bomb",
        "bad YAML",
        "a list",
    ],
)
def test_unreadable_plan_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: bytes, expected: str
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_bytes(text)
    line = one_line(capsys, ["plan", str(f), "--no-files"])
    assert line.startswith(f"shardmeter plan: error: {f}: ") and expected in line


def test_non_utf8_model_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "model.yaml"
    f.write_bytes(b"name: caf\xe9\nhiddenSize: 64\n")
    line = one_line(capsys, ["predict", "--model", str(f), "--gpu", "a100"])
    assert f"{f}: not UTF-8 text" in line


# ---- output paths: checked before any work -------------------------------------------------
def test_plan_output_folder_problems_are_found_before_the_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardmeter.cli.plan as plan_cli

    def no_search(*_: Any, **__: Any) -> Any:
        raise AssertionError("the search ran before the output folder was checked")

    monkeypatch.setattr(plan_cli, "plan_file", no_search)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    trace_dir = tmp_path / "out"
    (trace_dir / "trace.json").mkdir(parents=True)
    for out, expected in [
        (a_file, f"--out: {a_file} is a file, not a folder"),
        (a_file / "sub", f"--out: {a_file / 'sub'}: {a_file} is a file, not a folder"),
        ("/proc/shardmeter-out", "--out: /proc/shardmeter-out: cannot write in /proc"),
        (trace_dir, f"--out: {trace_dir / 'trace.json'} is a folder"),
    ]:
        line = one_line(capsys, ["plan", str(CASE), "--out", str(out)])
        assert expected in line


@pytest.mark.parametrize(
    ("flag", "path", "expected"),
    [
        ("--trace", "/proc/t.json", "--trace: /proc/t.json: cannot write in /proc"),
        ("--png", "{file}/t.png", "--png: {file}/t.png: {file} is a file, not a folder"),
        ("--png", "{dir}", "--png: must name a .png file"),
        ("--sweep-png", "{dir}/x.png", "--sweep-png: {dir}/x.png is a folder"),
        ("--trace", "{dir}/t.txt", "--trace: must name a .json file"),
    ],
)
def test_simulate_output_paths_are_checked_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, path: str, expected: str
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    (tmp_path / "d" / "x.png").mkdir(parents=True)
    names = {"file": str(a_file), "dir": str(tmp_path / "d")}
    line = one_line(capsys, ["simulate", *SMALL, flag, path.format(**names)])
    assert expected.format(**names) in line


# ---- flags ---------------------------------------------------------------------------------
FLAGS: list[tuple[list[str], str]] = [
    (["simulate", *SMALL, "--rounds", "0"], "argument --rounds: must be between 1 and 100 (got 0)"),
    (["simulate", *SMALL, "--rounds", "1000000"], "argument --rounds: must be between 1 and 100"),
    (
        ["simulate", *SMALL, "--accumulation", "1000000"],
        "argument --accumulation: must be between 1 and 65,536",
    ),
    (
        ["predict", *SMALL, "--accumulation", "1000000"],
        "argument --accumulation: must be between 1 and 65,536",
    ),
    (["simulate", *SMALL, "--islands", "100000"], "argument --islands: must be between 1 and 64"),
    (
        ["simulate", *SMALL, "--sync-every", "1000000000"],
        "argument --sync-every: must be between 1 and 10,000",
    ),
    (
        ["simulate", *SMALL, "--max-inflight", "0"],
        "argument --max-inflight: must be between 1 and 2,048",
    ),
    (["predict", *SMALL, "--nodes", "1000000000"], "argument --nodes: must be between 1 and 4,096"),
    (
        ["predict", *SMALL[:4], "--seq-len", "2000000"],
        "argument --seq-len: must be between 1 and 1,048,576",
    ),
    (
        ["predict", *SMALL, "--micro-batch", "1000000000"],
        "argument --micro-batch: must be between 1 and 1,048,576",
    ),
    (
        ["predict", *SMALL[:4], "--seq-len", "131072", "--micro-batch", "1000000"],
        "--micro-batch: --seq-len 131072 × --micro-batch 1000000 × 8 GPUs = 1,048,576,000,000 "
        "tokens per micro-step; at most 1,000,000,000,000",
    ),
    (
        ["predict", *SMALL, "--power-cap-watts", "nan"],
        "argument --power-cap-watts: must be a finite number",
    ),
    (
        ["predict", *SMALL, "--power-cap-watts", "900"],
        "--power-cap-watts: powerCapWatts (900) exceeds",
    ),
    (
        ["predict", *SMALL, "--precision", "fp9"],
        "--precision: must be 'bf16', 'fp32' or 'fp8' (got 'fp9')",
    ),
    (
        ["predict", *SMALL, "--grad-reduce-bytes", "9"],
        "argument --grad-reduce-bytes: must be 2 or 4 (got 9)",
    ),
    (
        ["predict", *SMALL, "--grad-reduce-bytes", "3"],
        "argument --grad-reduce-bytes: must be 2 or 4 (got 3)",
    ),
    (
        ["predict", *SMALL, "--network", '{"nicsPerNode": 8, "nicBandwidthBytesPerS": Infinity}'],
        "--network.nicBandwidthBytesPerS: must be a finite number (got inf)",
    ),
    (
        ["plan", str(CASE), "--no-files", "--time-limit", "nan"],
        "argument --time-limit: must be a finite number",
    ),
    (
        ["plan", str(CASE), "--no-files", "--time-limit", "inf"],
        "argument --time-limit: must be a finite number",
    ),
    (
        ["plan", str(CASE), "--no-files", "--rows", "-1"],
        "argument --rows: must be between 0 and 100,000",
    ),
    (
        ["predict", *SMALL, "--sharding", "hsdp", "--nodes", "4", "--shard-group-nodes", "3"],
        "--shard-group-nodes: 3 does not divide the island's 4 nodes: hsdp shards inside "
        "groups of whole nodes and replicates across whole groups; use a divisor of 4 (1, 2, 4)",
    ),
    (
        ["simulate", *SMALL, "--sharding", "hsdp", "--nodes", "4", "--shard-group-nodes", "5"],
        "--shard-group-nodes: 5 exceeds the island's 4 node(s)",
    ),
    (
        [
            "simulate",
            *SMALL,
            "--strategy",
            "streaming-diloco",
            "--islands",
            "2",
            "--fragment-sync-delay",
            "2000",
        ],
        "--fragment-sync-delay: 2000 needs syncEvery > 2000 × 1 fragment(s), but auto picks at most 500",
    ),
    (
        [
            "simulate",
            *SMALL,
            "--strategy",
            "streaming-diloco",
            "--islands",
            "2",
            "--fragments",
            "17",
        ],
        "--fragments: 17 > the model's 16 blocks",
    ),
    (
        [
            "simulate",
            *SMALL,
            "--strategy",
            "streaming-diloco",
            "--sync-every",
            "10",
            "--fragments",
            "3",
        ],
        "--sync-every: syncEvery (10) must be a multiple of fragments (3)",
    ),
    (
        [
            "simulate",
            *SMALL,
            "--strategy",
            "diloco",
            "--islands",
            "64",
            "--sync-every",
            "10000",
            "--rounds",
            "100",
        ],
        "--rounds: 64 island(s) × 100 round(s) × syncEvery 10000 = 64,000,000 inner steps to "
        "simulate; at most 2,000,000",
    ),
]


@pytest.mark.parametrize(
    ("argv", "expected"),
    FLAGS,
    ids=[" ".join(a[3:] if a[0] != "plan" else a[2:]) for a, _ in FLAGS],
)
def test_bad_flags(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    line = one_line(capsys, argv)
    assert line.startswith(f"shardmeter {argv[0]}: error: ") and expected in line


# ---- the what-if durations file ------------------------------------------------------------
DURATIONS: list[tuple[dict[str, Any], str]] = [
    ({"diloco": "x"}, "diloco: must be a mapping of fields (got 'x')"),
    (
        {"diloco": {"sync_every": 10, "islands": "abc"}},
        "diloco.islands: must be a whole number or a list",
    ),
    (
        {"diloco": {"sync_every": 10, "islands": [1, 2]}},
        "diloco.islands[0]: must be a mapping of fields (got 1)",
    ),
    (
        {"diloco": {"sync_every": 10, "islands": 10**6}},
        "diloco.islands: must be between 1 and 64 or a list",
    ),
    (
        {"diloco": {"sync_every": 10, "islands": True}},
        "diloco.islands: must be a whole number or a list (got true, a boolean)",
    ),
    (
        {"diloco": {"sync_every": 10, "all_reduce_s": "abc"}},
        "diloco.all_reduce_s: must be a number or a list",
    ),
    (
        {"diloco": {"sync_every": 10, "fragments": 2, "all_reduce_s": [1.0]}},
        "all_reduce_s lists 1 durations for 2 fragment(s)",
    ),
    (
        {"diloco": {"sync_every": 10, "all_reduce_s": float("nan")}},
        "diloco.all_reduce_s: must be a finite number",
    ),
    ({"diloco": {"sync_every": 4.7}}, "diloco.sync_every: must be a whole number (got 4.7)"),
    ({"diloco": {"sync_every": 10**9}}, "diloco.sync_every: must be between 1 and 10,000"),
    ({"diloco": {}}, "diloco.sync_every: required field is missing"),
    ({"diloco": {"sync_every": 10, "colour": 1}}, "diloco.colour: unknown field"),
    (
        {"diloco": {"sync_every": 10, "islands": [{"step_s": float("nan")}]}},
        "diloco.islands[0].step_s: must be a finite number",
    ),
    (
        {"diloco": {"sync_every": 10, "fragments": 3}},
        "sync_every (10) must be a multiple of fragments (3)",
    ),
    ({"units": [{"name": "b", "repeat": 10**8}]}, "units[0].repeat: must be between 1 and 2048"),
    ({"units": [{"name": "b", "repeat": 1500}, {"repeat": 1500}]}, "units expand to 3,000 units"),
    ({"units": [{"forward_s": float("nan")}]}, "units[0].forward_s: must be a finite number"),
    ({"units": [{"forward_s": 0}]}, "every task lasts 0 s"),
    ({"optimizer_s": float("nan")}, "optimizer_s: must be a finite number"),
    ({"accumulation": 10**6}, "accumulation: must be between 1 and 65,536"),
    ({"accumulation": True}, "accumulation: must be a whole number (got true, a boolean)"),
]


@pytest.mark.parametrize(
    ("patch", "expected"),
    DURATIONS,
    ids=[e.split(":")[0] + f"-{i}" for i, (_, e) in enumerate(DURATIONS)],
)
def test_bad_durations_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], patch: dict[str, Any], expected: str
) -> None:
    f = tmp_path / "what-if.yaml"
    f.write_text(yaml.safe_dump({"units": copy.deepcopy(UNITS), **patch}))
    line = one_line(capsys, ["simulate", "--durations", str(f)])
    assert line.startswith(f"shardmeter simulate: error: {f}: ") and expected in line


def test_durations_rounds_bound_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "what-if.yaml"
    f.write_text(yaml.safe_dump({"units": UNITS, "diloco": {"sync_every": 10_000, "islands": 64}}))
    line = one_line(capsys, ["simulate", "--durations", str(f), "--rounds", "4"])
    assert "--rounds: 64 island(s) × 4 round(s) × syncEvery 10000 = 2,560,000 inner steps" in line


# ---- strict JSON and quiet stderr on good input --------------------------------------------
def _strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_plan_json_is_strict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(CASE), "--json", "--no-files", "--progress", "none"]) == 0
    captured = capsys.readouterr()
    data = _strict(captured.out)
    assert captured.err == ""
    for p in data["search"]["passes"]:  # an unbounded search bound is null, not Infinity
        assert p["best"] is None or isinstance(p["best"], float)


def test_durations_json_with_given_islands_is_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "what-if.yaml"
    doc = {
        "units": UNITS,
        "diloco": {"sync_every": 10, "islands": [{"step_s": 0.1}, {}], "all_reduce_s": 0.5},
    }
    f.write_text(yaml.safe_dump(doc))
    assert main(["simulate", "--durations", str(f), "--json", "--rounds", "3"]) == 0
    out = _strict(capsys.readouterr().out)
    assert out["islands"] == 2 and out["diloco"]["sync_every"] == 10


def test_a_plan_without_wan_uplinks_prints_nothing_on_stderr(tmp_path: Path) -> None:
    def no_wan(d: dict[str, Any]) -> None:
        for p in d["pools"]:
            p.pop("wanUplink")
            p["site"] = "one-site"

    f = tmp_path / "no-wan.yaml"
    f.write_text(yaml.safe_dump(edit(no_wan)))
    result = subprocess.run(
        [
            sys.executable,
            "-W",
            "default",
            "-m",
            "shardmeter.cli.main",
            "plan",
            str(f),
            "--no-files",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr


# ---- the real command: exit status 2, one line, no traceback --------------------------------
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["plan", "{latin1}", "--no-files"], "not UTF-8 text"),
        (["plan", "{nested}", "--no-files"], "nested deeper than 32 levels"),
        (["plan", str(CASE), "--out", "{file}/sub"], "is a file, not a folder"),
        (["simulate", *SMALL, "--trace", "/proc/t.json"], "cannot write in /proc"),
        (["simulate", "--durations", "{durations}"], "diloco.islands[0]: must be a mapping"),
        (
            ["predict", *SMALL, "--sharding", "hsdp", "--nodes", "3", "--shard-group-nodes", "2"],
            "--shard-group-nodes: 2 does not divide the island's 3 nodes",
        ),
    ],
)
def test_the_command_exits_2_with_one_line(tmp_path: Path, argv: list[str], expected: str) -> None:
    (tmp_path / "latin1.yaml").write_bytes(
        CASE.read_bytes().replace(b"# The paper", b"# The p\xe4per")
    )
    (tmp_path / "nested.yaml").write_text("model: " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp_path / "file").write_text("x")
    (tmp_path / "d.yaml").write_text(
        yaml.safe_dump({"units": UNITS, "diloco": {"sync_every": 10, "islands": [1]}})
    )
    names = {
        "latin1": str(tmp_path / "latin1.yaml"),
        "nested": str(tmp_path / "nested.yaml"),
        "file": str(tmp_path / "file"),
        "durations": str(tmp_path / "d.yaml"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "shardmeter.cli.main", *(a.format(**names) for a in argv)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


# ---- help ------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["predict", "simulate", "plan"])
def test_help_has_an_example_and_every_default(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    assert f"examples:\n  shardmeter {command} " in text
    from shardmeter.cli.args import HelpFormatter
    from shardmeter.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    parser = sub.choices[command]  # type: ignore[attr-defined]
    formatter = HelpFormatter(command)
    for action in parser._actions:
        if action.help and action.default not in (None, False, [], "==SUPPRESS=="):
            assert "default" in (formatter._get_help_string(action) or ""), action.dest


@pytest.mark.parametrize("command", ["predict", "simulate", "plan"])
def test_help_examples_are_accepted_by_the_parser(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each example in ``--help`` parses with the real parser (flags spelled right, values in
    range)."""
    import shlex

    from shardmeter.cli.main import build_parser

    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    block = text.split("examples:\n", 1)[1].replace("\\\n", " ")
    examples = [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]
    assert examples and all(argv[:2] == ["shardmeter", command] for argv in examples)
    parser = build_parser()
    for argv in examples:
        parser.parse_args(argv[1:])


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """``shardmeter predict … | head -1``: when stdout's reader has gone, the command stops
    with 141 (as a shell reports SIGPIPE) and prints no traceback."""
    with subprocess.Popen(
        [sys.executable, "-m", "shardmeter.cli.main", "predict", "--model", "llama-3.2-1b",
         "--gpu", "a100", "--seq-len", "4096", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # before the command has written anything
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141, err
    assert err == ""
