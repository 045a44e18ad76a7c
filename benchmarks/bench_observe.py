"""What observing a launched plan costs the operator per read (CPU, medians):

* parsing and summarising one island's log tail — the end-to-end run's real log
  (tests/fixtures/observe), its steps renumbered and repeated to the default tail of 2,000
  lines;
* holding the observations against the model for the case study launched on one pool (the
  islands the operator plans for examples/trainingplan.yaml on cluster-a): a compute-scale fit
  per island and the outer-step re-check with the settings search.

    .venv/bin/python benchmarks/bench_observe.py
"""

from __future__ import annotations

import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

from shardmeter_operator.api import GPUPoolSpec, TrainingPlanSpec  # noqa: E402
from shardmeter_operator.api.observation import IslandObservation  # noqa: E402
from shardmeter_operator.observe.evaluate import Provenance, evaluate_observations  # noqa: E402
from shardmeter_operator.observe.logparse import parse_log  # noqa: E402
from shardmeter_operator.observe.summary import IslandFacts, summarize  # noqa: E402
from shardmeter_operator.trainingplan.model import plan_outcome, plan_request  # noqa: E402

TAIL_LINES = 2000


def median_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float, float]:
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), min(samples), max(samples)


def long_log() -> str:
    """The real island log's training lines, repeated with steps and manager steps advanced."""
    lines = (REPO / "tests/fixtures/observe/e2e-island-0.log").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "Training starts" in line)
    body = lines[start + 1 :]
    out = lines[: start + 1]
    copy = 0
    while len(out) < TAIL_LINES:
        shift = 12 * copy

        def step(m: re.Match[str], shift: int = shift) -> str:
            return f"{m[1]}{int(m[2]) + shift:2}"

        def manager(m: re.Match[str], shift: int = shift) -> str:
            return f"manager_step={int(m[1]) + shift // 2}"

        for line in body:
            line = re.sub(r"(step: )\s*(\d+)", step, line)
            out.append(re.sub(r"manager_step=(\d+)", manager, line))
        copy += 1
    return "\n".join(out[-TAIL_LINES:]) + "\n"


def case_study() -> tuple[object, list[object], dict[str, IslandObservation], object]:
    plan = yaml.safe_load((REPO / "examples/trainingplan.yaml").read_text())
    pool = yaml.safe_load((REPO / "examples/gpupool-cluster-a.yaml").read_text())
    spec = TrainingPlanSpec.model_validate({**plan["spec"], "pools": [{"name": "cluster-a"}]})
    request = plan_request(spec, {"cluster-a": GPUPoolSpec.model_validate(pool["spec"])})
    outcome = plan_outcome("case-study", request, {"cluster-a": None})
    observed = {
        i.name: IslandObservation(
            read_at="2026-12-01T00:00:00Z",
            reason="Observed",
            step_seconds_p50=i.step_seconds * 1.1,
            steps=200,
            fragment_sync_seconds=2.0,
            sync_stall_seconds=0.5,
        )
        for i in outcome.islands
    }
    return request, outcome.islands, observed, outcome.settings


def main() -> None:
    print(
        f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    text = long_log()
    facts = IslandFacts(256, 1, 2, 0.05)

    def one_island() -> object:
        return summarize(parse_log(text), facts, "2026-12-01T00:00:00Z")

    obs = one_island()
    med, lo, hi = median_ms(one_island, 20)
    print(
        f"parse + summarise one island's tail ({TAIL_LINES} lines, {len(text.encode()) / 1024:.0f} KiB, "
        f"{obs.windows} metric intervals): median {med:.1f} ms (min {lo:.1f}, max {hi:.1f})"  # type: ignore[attr-defined]
    )
    request, islands, observed, settings = case_study()
    provenance = Provenance("ns/case-study", "uid", "rev", datetime.now(UTC), True)

    def evaluate() -> object:
        return evaluate_observations(
            request,  # type: ignore[arg-type]
            {"cluster-a": None},
            islands,  # type: ignore[arg-type]
            observed,
            settings,  # type: ignore[arg-type]
            provenance,
        )

    med, lo, hi = median_ms(evaluate, 5)
    print(
        f"hold {len(islands)} observed case-study islands against the model (compute-scale fits, "
        f"outer-step re-check): median {med:.0f} ms (min {lo:.0f}, max {hi:.0f})"
    )


if __name__ == "__main__":
    main()
