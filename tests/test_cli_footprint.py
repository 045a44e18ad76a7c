"""Every output carries what a plan really costs: ``plan --json`` the quality, energy, CO₂e and
egress of every plan; ``simulate`` DiLoCo's quality and the islands' energy; ``predict`` the
island's power."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardmeter.cli.main import main

REPO = Path(__file__).resolve().parents[1]


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_plan_json_reports_quality_energy_and_egress_per_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_json(
        ["plan", str(REPO / "examples" / "case-study.yaml"), "--json", "--no-files"], capsys
    )
    for plan in [out["chosen"], out["fastest"], *out["frontier"]]:
        q = plan["quality"]
        assert set(q) >= {"loss_penalty_vs_dp", "equivalent_token_factor", "basis"}
        assert q["basis"].startswith("Scaling Laws for DiLoCo (arXiv:2503.09799)")
        assert plan["energy_kwh"] > 0 and plan["co2_kg"] > 0
        assert plan["dp_equivalent_hours"] == pytest.approx(
            plan["hours"] * q["equivalent_token_factor"]
        )
        assert plan["cost_usd"] == pytest.approx(plan["gpu_cost_usd"] + plan["egress_usd"])
    assert out["chosen"]["egress_gb"] > 0  # the chosen plan spans both sites
    assert out["objective"]["qualityAdjusted"] is True
    assert out["guard_rails"]["max_fragment_sync_delay_fraction"] == 0.05


def test_simulate_reports_diloco_quality_and_energy(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "llama-3.2-1b", "--gpu", "a100", "--seq-len", "4096"]
    args += ["--strategy", "diloco", "--islands", "4", "--sync-every", "100", "--json"]
    out = run_json([*args, "--total-tokens", "25000000000", "--pue", "1.2"], capsys)
    q = out["quality"]
    assert q["loss_penalty_vs_dp"] > 0 and q["equivalent_token_factor"] > 1
    assert "M = 4, H = 100" in q["basis"]
    e = out["energy"]
    assert e["total_tokens"] == 25_000_000_000 and e["hours"] > 0
    assert e["energy_kwh"] == pytest.approx(e["facility_kw"] * e["hours"])
    assert e["co2_kg"] == pytest.approx(e["energy_kwh"] * 0.48)
    watts = 32 * e["gpu_watts"] * 1.2
    assert e["facility_kw"] == pytest.approx(watts / 1000)
    fsdp = run_json([*args[:7], "--json"], capsys)
    assert fsdp["quality"]["equivalent_token_factor"] == 1.0
    assert fsdp["quality"]["basis"].startswith("data-parallel")


def test_predict_reports_the_islands_power(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["predict", "--model", "llama-3.1-8b", "--gpu", "h200", "--seq-len", "8192", "--json"]
    p = run_json([*args, "--power-cap-watts", "500"], capsys)["power"]
    assert 0.5 < p["utilisation"] <= 1
    assert 0.15 * 700 < p["gpu_watts"] <= 500
    assert p["facility_kw"] == pytest.approx(8 * p["gpu_watts"] * 1.58 / 1000)
    assert p["co2_kg_per_hour"] == pytest.approx(p["kwh_per_hour"] * 0.48)


def test_simulate_prices_quality_only_for_the_tokens_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """DiLoCo's penalty depends on the run's tokens: without ``--total-tokens`` simulate says
    how to get it instead of pricing the 1 B-token default nobody gave."""
    args = ["simulate", "--model", "llama-3.2-1b", "--gpu", "a100", "--seq-len", "4096"]
    args += ["--strategy", "diloco", "--islands", "4", "--sync-every", "100"]
    out = run_json([*args, "--json"], capsys)
    assert out["quality"] is None and "--total-tokens" in out["quality_note"]
    assert out["energy"]["dp_equivalent_energy_kwh"] is None
    assert out["energy"]["hours"] is None and out["energy"]["energy_kwh"] is None
    assert out["energy"]["facility_kw"] > 0
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "quality: not priced" in text and "--total-tokens" in text
    assert "--total-tokens gives the run's hours, energy and CO₂e" in text
    assert "eval loss" not in text


def test_one_island_diloco_says_what_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """A one-island DiLoCo simulation runs DiLoCo's outer step on its own pseudo-gradient
    (torchft's Nesterov step), priced as the paper's M = 1 — and says so."""
    args = ["simulate", "--model", "llama-3.2-1b", "--gpu", "a100", "--seq-len", "4096"]
    args += ["--strategy", "diloco", "--islands", "1", "--total-tokens", "25000000000"]
    out = run_json([*args, "--json"], capsys)
    runs = out["diloco"]["runs"]
    assert runs.startswith("one island running torchft's DiLoCo outer step") and "M = 1" in runs
    assert out["quality"]["runs"] == runs and out["quality"]["loss_penalty_vs_dp"] < 0
    assert main(args) == 0
    assert f"  runs: {runs}" in capsys.readouterr().out
