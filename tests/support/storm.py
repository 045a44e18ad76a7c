"""A fault storm against the real operator: the emulated API server and the operator as
subprocesses, the operator talking to the API through :class:`~support.faultproxy.FaultProxy`.

:func:`run` applies pools and plans (directly to the API server, as a user would, unfaulted),
lets the proxy inject faults for ``storm_s`` seconds (some plans are deleted meanwhile), then
measures how long after the storm every object is where a run without faults puts it:

* each plan's status equal to the reference run's (timestamps and the Event bookkeeping
  aside), its children exactly the reference's (kind and name; none for deleted plans),
* each plan's Events: the reference's reasons, each exactly as often (none lost, none twice),
* each plan's gauges: the reference's series and values; none for deleted plans,
* the operator process still up.

Used by ``tests/operator/controller/test_faults.py`` (short storm) and ``benchmarks/bench_faults.py``
(the one-minute storm, repeated, with figures).
"""

from __future__ import annotations

import copy
import json
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support.faultproxy import FaultProxy, FaultRates
from support.kube_emulator import write_kubeconfig
from support.operator_process import REPO, Running, operator_process

EX = REPO / "examples"
NS = "default"
CHILD_KINDS = ("jobs", "services", "deployments")
Doc = dict[str, Any]


def _load(name: str) -> Doc:
    return dict(yaml.safe_load((EX / name).read_text()))


def pools() -> list[Doc]:
    a, b = _load("gpupool-cluster-a.yaml"), _load("gpupool-cluster-b.yaml")
    c = copy.deepcopy(b)
    c["metadata"]["name"] = "cluster-c"
    c["spec"].update(nodes=4, site="site-c", pricePerGpuHourUsd=0.99)
    c["spec"]["wanUplink"] = {**c["spec"]["wanUplink"], "name": "wan-c"}
    return [a, b, c]


def plans(count: int) -> list[Doc]:
    """Plan-only over two pools, launched on one pool (a lighthouse, islands as Jobs with
    their Services), and one naming a pool that does not exist, in turn."""
    base = _load("trainingplan.yaml")
    out = []
    for i in range(count):
        doc = copy.deepcopy(base)
        doc["metadata"]["name"] = f"storm-{i:02d}"
        spec = doc["spec"]
        spec["training"]["totalTokens"] = 10_000_000_000 * (1 + i)
        kind = i % 5
        if kind in (1, 2):
            spec.update(launch=True, pools=[{"name": "cluster-a" if kind == 1 else "cluster-c"}])
        elif kind == 3:
            spec["pools"] = [{"name": "cluster-b"}, {"name": "cluster-c"}]
        elif kind == 4:
            spec["pools"] = [{"name": "cluster-z"}]  # Valid=False: PoolNotFound
        out.append(doc)
    return out


def deleted(names: list[str]) -> set[str]:
    """Plans deleted during the storm (their reconciles may be in flight)."""
    return {n for i, n in enumerate(names) if i % 7 == 6}


# ---- reading the state ------------------------------------------------------------------------
def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


REVISION = re.compile(r"\b[0-9a-f]{16,64}\b")


def _normal_status(status: Doc) -> Doc:
    """Without timestamps, the Event bookkeeping and revisions (hashes of UIDs, which differ
    from run to run)."""
    out = json.loads(REVISION.sub("<revision>", json.dumps(status)))
    out.pop("events", None)
    out.pop("observed", None)
    for c in out.get("conditions") or []:
        c.pop("lastTransitionTime", None)
    out["conditions"] = sorted(out.get("conditions") or [], key=lambda c: c["type"])  # a map
    for isl in out.get("islands") or []:
        isl.pop("observed", None)
    return out


SERIES = re.compile(r"^(shardmeter_plan_[a-z_]+|shardmeter_island_[a-z_]+)\{(.*)\} (\S+)$")


def plan_series(metrics_text: str) -> dict[str, dict[str, str]]:
    """Plan name → {series (name and labels without the plan's): value}."""
    out: dict[str, dict[str, str]] = {}
    for line in metrics_text.splitlines():
        m = SERIES.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        plan = labels.pop("trainingplan", None)
        if plan is None:
            continue
        labels.pop("namespace", None)
        key = m.group(1) + json.dumps(labels, sort_keys=True)
        out.setdefault(plan, {})[key] = m.group(3)
    return out


@dataclass
class State:
    statuses: dict[str, Doc]
    children: dict[str, set[tuple[str, str]]]
    events: dict[str, Counter[str]]
    series: dict[str, dict[str, str]]


def read_state(op: Running, names: list[str]) -> State:
    api = op.api.url
    items = _get(f"{api}/apis/shardmeter.io/v1alpha1/namespaces/{NS}/trainingplans")["items"]
    statuses = {
        i["metadata"]["name"]: _normal_status(i.get("status") or {})
        for i in items
        if i["metadata"]["name"] in names
    }
    children: dict[str, set[tuple[str, str]]] = {n: set() for n in names}
    paths = {
        "jobs": f"/apis/batch/v1/namespaces/{NS}/jobs",
        "services": f"/api/v1/namespaces/{NS}/services",
        "deployments": f"/apis/apps/v1/namespaces/{NS}/deployments",
    }
    for kind, path in paths.items():
        for obj in _get(api + path)["items"]:
            for ref in obj["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "TrainingPlan" and ref.get("name") in children:
                    children[ref["name"]].add((kind, obj["metadata"]["name"]))
    events: dict[str, Counter[str]] = {n: Counter() for n in names}
    for e in _get(f"{api}/api/v1/namespaces/{NS}/events")["items"]:
        involved = e.get("involvedObject") or {}
        if involved.get("kind") == "TrainingPlan" and involved.get("name") in events:
            events[involved["name"]][e.get("reason", "")] += 1
    return State(statuses, children, events, plan_series(op.fetch(op.metrics_url)))


def differences(got: State, want: State, names: list[str]) -> list[str]:
    out = []
    gone = deleted(names)
    for n in sorted(gone):
        left = [
            what
            for what, there in (
                ("the plan", n in got.statuses),
                (f"children {sorted(got.children.get(n) or [])[:3]}", got.children.get(n)),
                (f"series {sorted(got.series.get(n) or {})[:3]}", got.series.get(n)),
            )
            if there
        ]
        if left:
            out.append(f"{n}: deleted, yet {', '.join(left)} remain")
    for n in (n for n in names if n not in gone):
        if got.statuses.get(n) != want.statuses.get(n):
            g, w = got.statuses.get(n) or {}, want.statuses.get(n) or {}
            keys = sorted(k for k in set(g) | set(w) if g.get(k) != w.get(k))
            detail = ""
            if "conditions" in keys:
                gc = {c["type"]: c for c in g.get("conditions") or []}
                wc = {c["type"]: c for c in w.get("conditions") or []}
                detail = str([(gc.get(t), wc.get(t)) for t in gc | wc if gc.get(t) != wc.get(t)])
            else:
                detail = str([(k, g.get(k), w.get(k)) for k in keys])
            out.append(f"{n}: status differs in {', '.join(keys)} {detail[:800]}")
        if got.children.get(n, set()) != want.children.get(n, set()):
            g, w = got.children.get(n, set()), want.children.get(n, set())
            out.append(f"{n}: children +{sorted(g - w)[:3]} -{sorted(w - g)[:3]}")
        if got.events.get(n, Counter()) != want.events.get(n, Counter()):
            out.append(f"{n}: events {dict(got.events[n])} != {dict(want.events[n])}")
        if got.series.get(n, {}) != want.series.get(n, {}):
            g, w = got.series.get(n, {}), want.series.get(n, {})
            out.append(f"{n}: series {sorted(set(g) ^ set(w))[:3] or 'values differ'}")
    return out


# ---- the run ----------------------------------------------------------------------------------
@dataclass
class Result:
    faults: dict[str, int]
    requests: int
    converged_after_s: float | None
    """Seconds from the end of the storm until everything matched the reference (None: not
    within the timeout)."""
    problems: list[str] = field(default_factory=list)
    """What still differed at the timeout."""
    alive: bool = True
    log_tail: str = ""


def _apply(op: Running, docs: list[Doc]) -> None:
    op.kubectl("apply", "-f", "-", input="---\n".join(yaml.safe_dump(d) for d in docs))


def _delete(op: Running, names: set[str]) -> None:
    if names:
        op.kubectl("delete", "trainingplan", *sorted(names), "--wait=false")


def _wait(check: Callable[[], bool], timeout_s: float, poll_s: float = 0.25) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return time.monotonic() - started
        time.sleep(poll_s)
    return None


def reference(tmp_path: Path, names_count: int) -> State:
    """The state a run without faults settles in (every plan applied, the same deleted)."""
    docs = plans(names_count)
    names = [d["metadata"]["name"] for d in docs]
    tmp_path.mkdir(parents=True, exist_ok=True)
    with operator_process(tmp_path, recheck_s=2.0) as op:
        _apply(op, pools() + docs)
        time.sleep(1.0)
        _delete(op, deleted(names))
        last: list[State] = []

        def settled() -> bool:
            state = read_state(op, names)
            stable = bool(last) and not differences(state, last[-1], names)
            last.append(state)
            launched = [d for d in docs if d["spec"].get("launch")]
            done = all(
                state.statuses.get(d["metadata"]["name"], {}).get("phase") == "Launched"
                for d in launched
                if d["metadata"]["name"] not in deleted(names)
            )
            return stable and done

        if _wait(settled, 120, poll_s=1.0) is None:
            raise RuntimeError("the reference run did not settle")
        return last[-1]


def run(
    tmp_path: Path,
    want: State,
    *,
    plans_count: int,
    storm_s: float,
    seed: int,
    settle_timeout_s: float = 120.0,
    rates: FaultRates | None = None,
    blackout: bool = False,
) -> Result:
    """The storm (or with ``blackout``, an outage: every request fails) for ``storm_s``, then
    the time until the state equals ``want`` (:class:`Result`)."""
    docs = plans(plans_count)
    names = [d["metadata"]["name"] for d in docs]
    proxy = FaultProxy("", seed=seed, rates=rates or FaultRates())
    tmp_path.mkdir(parents=True, exist_ok=True)

    def via(api: Any) -> Path:
        proxy.upstream = api.url
        path = tmp_path / "kubeconfig-proxy"
        write_kubeconfig(path, proxy.url)
        return path

    with proxy.running(), operator_process(tmp_path, recheck_s=2.0, via=via) as op:
        proxy.faults(True)
        proxy.blackout = blackout
        started = time.monotonic()
        _apply(op, pools() + docs)
        time.sleep(min(storm_s / 3, 5.0))
        _delete(op, deleted(names))
        time.sleep(max(0.0, storm_s - (time.monotonic() - started)))
        proxy.faults(False)
        proxy.blackout = False
        last: list[list[str]] = []

        def converged() -> bool:
            if op.operator.poll() is not None:
                return False
            problems = differences(read_state(op, names), want, names)
            last.append(problems)
            return not problems

        after = _wait(converged, settle_timeout_s)
        alive = op.operator.poll() is None
        return Result(
            proxy.counts(),
            proxy.requests,
            after,
            last[-1] if last and after is None else [],
            alive,
            op.log.read_text()[-4000:] if after is None or not alive else "",
        )
