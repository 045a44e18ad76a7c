"""The simulated Kueue's flavor assignment and quota accounting (Kueue v0.19.2,
``pkg/scheduler/flavorassigner``, ``pkg/workload/resources.go``), split from
:mod:`support.kueue`: quantities, a pod's requests, taints a pod tolerates, the quota the
admitted Workloads of a ClusterQueue hold, and the first flavor of a resource group that fits a
pod set — with Kueue's messages when none does."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from support.kube_emulator import Body

_SUFFIX: dict[str, int | Decimal] = {
    "": 1,
    "m": Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}
_SUFFIX |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
Usage = dict[tuple[str, str], Decimal]
"""(flavor, resource) → the quantity reserved."""


def quantity(value: Any) -> Decimal:
    """A Kubernetes resource quantity (the suffixes ShardMeter's tests use)."""
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"unsupported quantity {value!r}")
    return Decimal(m.group(1)) * Decimal(_SUFFIX[m.group(2)])


def show(q: Decimal) -> str:
    """A quantity as Kueue prints it in messages and ``resourceUsage``."""
    return str(int(q)) if q == q.to_integral_value() else str(q.normalize())


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """Per-pod requests: each container's requests, limits where requests are unset."""
    out: dict[str, Decimal] = {}
    for c in pod_spec.get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, value in merged.items():
            out[name] = out.get(name, Decimal(0)) + quantity(value)
    return out


def tolerated(taint: Mapping[str, Any], tolerations: list[Mapping[str, Any]]) -> bool:
    """core/v1 ``Toleration.ToleratesTaint`` for any of ``tolerations``."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("key") and t.get("key") != taint.get("key"):
            continue
        if not t.get("key") and t.get("operator") != "Exists":
            continue
        if t.get("operator") == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def add_usage(out: Usage, admission: Mapping[str, Any]) -> None:
    """Add the quota an admission (``status.admission``) holds to ``out``."""
    for a in admission.get("podSetAssignments") or []:
        for res, flavor in (a.get("flavors") or {}).items():
            q = quantity((a.get("resourceUsage") or {}).get(res, 0))
            out[(flavor, res)] = out.get((flavor, res), Decimal(0)) + q


def assign(
    cq: Body, ps: Body, used: Usage, flavor_spec: Callable[[str], Mapping[str, Any]]
) -> tuple[Body | None, str]:
    """Kueue's flavor assigner for one pod set: per resource, in the ClusterQueue's order, the
    first flavor whose ``nodeLabels`` agree with the pods' node selector, whose
    ``nodeTaints`` the pods tolerate and whose unused ``nominalQuota`` covers the pod set.
    Returns the ``podSetAssignment`` (and adds it to ``used``), or None and Kueue's reason."""
    pod = ps["template"].get("spec") or {}
    per_pod = pod_requests(pod)
    need = {r: q * int(ps["count"]) for r, q in per_pod.items() if q}
    selector = pod.get("nodeSelector") or {}
    reasons: list[str] = []
    flavors: dict[str, str] = {}
    for res in sorted(need):
        group = next(
            (g for g in cq["spec"].get("resourceGroups") or [] if res in g["coveredResources"]),
            None,
        )
        if group is None:
            return None, f"resource {res} unavailable in ClusterQueue"
        chosen = None
        for fq in group["flavors"]:
            fspec = flavor_spec(fq["name"])
            labels = fspec.get("nodeLabels") or {}
            if any(k in selector and selector[k] != v for k, v in labels.items()):
                reasons.append(f"flavor {fq['name']} doesn't match node affinity")
                continue
            tolerations = [*(pod.get("tolerations") or []), *(fspec.get("tolerations") or [])]
            untolerated = [
                t
                for t in fspec.get("nodeTaints") or []
                if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerated(t, tolerations)
            ]
            if untolerated:
                t = untolerated[0]
                reasons.append(
                    f"untolerated taint {{{t['key']}: {t.get('value', '')}}} in flavor {fq['name']}"
                )
                continue
            quota = next((r for r in fq["resources"] if r["name"] == res), None)
            nominal = quantity(quota["nominalQuota"]) if quota else Decimal(0)
            free = nominal - used.get((fq["name"], res), Decimal(0))
            if need[res] > nominal:
                reasons.append(
                    f"insufficient quota for {res} in flavor {fq['name']}, request > maximum "
                    f"capacity ({show(need[res])} > {show(nominal)})"
                )
            elif need[res] > free:
                reasons.append(
                    f"insufficient unused quota for {res} in flavor {fq['name']}, "
                    f"{show(need[res] - free)} more needed"
                )
            else:
                chosen = fq["name"]
                break
        if chosen is None:
            return None, ", ".join(reasons)
        flavors[res] = chosen
        used[(chosen, res)] = used.get((chosen, res), Decimal(0)) + need[res]
    return {
        "name": ps["name"],
        "flavors": flavors,
        "resourceUsage": {r: show(q) for r, q in need.items()},
        "count": int(ps["count"]),
    }, ""
