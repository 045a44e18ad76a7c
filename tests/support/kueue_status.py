"""A Workload's status as Kueue v0.19.2 changes it (``pkg/workload/{workload,admissionchecks}.go``,
``pkg/workload/evict``, ``pkg/workload/patching``, ``pkg/controller/core/workload_controller.go``),
as pure functions on ``status`` dicts, shared by the simulated Kueue and MultiKueue:

* conditions keyed by ``type`` whose ``lastTransitionTime`` changes only when ``status`` flips;
* ``status.admissionChecks[]`` — ``name``, ``state`` (Pending → Ready | Retry | Rejected),
  ``message``, ``lastTransitionTime`` (changes with the state), ``retryCount`` — one per check
  of the Workload's ClusterQueue, added ``Pending`` with an empty message, sorted by name;
* ``QuotaReserved`` then ``Admitted``: with checks, the scheduler reserves quota and
  ``Admitted`` is only added (True) once every check is ``Ready``; losing the reservation sets
  it False (``NoReservation``, or ``NoReservationUnsatisfiedChecks`` with a check not Ready);
* eviction (``Evicted`` True): ``clusterName``/``nominatedClusterNames`` reset, every check that
  is not Pending reset to ``Pending`` ("Reset to Pending after eviction. Previously: Retry"),
  a Retry check's ``retryCount`` incremented.

The messages are Kueue's; the legacy reasons apply (the ``UnadmittedWorkloadsObservability``
gate is off by default in v0.19)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from support.kube_emulator import Body, now_iso

PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"
CHECK_STATES = (PENDING, READY, RETRY, REJECTED)


def condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    """The object's condition of that type if its status is True, else None."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def is_true(status: Mapping[str, Any], type_: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == "True" for c in status.get("conditions") or []
    )


def set_condition(status: Body, type_: str, value: bool, reason: str, message: str) -> None:
    """``apimeta.SetStatusCondition``: the transition time changes only when status flips."""
    want = "True" if value else "False"
    conditions = status.setdefault("conditions", [])
    for c in conditions:
        if c["type"] == type_:
            if c["status"] != want:
                c["lastTransitionTime"] = now_iso()
            c.update(status=want, reason=reason, message=message)
            return
    conditions.append(
        {
            "type": type_,
            "status": want,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_iso(),
        }
    )


def remove_condition(status: Body, type_: str) -> None:
    status["conditions"] = [c for c in status.get("conditions") or [] if c["type"] != type_]


# ---- admission checks -----------------------------------------------------------------------
def check_state(status: Mapping[str, Any], name: str) -> Body | None:
    return next((c for c in status.get("admissionChecks") or [] if c["name"] == name), None)


def set_check_state(status: Body, name: str, state: str, message: str) -> None:
    """``workloadpatching.SetAdmissionCheckState``: the transition time changes with the
    state; the message is always replaced."""
    checks = status.setdefault("admissionChecks", [])
    found = check_state(status, name)
    if found is None:
        checks.append(
            {"name": name, "state": state, "message": message, "lastTransitionTime": now_iso()}
        )
        checks.sort(key=lambda c: c["name"])
        return
    if found["state"] != state:
        found["state"] = state
        found["lastTransitionTime"] = now_iso()
    found["message"] = message


def sync_check_states(status: Body, names: Iterable[str]) -> None:
    """The workload controller's ``syncAdmissionCheckConditions``: one state per check of the
    ClusterQueue (new ones Pending, message ""), the others dropped, sorted by name."""
    wanted = set(names)
    if not wanted:
        status.pop("admissionChecks", None)
        return
    kept = [c for c in status.get("admissionChecks") or [] if c["name"] in wanted]
    have = {c["name"] for c in kept}
    for name in sorted(wanted - have):
        kept.append(
            {"name": name, "state": PENDING, "message": "", "lastTransitionTime": now_iso()}
        )
    status["admissionChecks"] = sorted(kept, key=lambda c: c["name"])


def all_checks_ready(status: Mapping[str, Any]) -> bool:
    return all(c["state"] == READY for c in status.get("admissionChecks") or [])


def checks_in(status: Mapping[str, Any], state: str) -> list[Body]:
    return [c for c in status.get("admissionChecks") or [] if c["state"] == state]


def checks_message(checks: list[Body], state: str) -> str:
    """``buildAdmissionChecksMessage``."""
    parts = [
        f'"{c["name"]}" ({c["message"]})' if c.get("message") else f'"{c["name"]}"'
        for c in sorted(checks, key=lambda c: c["name"])
    ]
    noun = "AdmissionChecks" if len(checks) > 1 else "AdmissionCheck"
    return f"{noun} in {state} state: " + "; ".join(parts)


# ---- QuotaReserved / Admitted ---------------------------------------------------------------
def sync_admitted(status: Body) -> None:
    """``workload.SyncAdmittedCondition`` (legacy reasons): Admitted follows "quota reserved
    and every check Ready"; nothing is written while it never was admitted and still is not."""
    reserved, ready = is_true(status, "QuotaReserved"), all_checks_ready(status)
    if is_true(status, "Admitted") == (reserved and ready):
        return
    if reserved and ready:
        set_condition(status, "Admitted", True, "Admitted", "The workload is admitted")
    elif not reserved and not ready:
        set_condition(
            status,
            "Admitted",
            False,
            "NoReservationUnsatisfiedChecks",
            "The workload has no reservation and not all checks ready",
        )
    elif not reserved:
        set_condition(status, "Admitted", False, "NoReservation", "The workload has no reservation")
    else:
        set_condition(
            status, "Admitted", False, "UnsatisfiedChecks", "The workload has not all checks ready"
        )


def reserve_quota(status: Body, admission: Body) -> None:
    """``workload.SetQuotaReservation`` then ``SyncAdmittedCondition`` (the scheduler)."""
    status["admission"] = admission
    cq = admission["clusterQueue"]
    set_condition(
        status, "QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {cq}"
    )
    for c in status.get("conditions") or []:  # resetActiveCondition
        if c["type"] in ("Evicted", "Preempted") and c["status"] == "True":
            set_condition(status, c["type"], False, "QuotaReserved", "Previously: " + c["message"])
    sync_admitted(status)


def unset_quota(status: Body, reason: str, message: str) -> None:
    """``workload.UnsetQuotaReservationWithCondition``."""
    set_condition(status, "QuotaReserved", False, reason, message)
    status.pop("admission", None)
    sync_admitted(status)


def evict(status: Body, reason: str, message: str) -> None:
    """``workloadevict.prepareForEviction``: Evicted True; the cluster nomination and the
    checks that are not Pending reset."""
    set_condition(status, "Evicted", True, reason, message)
    status.pop("clusterName", None)
    status.pop("nominatedClusterNames", None)
    for c in status.get("admissionChecks") or []:
        if c["state"] == PENDING:
            continue
        name, previous, retries = c["name"], c["state"], c.get("retryCount")
        if previous == RETRY:
            retries = int(retries or 0) + 1
        c.clear()
        c.update(
            name=name,
            state=PENDING,
            message=f"Reset to Pending after eviction. Previously: {previous}",
            lastTransitionTime=now_iso(),
        )
        if retries is not None:
            c["retryCount"] = retries
