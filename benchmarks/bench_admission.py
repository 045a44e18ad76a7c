"""Latency of placement at admission on the paper's case study. Target: p95 ≤ 200 ms per
admission of an annotated JobSet (the mutating webhook's AdmissionReview round trip, as the
API server times it: TLS, the review, planning over the case study's two GPUPools within the
bounded time, rendering, the JSONPatch).

The emulated API server and the operator (with its kopf webhook server on HTTPS) run in this
process, as in the operator tests; the API server calls the webhook as kube-apiserver does
(``tests/support/admission.py``). Figures: the mutating review per admission, the whole
create (both webhooks, the create itself), and the pure decision
(:func:`shardmeter_operator.admission.placement.place_jobset`) without the API around it —
for requests the operator has not planned before (``cold``: the total tokens differ; the
search space — shape tables, the exhaustive pass's layouts — is kept across requests,
`shardmeter.plan.options.SpaceStore`, so only the layouts are scored again) and for a request
placed again (``repeated``: the search is remembered by request). The first
admissions after start (imports, first tables) are a warmup and not counted.

    .venv/bin/python benchmarks/bench_admission.py [--admissions 40] [--warmup 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import kopf  # noqa: E402
import yaml  # noqa: E402

from operator_support import OPERATOR_NS, manifest  # noqa: E402
from placement_support import ANNOTATIONS, OPT_IN, webhook_configurations  # noqa: E402
from placement_support import jobset as annotated_jobset  # noqa: E402
from shardmeter_operator.admission.annotations import parse  # noqa: E402
from shardmeter_operator.admission.placement import place_jobset  # noqa: E402
from shardmeter_operator.config import OperatorConfig  # noqa: E402
from shardmeter_operator.decision import PoolView  # noqa: E402
from shardmeter_operator.handlers import build_registry  # noqa: E402
from support.admission import Admission, ca_bundle, self_signed_certificate  # noqa: E402
from support.cluster import EmulatedCluster, embedded_operator, running_emulator  # noqa: E402

NS = "team-a"
POOLS = [manifest("gpupool-cluster-a.yaml"), manifest("gpupool-cluster-b.yaml")]
CASE_STUDY = {**ANNOTATIONS, "shardmeter.io/pools": "cluster-a,cluster-b"}
"""The case study: both pools, the example TrainingPlan's settings."""


def jobset(name: str, tokens: int = 50_000_000_000) -> dict[str, Any]:
    return annotated_jobset(name, NS, **{**CASE_STUDY, "shardmeter.io/total-tokens": str(tokens)})


def operator_config(cluster: EmulatedCluster, port: int, tmp: Path) -> OperatorConfig:
    cluster.emulator.load_crds(REPO / "tests" / "support" / "crds" / "jobset.x-k8s.io.yaml")
    return OperatorConfig(
        namespace=OPERATOR_NS,
        kubeconfig=str(cluster.kubeconfig_path),
        bench_image="bench:test",
        admission_port=port,
        admission_cert_dir=str(tmp / "certs"),
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def show(what: str, seconds: list[float]) -> None:
    ms = [s * 1000 for s in seconds]
    print(
        f"{what:<44} n={len(ms):3d}  p50 {statistics.median(ms):7.1f} ms  "
        f"p95 {percentile(ms, 0.95):7.1f} ms  max {max(ms):7.1f} ms"
    )


def pure(n: int) -> list[float]:
    pools = {p["metadata"]["name"]: PoolView(spec=p["spec"], status={}) for p in POOLS}
    request = parse({**CASE_STUDY, "shardmeter.io/total-tokens": "51000000000"})
    out = []
    for i in range(n):
        started = time.perf_counter()
        place_jobset(
            jobset(f"pure-{i}", 51_000_000_000), request, request.model, pools, {}, OperatorConfig()
        )
        out.append(time.perf_counter() - started)
    return out


async def through_the_api(
    n: int, warmup: int, tmp: Path, gap_s: float = 0.0
) -> tuple[dict[str, tuple[list[float], list[float]]], str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    crt, _ = self_signed_certificate(tmp / "certs", ["127.0.0.1"])
    # JobSet's CRD only: the simulated JobSet controller of the tests (child Jobs for every
    # admitted JobSet) would compete for this process's event loop
    async with (
        running_emulator(crds_dir=REPO / "crds", tmp_path=tmp) as cluster,
        embedded_operator(
            build_registry(config := operator_config(cluster, port, tmp)),
            memo=kopf.Memo(config=config, kube=None),
        ),
    ):
        admission = Admission.install(cluster.emulator)
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": OPT_IN}}
        text = yaml.safe_dump_all(
            [ns, *POOLS, *webhook_configurations(f"https://127.0.0.1:{port}", ca=ca_bundle(crt))]
        )
        await cluster.kubectl("apply", "-f", "-", input=text)
        await cluster.wait_for(lambda: len(cluster.list("gpupools")) == 2)
        while True:  # the webhook server is up
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets"
        runs: dict[str, tuple[list[float], list[float]]] = {}
        plan = ""
        # cold: a new planning request each time (the total tokens differ); repeated: the
        # same request again (the search is remembered, trainingplan.model.searched)
        for phase, count in [("warmup", warmup), ("cold", n), ("repeated", n)]:
            whole: list[float] = []
            first = len(admission.reviews)
            for i in range(count):
                tokens = 50_000_000_000 + (1 if phase == "repeated" else i + 1) * 1_000_000_000
                if phase == "warmup":
                    tokens += 10**12
                started = time.perf_counter()
                status, body = await cluster.api("POST", path, jobset(f"{phase}-{i}", tokens))
                if status != 201:
                    raise SystemExit(
                        f"{phase} admission {i} answered {status}: {body.get('message')}"
                    )
                whole.append(time.perf_counter() - started)
                plan = body["metadata"]["annotations"]["shardmeter.io/placed"]
                if gap_s:  # the operator records the decision (TrainingPlan, lighthouse)
                    await asyncio.sleep(gap_s)
            reviews = [
                r.seconds for r in admission.reviews[first:] if r.webhook.startswith("place-")
            ]
            runs[phase] = (reviews, whole)
        return runs, plan


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--admissions", type=int, default=40)
    args.add_argument("--warmup", type=int, default=3)
    args.add_argument(
        "--gap",
        type=float,
        default=1.0,
        help="seconds between admissions (0: back to back, each admission then competes "
        "with the operator recording the previous ones in this one process)",
    )
    opts = args.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs, plan = asyncio.run(through_the_api(opts.admissions, opts.warmup, Path(tmp), opts.gap))
    print(f"case study: 2 GPUPools (10×8 H200, 10×8 A100), llama-3.1-8b; placed as {plan}")
    print(f"{opts.admissions} admissions per phase, {opts.gap:g} s apart")
    for phase in ("cold", "repeated"):
        reviews, whole = runs[phase]
        show(f"{phase}: mutating webhook round trip", reviews)
        show(f"{phase}: whole create (2 webhooks + create)", whole)
    show("decision alone (place_jobset), repeated", pure(max(5, opts.admissions // 4)))
    for phase in ("cold", "repeated"):
        p95 = percentile(runs[phase][0], 0.95) * 1000
        verdict = "met" if p95 <= 200 else "NOT met"
        print(f"target p95 <= 200 ms per admission, {phase}: {verdict} ({p95:.0f} ms)")


if __name__ == "__main__":
    main()
