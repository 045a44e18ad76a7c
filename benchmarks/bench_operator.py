"""Operator latency (issue targets: `kubectl apply` of the case-study TrainingPlan →
`Planned` in ≤ 2 s; 50 TrainingPlans at once: p50/p95 time to `Planned` and the operator's
peak RSS). The operator and the emulated API server run as subprocesses; apply is the real
kubectl; "Planned" is observed by polling the API every 20 ms.

    .venv/bin/python benchmarks/bench_operator.py
"""

from __future__ import annotations

import copy
import json
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
    api_url: str, names: set[str], started: float, timeout: float = 300
) -> dict[str, float]:
    seen: dict[str, float] = {}
    while len(seen) < len(names) and time.perf_counter() - started < timeout:
        for name, phase in plans_status(api_url).items():
            if name in names and name not in seen and phase in ("Planned", "Launched"):
                seen[name] = time.perf_counter() - started
        time.sleep(0.02)
    return seen


def rss_peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    plan = yaml.safe_load((EX / "trainingplan.yaml").read_text())
    with tempfile.TemporaryDirectory() as tmp, operator_process(Path(tmp), recheck_s=30) as op:
        op.kubectl(
            "apply",
            "--validate=false",
            "-f",
            str(EX / "gpupool-cluster-a.yaml"),
            "-f",
            str(EX / "gpupool-cluster-b.yaml"),
        )
        time.sleep(1.0)  # let the pools settle
        single = []
        for i in range(5):
            doc = copy.deepcopy(plan)
            doc["metadata"]["name"] = f"case-study-{i}"
            started = time.perf_counter()
            op.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(doc))
            single.append(
                wait_planned(op.api.url, {doc["metadata"]["name"]}, started)[
                    doc["metadata"]["name"]
                ]
            )
        print(
            f"kubectl apply → Planned (case study), 5 runs: median {statistics.median(single):.2f} s "
            f"(min {min(single):.2f}, max {max(single):.2f}; target ≤ 2 s)"
        )
        docs = []
        for i in range(50):
            doc = copy.deepcopy(plan)
            doc["metadata"]["name"] = f"many-{i}"
            docs.append(yaml.safe_dump(doc))
        names = {f"many-{i}" for i in range(50)}
        started = time.perf_counter()
        op.kubectl("apply", "--validate=false", "-f", "-", input="---\n".join(docs))
        times = sorted(wait_planned(op.api.url, names, started).values())
        p50 = statistics.median(times)
        p95 = times[max(0, round(0.95 * len(times)) - 1)]
        print(
            f"50 TrainingPlans applied at once: {len(times)}/50 Planned; p50 {p50:.2f} s, p95 {p95:.2f} s, "
            f"last {times[-1]:.2f} s; operator peak RSS {rss_peak_mib(op.operator.pid):.0f} MiB"
        )


if __name__ == "__main__":
    main()
