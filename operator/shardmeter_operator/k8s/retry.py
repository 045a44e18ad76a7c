"""When a failed reconcile runs again: the retry follows the cause of the failure and the
server, not the count of an object's failures.

* **Throttled** (the server sent ``Retry-After``, or 429): after ``Retry-After`` (capped).
* **The API is unavailable** (no answer, 5xx): an outage, not the object's fault. The delay
  grows with the *operator's* consecutive unanswered calls (:class:`~.k8s.client.ApiHealth`, reset
  by any answered call) from ``OUTAGE_FIRST_S`` to ``OUTAGE_MAX_S``: a storm of faults keeps
  the retries a few seconds apart, and the first answered call after an outage brings them
  back to ``OUTAGE_FIRST_S`` — every object converges within seconds of the API answering.
* **Conflict** (409: the object changed since it was read): at once, after ``CONFLICT_S``.
* **Anything else** (the API refused a request, a bug): per object, doubling from
  ``ERROR_FIRST_S`` to ``ERROR_MAX_S`` — such a failure repeats until something changes.
  Only these count against the object, and only failures of reconciles that ran for a retry:
  one triggered by a watch event (the object or a child changed) adds nothing to the delay.

Every delay gets ±20 % jitter (seeded per process), so that objects failed by one outage do
not come back in lockstep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from shardmeter_operator.k8s.client import ApiError

RETRY_AFTER_MAX_S = 30.0
OUTAGE_FIRST_S, OUTAGE_MAX_S = 0.5, 5.0
CONFLICT_S = 0.2
ERROR_FIRST_S, ERROR_MAX_S = 2.0, 300.0
JITTER = 0.2


@dataclass(frozen=True)
class Retry:
    delay_s: float
    cause: str
    """"throttled" | "unavailable" | "conflict" | "error"."""


def cause_of(exc: BaseException) -> str:
    if isinstance(exc, ApiError):
        if exc.retry_after_s is not None or exc.status == 429:
            return "throttled"
        if exc.unavailable:
            return "unavailable"
        if exc.status == 409:
            return "conflict"
    return "error"


def retry_delay(
    exc: BaseException, *, outage_failures: int, object_errors: int, rng: random.Random
) -> Retry:
    """The delay before a reconcile that raised ``exc`` runs again. ``outage_failures``:
    the API's consecutive unanswered calls; ``object_errors``: the object's failures of the
    ``error`` cause so far (this one included)."""
    cause = cause_of(exc)
    if cause == "throttled":
        after = exc.retry_after_s if isinstance(exc, ApiError) else None
        base = min(RETRY_AFTER_MAX_S, after if after is not None else 1.0)
        return Retry(base + rng.uniform(0, JITTER * max(base, 0.5)), cause)  # never before it
    if cause == "unavailable":
        base = min(OUTAGE_MAX_S, OUTAGE_FIRST_S * 2 ** max(0, outage_failures - 1))
    elif cause == "conflict":
        base = CONFLICT_S
    else:
        base = min(ERROR_MAX_S, ERROR_FIRST_S * 2 ** max(0, object_errors - 1))
    return Retry(base * rng.uniform(1 - JITTER, 1 + JITTER), cause)
