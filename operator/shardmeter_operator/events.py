"""Events exactly once, whatever fails: an outbox in the object's status.

A reconcile compares the status it read with the one it decides; the transitions call for
Events (``PlanResult.events``, ``PoolDecision.events``). Posting them is made part of the
state:

1. Each Event gets a name derived from the object's UID, the number of the transition
   (``status.events.sequence`` as read) and the Event itself. Posting it twice — after a
   lost answer, or because the reconcile failed before its status was written and the next
   one decides the same transition again — is answered 409 and changes nothing.
2. A status written *before* the Events can be posted (the launch decision, before any child
   is created) carries them in ``status.events.pending`` with the advanced ``sequence``;
   whichever reconcile succeeds next posts what is pending before anything else.
3. The final status of a reconcile is written after its Events were posted, with ``pending``
   empty. Events decided *after* such a write (the children created: ``Launched``) belong to
   the transition from the state that write stored: they are named from its sequence, so a
   reconcile that fails before its final write and the next one, which starts from that
   stored state, decide them under the same names.

So no Event is lost (it is pending in the stored status, or will be decided again from the
same stored status) and none is posted twice (same name). Events are created under their own
names with the ``kubernetes`` client (kopf's posting retries a few times and then drops them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from shardmeter_operator.api import EventOutbox, PendingEvent

Event = tuple[str, str, str]
"""(type "Normal" | "Warning", reason, message)."""
Manifest = dict[str, Any]
MESSAGE_CHARS = 1024
COMPONENT = "shardmeter-operator"


def event_name(obj_name: str, uid: str, sequence: int, type_: str, reason: str, msg: str) -> str:
    """``<object>.<16 hex>``, as kube-apiserver names Events, from what makes the Event."""
    digest = hashlib.sha256(f"{uid}\n{sequence}\n{type_}\n{reason}\n{msg}".encode()).hexdigest()
    return f"{obj_name[:236]}.{digest[:16]}"


def _clip(message: str) -> str:
    return message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 1] + "…"


def outbox(
    stored: EventOutbox | None, decided: Sequence[Event], obj_name: str, uid: str
) -> EventOutbox:
    """What the status carries while ``decided`` (the Events of this reconcile's transition
    from the ``stored`` status) are not yet posted: everything pending, the sequence advanced."""
    stored = stored or EventOutbox()
    pending = list(stored.pending)
    known = {p.name for p in pending}
    for type_, reason, message in decided:
        text = _clip(message)
        name = event_name(obj_name, uid, stored.sequence, type_, reason, text)
        if name not in known:
            known.add(name)
            kind: Literal["Normal", "Warning"] = "Warning" if type_ == "Warning" else "Normal"
            pending.append(PendingEvent(name=name, type=kind, reason=reason, message=text))
    return EventOutbox(sequence=stored.sequence + (1 if decided else 0), pending=pending[-32:])


def posted(box: EventOutbox) -> EventOutbox | None:
    """The outbox once everything pending was posted (None: nothing was ever posted)."""
    return EventOutbox(sequence=box.sequence) if box.sequence else None


CLUSTER_SCOPED_NAMESPACE = "default"
"""Where the Events about a cluster-scoped object (a GPUPool) go: kube-apiserver refuses an
Event whose namespace is neither its involved object's nor, for a cluster-scoped one,
``default`` (core/v1 Event validation; found by the real-cluster tests, tests/kube/)."""


def manifest(
    event: PendingEvent,
    involved: Mapping[str, Any],
    namespace: str,
    now: datetime | None = None,
) -> Manifest:
    """The core/v1 Event for ``event`` about the object ``involved`` (its metadata, apiVersion,
    kind), in ``namespace`` (the object's, or :data:`CLUSTER_SCOPED_NAMESPACE`)."""
    stamp = (now or datetime.now(UTC)).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    meta = involved.get("metadata") or {}
    ref = {
        "apiVersion": involved.get("apiVersion"),
        "kind": involved.get("kind"),
        "name": meta.get("name"),
        "uid": meta.get("uid"),
    }
    if meta.get("namespace"):
        ref["namespace"] = meta["namespace"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event.name, "namespace": namespace},
        "involvedObject": ref,
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "source": {"component": COMPONENT},
        "reportingComponent": f"shardmeter.io/{COMPONENT}",
        "reportingInstance": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
