"""Operator latency and memory. Targets: `kubectl apply` of the case-study TrainingPlan →
`Planned` p50/p95 (≤ 2 s); 50 TrainingPlans applied at once → `Planned` p95 ≤ 5 s; operator
peak RSS ≤ 200 MiB. The operator and the emulated API server (which validates every write as
kube-apiserver does) run as subprocesses; apply is the real kubectl (strict validation);
"Planned" is observed by polling the API (every 20 ms for one plan, 0.1 s for 50). On a
shared machine, compare the CPU seconds it prints as well as the wall-clock figures.

    .venv/bin/python benchmarks/bench_operator.py [--single-runs 20]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.operator_process import operator_process  # noqa: E402

EX = REPO / "examples"


def plans_status(api_url: str) -> dict[str, str]:
    with urllib.request.urlopen(
        f"{api_url}/apis/shardmeter.io/v1alpha1/trainingplans", timeout=10
    ) as r:
        items = json.loads(r.read())["items"]
    return {i["metadata"]["name"]: (i.get("status") or {}).get("phase", "") for i in items}


def wait_planned(
    api_url: str, names: set[str], started: float, timeout: float = 300, poll_s: float = 0.02
) -> dict[str, float]:
    seen: dict[str, float] = {}
    while len(seen) < len(names) and time.perf_counter() - started < timeout:
        for name, phase in plans_status(api_url).items():
            if name in names and name not in seen and phase in ("Planned", "Launched"):
                seen[name] = time.perf_counter() - started
        time.sleep(poll_s)
    return seen


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_peak_mib(pid: int, field: str = "VmHWM") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))]


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--single-runs", type=int, default=20)
    opts = args.parse_args()
    plan = yaml.safe_load((EX / "trainingplan.yaml").read_text())
    with tempfile.TemporaryDirectory() as tmp, operator_process(Path(tmp), recheck_s=30) as op:
        op.kubectl(
            "apply",
            "-f",
            str(EX / "gpupool-cluster-a.yaml"),
            "-f",
            str(EX / "gpupool-cluster-b.yaml"),
        )
        time.sleep(1.0)  # let the pools settle
        idle = rss_peak_mib(op.operator.pid, "VmRSS")
        single = []
        for i in range(opts.single_runs):
            doc = copy.deepcopy(plan)
            doc["metadata"]["name"] = f"case-study-{i}"
            started = time.perf_counter()
            op.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
            single.append(
                wait_planned(op.api.url, {doc["metadata"]["name"]}, started)[
                    doc["metadata"]["name"]
                ]
            )
        print(
            f"kubectl apply → Planned (case study), {len(single)} runs one after another: "
            f"p50 {statistics.median(single):.2f} s, p95 {percentile(single, 0.95):.2f} s "
            f"(min {min(single):.2f}, max {max(single):.2f}; target ≤ 2 s)"
        )
        docs = []
        for i in range(50):
            doc = copy.deepcopy(plan)
            doc["metadata"]["name"] = f"many-{i}"
            docs.append(yaml.safe_dump(doc))
        names = {f"many-{i}" for i in range(50)}
        cpu = cpu_s(op.operator.pid), cpu_s(op.api.process.pid)
        started = time.perf_counter()
        op.kubectl("apply", "-f", "-", input="---\n".join(docs))
        # poll every 0.1 s: listing 50 plans every 20 ms would load the API server itself
        times = sorted(wait_planned(op.api.url, names, started, poll_s=0.1).values())
        used = cpu_s(op.operator.pid) - cpu[0], cpu_s(op.api.process.pid) - cpu[1]
        print(
            f"50 TrainingPlans applied at once: {len(times)}/50 Planned; "
            f"p50 {statistics.median(times):.2f} s, p95 {percentile(times, 0.95):.2f} s "
            f"(target ≤ 5 s), last {times[-1]:.2f} s; CPU: operator {used[0]:.1f} s, "
            f"emulated API server {used[1]:.1f} s"
        )
        print(
            f"operator peak RSS {rss_peak_mib(op.operator.pid):.0f} MiB (target ≤ 200 MiB; "
            f"{idle:.0f} MiB with two pools, before any plan; "
            f"{rss_peak_mib(op.operator.pid, 'VmRSS'):.0f} MiB at the end)"
        )


if __name__ == "__main__":
    main()
