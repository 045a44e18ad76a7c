"""kopf's watch streams made to survive what a real cluster does to them.

kopf (1.45) ends the whole operator when one watch stream fails: a re-list that answers 404
because a CRD was deleted (uninstalling JobSet or Kueue: ``APINotFoundError`` out of the
watcher task, re-raised by the orchestrator), an ``ERROR`` event other than 410 in a stream
(``WatchingError``), or a request whose retries ran out during a long API outage (its
default ``error_backoffs`` give up after about two minutes). None of these concerns the
operator's own objects; a controller should wait and watch again.

* :func:`install` wraps kopf's ``continuous_watch`` (the list-then-watch loop that kopf's
  ``infinite_watch`` restarts whenever it returns): such a failure is logged and the loop
  returns after a pause, so kopf lists and watches again. A kind whose CRD went away is
  re-listed every ``GONE_RETRY_S`` until kopf's CRD observer stops its watcher (and starts a
  new one when the CRD comes back). Cancellation, re-authentication and everything else pass
  through unchanged.
* **Deletions a re-list reveals.** After a watch stream is lost (410, a cut stream, an
  outage) kopf lists the kind again and carries on from the list, but reports nothing for
  the objects the list no longer holds: their ``DELETED`` events were missed for good (Go's
  informers compute them from the list). The wrapper tells the listener registered with
  :func:`on_listed` what a complete listing held, so the controller forgets the rest.
* :data:`ENDLESS_BACKOFFS` for ``settings.networking.error_backoffs``: kopf's requests retry
  for as long as the API is away (1, 1, 2, 3, 5, then every 5 s), each pause at least the
  server's ``Retry-After``.

kopf offers no setting for either, so this patches one function of its private
``kopf._cogs.clients.watching`` module; :func:`install` fails loudly if that function is not
where kopf 1.45 has it (a test holds it), and pyproject pins ``kopf<2``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import structlog
from kopf._cogs.clients import errors as kopf_errors
from kopf._cogs.clients import watching as kopf_watching

log = structlog.get_logger("shardmeter_operator")
GONE_RETRY_S = 2.0
"""A kind that is not served (its CRD deleted) is listed again this often."""
ERROR_RETRY_S = 2.0
"""A stream that failed otherwise (5xx after retries, an ERROR event) restarts after this."""
_ORIGINAL: Any = getattr(kopf_watching, "continuous_watch", None)
Listed = Callable[[str | None, list[dict[str, Any]]], None]
"""``(namespace, or None for every namespace; the objects the listing held)``."""
_LISTENERS: dict[tuple[str, str], Listed] = {}


def on_listed(group: str, plural: str, listener: Listed) -> None:
    """Call ``listener`` after each complete listing of the kind (kopf's initial one and every
    re-list after a lost watch)."""
    _LISTENERS[(group, plural)] = listener


class _Endless:
    """Re-iterable and unsized (kopf counts a sized one's attempts and gives up after them)."""

    def __iter__(self) -> Iterator[float]:
        return itertools.chain((1.0, 1.0, 2.0, 3.0), itertools.repeat(5.0))


ENDLESS_BACKOFFS = _Endless()


async def _guarded(**kwargs: Any) -> AsyncIterator[Any]:
    resource = kwargs.get("resource")
    listener = _LISTENERS.get(
        (str(getattr(resource, "group", "")), str(getattr(resource, "plural", "")))
    )
    listed: list[dict[str, Any]] | None = []
    try:
        async for event in _ORIGINAL(**kwargs):
            if listed is not None and isinstance(event, dict) and event.get("type") is None:
                listed.append(dict(event.get("object") or {}))
            elif listed is not None and event is kopf_watching.Bookmark.LISTED:
                if listener is not None:
                    listener(kwargs.get("namespace"), listed)
                listed = None  # the watch that follows streams changes, not a listing
            yield event
    except kopf_errors.APINotFoundError:
        log.info("watch: kind not served (its CRD removed?); watching again", kind=str(resource))
        await asyncio.sleep(GONE_RETRY_S)
    except (
        kopf_errors.APIServerError,
        kopf_errors.APIForbiddenError,
        kopf_errors.APITooManyRequestsError,
        kopf_watching.WatchingError,
    ) as exc:
        log.warning(
            "watch failed; watching again", kind=str(resource), error=str(exc).splitlines()[0]
        )
        await asyncio.sleep(ERROR_RETRY_S)


def install() -> None:
    """Wrap kopf's list-then-watch loop (idempotent)."""
    if _ORIGINAL is None or not callable(getattr(kopf_watching, "infinite_watch", None)):
        raise RuntimeError(
            "kopf._cogs.clients.watching.continuous_watch is gone: this kopf version is not "
            "supported (see shardmeter_operator.k8s.watchguard)"
        )
    kopf_watching.continuous_watch = _guarded
