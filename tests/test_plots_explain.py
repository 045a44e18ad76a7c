"""The pictures explain themselves: a timeline's title names the strategy, islands, link,
settings and blocking and says which part of the run it shows; every kind in its legend is
visible (or the legend says it is drawn wider); bars that end at the window's edge are not
cut by it; the micro-batch sweep's hollow markers have a legend entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardmeter.cli.main import main
from shardmeter.output import sim_plots

BASE = ["simulate", "--model", "llama-3.2-1b", "--gpu", "a100", "--seq-len", "4096"]
DILOCO_OVER_SLOW_WAN = [
    *BASE,
    "--strategy",
    "diloco",
    "--islands",
    "4",
    "--outer-link",
    "wan-1g-80ms",
]
"""500 inner steps of 0.26 s, then a 75 s outer all_reduce the islands wait for."""


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plots would save, kept open for inspection."""
    kept: list[Any] = []
    monkeypatch.setattr(sim_plots, "save_figure", lambda fig, path: kept.append(fig) or path)
    return kept


def _drawn(ax: Any) -> list[tuple[float, float, Any]]:
    """(start, width, colour) of every bar on the axes."""
    out = []
    for coll in ax.collections:
        for path, colour in zip(coll.get_paths(), coll.get_facecolors(), strict=False):
            xs = path.vertices[:, 0]
            out.append((float(xs.min()), float(xs.max() - xs.min()), tuple(colour)))
    return out


def _legend(fig: Any) -> dict[str, tuple[float, ...]]:
    legend = fig.legends[0]
    return {
        t.get_text(): tuple(h.get_facecolor())
        for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)
    }


def test_a_blocking_diloco_timeline_names_its_run_and_shows_every_legend_entry(
    figures: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*DILOCO_OVER_SLOW_WAN, "--png", str(tmp_path / "t.png")]) == 0
    text = capsys.readouterr().out
    fig = figures[0]
    ax = fig.axes[0]
    title = ax.get_title()
    for needed in ("diloco, 4 islands over WAN (wan-1g-80ms)", "syncEvery 500", "blocked 74.6 s"):
        assert needed in title, title
    # the window is explained, and agrees with the text's outer step
    period = text.split("outer step every ")[1].split(";")[0]
    assert f"shown: the last of 3 simulated outer steps, whole ({period}: 500 inner steps)" in title
    # every legend entry is drawn wide enough to see (3 px of the axes)
    lo, hi = ax.get_xlim()
    min_width = (hi - lo) / 1.02 * sim_plots.MIN_BAR_PX / sim_plots.AXES_PX
    bars = _drawn(ax)
    for label, colour in _legend(fig).items():
        widths = [w for _, w, c in bars if np.allclose(c, colour)]
        assert widths and max(widths) >= 0.99 * min_width, label
    assert any("drawn 3 px wide" in label for label in _legend(fig))  # the outer optimizer step
    # the blocked bars end inside the axes, not at its edge
    blocked = sim_plots.LEGEND[sim_plots.BLOCKED]
    ends = [s + w for s, w, c in bars if np.allclose(c[:3], _rgb(blocked))]
    assert ends and max(ends) < hi


def _rgb(hex_colour: str) -> tuple[float, ...]:
    return tuple(int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))


def test_a_streaming_timeline_says_which_part_of_the_outer_step_it_shows(
    figures: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*BASE, "--strategy", "streaming-diloco", "--islands", "3", "--micro-batch", "2"]
    assert main([*argv, "--png", str(tmp_path / "t.png")]) == 0
    text = capsys.readouterr().out
    title = figures[0].axes[0].get_title()
    assert "streaming-diloco, 3 islands over inter-node fabric" in title and "no blocking" in title
    period = text.split("outer step every ")[1].split(";")[0]
    assert "shown: the first " in title and f"which lasts {period}" in title, title
    lo, hi = figures[0].axes[0].get_xlim()
    shown = float(title.split("shown: the first ")[1].split(" s ")[0])
    assert abs((hi - lo) / 1.02 - shown) < 0.01 * shown  # the caption's span is the axis's


def test_the_plan_timeline_names_strategy_islands_link_and_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, figures: list[Any]
) -> None:
    from shardmeter.cli import plan as plan_cli

    titles: list[str] = []
    monkeypatch.setattr(plan_cli, "plot_timeline", _capture_title(titles))
    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    assert main(["plan", str(repo / "examples" / "case-study.yaml"), "--out", str(out)]) == 0
    (title,) = titles
    assert figures[-1].axes[0].get_title() == title
    assert title.startswith("chosen: 1×8×8 H200 + 1×8×8 A100\nstreaming-diloco, 2 islands over WAN")
    assert "syncEvery 20, fragments 10, fragmentSyncDelay 1 — no blocking" in title
    assert "of the last of 3 simulated outer steps" in title


def _capture_title(kept: list[str]) -> Any:
    real = sim_plots.plot_timeline

    def plot(schedule: Any, path: Any, title: str = "", *args: Any) -> Any:
        kept.append(title)
        return real(schedule, path, title, *args)

    return plot


def test_the_sweep_explains_its_hollow_markers(
    figures: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100", "--seq-len", "8192"]
    assert main([*argv, "--sweep-png", str(tmp_path / "s.png")]) == 0
    capsys.readouterr()
    fig = figures[0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["fits in GPU memory", "exceeds GPU memory"]
    hollow = [
        off
        for ax in fig.axes
        for coll in ax.collections
        for off, face in zip(coll.get_offsets(), coll.get_facecolors(), strict=False)
        if np.allclose(face, (1, 1, 1, 1))
    ]
    assert hollow, "a micro-batch that does not fit is drawn hollow"
    assert "micro-batch sweep" in fig._suptitle.get_text()
