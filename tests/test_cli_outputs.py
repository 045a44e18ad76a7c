"""Outputs a user can trust: a configuration that does not fit in memory says so first and
prints no throughput (exit 1, or ``--ignore-memory``), MFU names its peak, "max micro-batch"
is computed at the accumulation it names, equal plans follow one stated tie-break, the paper's
figure and the DiLoCo lines appear only where they mean something, ``--time-limit`` means
one thing, and ``plan`` writes files only with ``--out``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_plan_timelimit import BuildClock

from shardmeter.cli.main import main
from shardmeter.output import plan_plots
from shardmeter.output.plan_text import plans_table
from shardmeter.plan import search as search_module
from shardmeter.plan.result import PlanSummary, build_result, summarise, top_indices
from shardmeter.plan.schema import load_plan
from shardmeter.plan.search import search

REPO = Path(__file__).resolve().parents[1]
CASE = REPO / "examples" / "case-study.yaml"
SEVENTY_B_FP8 = [
    "predict",
    "--model",
    "llama-3.1-70b",
    "--gpu",
    "h100",
    "--nodes",
    "8",
    "--network",
    "8x-ndr",
    "--activation-checkpointing",
    "selective-op",
    "--torch-compile",
    "--accumulation",
    "2",
    "--precision",
    "fp8",
]


def test_predict_that_does_not_fit_says_so_first_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(SEVENTY_B_FP8) == 1
    out = capsys.readouterr().out
    assert out.startswith("does not fit in memory:")
    assert "tokens/s" not in out and "MFU" not in out and "simulated step" not in out
    assert main([*SEVENTY_B_FP8, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert "step" not in data and data["error"].startswith("does not fit")
    assert main([*SEVENTY_B_FP8, "--ignore-memory"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("does not fit in memory:") and "--ignore-memory" in lines[1]
    assert any("tokens/s per GPU" in line for line in lines)


def test_simulate_checks_memory(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--model", "llama-3.1-70b", "--gpu", "h100"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert out.startswith("does not fit in memory:") and "tokens/s" not in out
    assert main([*argv, "--ignore-memory"]) == 0
    assert capsys.readouterr().out.startswith("(--ignore-memory: does not fit")


def test_mfu_names_its_peak_and_max_micro_batch_is_at_the_accumulation_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["predict", "--model", "llama-3.1-8b", "--gpu", "h100", "--accumulation", "4"]
    assert main([*argv, "--precision", "fp8"]) == 0
    out = capsys.readouterr().out
    assert "of the dense bf16 peak" in out and "of the fp8 peak" in out
    assert "with gradient accumulation 4" in out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["peak_flop_per_s"]["basis"] == "bf16" and "fp8" not in data["peak_flop_per_s"]
    from shardmeter.cli.common import build_cost_model
    from shardmeter.cli.main import build_parser

    cm = build_cost_model(build_parser().parse_args(argv))
    assert data["memory"]["max_micro_batch_with_accumulation"] == cm.max_micro_batch(
        8, accumulation=4, gpus_per_node=8
    )


@pytest.fixture(scope="module")
def case_result() -> Any:
    spec, _ = load_plan(str(CASE), [])
    return build_result(search(spec))


def test_one_tie_break_chosen_is_the_cheapest_within_the_fraction(case_result: Any) -> None:
    r = case_result
    assert r.spread.cheapest == r.chosen.label
    top = top_indices(r, 20)
    assert top[0] == r.output.fastest and r.output.chosen in top


def test_top20_stays_readable_when_every_plan_ties(
    case_result: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures: list[Any] = []
    monkeypatch.setattr(plan_plots, "save_figure", lambda fig, path: figures.append(fig) or path)
    plan: PlanSummary = case_result.chosen
    plan_plots.plot_top([plan] * 20, tmp_path / "t.png", "ties", plan, 0.99, 3)
    ax = figures[0].axes[0]
    bottom, top = ax.get_ylim()
    assert bottom < 0.99 * plan.rank_tokens_per_s < plan.rank_tokens_per_s < top
    star = figures[0].axes[1].collections[-1].get_offsets()
    assert star[0][0] == 3  # the star on the chosen bar, not the first with its layout
    assert len(ax.containers[0].datavalues) == 20


def _plan(tmp_path: Path, objective: dict[str, Any], **replace: Any) -> str:
    spec = yaml.safe_load(CASE.read_text())
    spec["objective"] = objective
    spec.update(replace)
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(spec))
    return str(f)


def test_paper_figure_and_diloco_lines_only_where_they_mean_something(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    f = _plan(tmp_path, {"kind": "min-cost"})
    assert main(["plan", f, "--progress", "none"]) == 0
    out = capsys.readouterr().out
    assert "21.69" not in out and "within 99.0 %" not in out
    assert "chosen (min-cost): 1×" in out  # one island:
    assert "Streaming DiLoCo:" not in out and "outer-step overhead" not in out
    assert "one island: its outer optimizer steps every" in out
    assert not (tmp_path / "out").exists(), "no files without --out"
    assert main(["plan", str(CASE), "--progress", "none", "--details"]) == 0
    out = capsys.readouterr().out
    assert "paper §V" in out and "the chosen plan)" in out and "ties: " in out
    assert "Streaming DiLoCo:" in out
    assert list(tmp_path.iterdir()) == [tmp_path / "p.yaml"]


def test_plan_is_short_by_default_and_details_add_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The case study's default text: times in human units (three figures: '3.31 s', not
    '3312.53 ms'), no quality basis, tie rule, settings reasoning or paper comparison — one
    line says --details adds them; --details prints each of them."""
    assert main(["plan", str(CASE), "--progress", "none"]) == 0
    short = capsys.readouterr().out
    assert main(["plan", str(CASE), "--progress", "none", "--details"]) == 0
    full = capsys.readouterr().out
    extras = (
        "  basis: Scaling Laws for DiLoCo",
        "ties: ",
        "settings: ",
        "paper §V: ",
        "  energy  ",
    )
    for text in extras:
        assert text not in short and text in full, text
    assert "--details adds" in short and "--details adds" not in full
    assert "DP-eq. tokens/s" in short and "DP-eq. tokens/s" in full
    for out in (short, full):
        times = re.findall(r"(\d[\d,.]*) (?:µs|ms|s|min)\b", out)
        assert times and all(
            len(t.replace(",", "").replace(".", "").lstrip("0")) <= 3 for t in times
        ), times
        assert "within 99.0 % of the best throughput" in out
    assert max(len(line) for line in short.splitlines() if "  " not in line) < 240


def test_time_limit_gives_a_proven_gap_never_an_exact_frontier(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(search_module, "time", BuildClock)  # the space built, the search cut
    assert main(["plan", str(CASE), "--progress", "none", "--time-limit", "0.001"]) == 0
    search_line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("search:"))
    assert "exact frontier" not in search_line and "proven gap ≤" in search_line
    assert "unknown" not in search_line


def test_a_limit_shorter_than_building_the_space_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", str(CASE), "--json", "--progress", "none", "--time-limit", "0.001"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["search"]["proven_optimal"] is False and data["search"]["gap"] is None
    assert data["search"]["shapes_not_simulated"] > 0
    assert any(
        n.startswith("time limit reached while building the search space") for n in data["notes"]
    )
    assert main(["plan", str(CASE), "--progress", "none", "--time-limit", "0.001"]) == 0
    search_line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("search:"))
    assert "candidate shapes not simulated (no gap proven)" in search_line
    assert data["files"] == {}


@pytest.mark.parametrize("quality_adjusted", [True, False])
def test_top20_plots_and_labels_what_the_frontier_table_shows(
    quality_adjusted: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """top20.png's bars carry the table's own strings for the same plans: its "DP-eq.
    tokens/s" column when the objective is quality-adjusted (the axis and legend say
    DP-eq.), its plain "tokens/s" otherwise — never a plain label on DP-eq. figures."""
    spec = yaml.safe_load(CASE.read_text())
    spec["objective"]["qualityAdjusted"] = quality_adjusted
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(spec))
    result = build_result(search(load_plan(str(f), [])[0]))
    plans = [summarise(result.output, result.output.evaluated, i) for i in top_indices(result, 20)]
    figures: list[Any] = []
    monkeypatch.setattr(plan_plots, "save_figure", lambda fig, path: figures.append(fig) or path)
    plan_plots.plot_top(plans, tmp_path / "t.png", "", result.chosen, 0.99)
    ax, ax2 = figures[0].axes[:2]
    bars = [t.get_text() for t in ax.texts]
    table = plans_table(plans, result.chosen).splitlines()
    header = table[0]
    column = "DP-eq. tokens/s" if quality_adjusted else "tokens/s"
    end = header.index(column) + len(column)  # right-aligned: a cell ends where its header does
    cells = [" ".join(row[:end].split()[-2:]) for row in table[2:]]
    assert bars == cells and len(bars) == 20
    name = "DP-eq. " if quality_adjusted else ""
    assert ax.get_ylabel().startswith(f"{name}tokens/s") and ax2.get_ylabel() == f"{name}cost (USD)"
    if quality_adjusted:
        assert bars[0] != " ".join(table[2][: header.index("tokens/s") + 8].split()[-2:])
