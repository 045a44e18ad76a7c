"""Watches: the events of the write path and the newline-delimited JSON watch-streams."""

import asyncio
import bisect
import contextlib
import copy
import json
from collections.abc import Callable

import aiohttp.web
import attrs
import kmock

from support.kube_emulator.errors import api_error
from support.kube_emulator.resources import Body
from support.kube_emulator.selectors import object_matcher


@attrs.frozen
class WatchEvent:
    rv: int
    resource: kmock.resource  # the storage resource (any served version maps to it)
    type: str  # ADDED, MODIFIED, DELETED
    object: Body
    previous: Body | None  # to turn MODIFIED into ADDED/DELETED for selector-filtered watches


class Watches:
    """The watch-streams of :class:`~support.kube_emulator.KubeEmulator` (a mixin)."""

    __slots__ = ()

    async def _serve_watch_stream(
        self, request: kmock.Request, resource: kmock.resource, info: kmock.ResourceInfo
    ) -> aiohttp.web.StreamResponse:
        params = request.params
        by_name = f"metadata.name={request.name}" if request.name else ""  # …/configmaps/x?watch
        field_selector = ",".join(filter(None, [params.get("fieldSelector"), by_name]))
        matches = object_matcher(request.namespace, params.get("labelSelector"), field_selector)
        storage, api_version = self._storage(resource), self._api_version(resource)
        since, initial = params.get("resourceVersion") or "0", params.get("sendInitialEvents")
        events: list[Body] = []
        if since == "0" or initial == "true":
            objs = self.select(
                resource, request.namespace, params.get("labelSelector"), field_selector
            )
            events = [{"type": "ADDED", "object": obj} for obj in objs]
            position = len(self._events)
        elif since.isdigit():
            position = bisect.bisect_right(self._events, int(since), key=lambda e: e.rv)
        else:
            raise api_error(400, "BadRequest", f"invalid resourceVersion: {since!r}")
        bookmark = {
            "type": "BOOKMARK",
            "object": {
                "kind": info.kind,
                "apiVersion": api_version,
                "metadata": {"resourceVersion": ""},
            },
        }
        if initial == "true":
            bookmark["object"]["metadata"].update(
                resourceVersion=str(self._rv), annotations={"k8s.io/initial-events-end": "true"}
            )
            events.append(copy.deepcopy(bookmark))

        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(params.get("timeoutSeconds") or self.watch_timeout)
        with contextlib.suppress(ConnectionError):
            while True:
                for event in events:
                    await response.write(json.dumps(event).encode() + b"\n")
                events = []
                for event in self._events[position:]:
                    position += 1
                    if event.resource == storage and (kind := self._watch_type(event, matches)):
                        obj = {**event.object, "apiVersion": api_version}
                        events.append({"type": kind, "object": obj})
                if events:
                    continue
                wakeup, timeout = self._wakeup, deadline - loop.time()
                if self._stopping or timeout <= 0 or resource not in self._resources:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), timeout)
            if params.get("allowWatchBookmarks") == "true" and not self._stopping:
                bookmark["object"]["metadata"]["resourceVersion"] = str(self._rv)
                await response.write(json.dumps(bookmark).encode() + b"\n")
            await response.write_eof()
        return response

    @staticmethod
    def _watch_type(event: WatchEvent, matches: Callable[[Body], bool]) -> str | None:
        """As seen through selectors: an object that starts/stops matching is ADDED/DELETED."""
        if event.type != "MODIFIED":
            return event.type if matches(event.object) else None
        now_in = matches(event.object)
        was_in = event.previous is not None and matches(event.previous)
        if now_in:
            return "MODIFIED" if was_in else "ADDED"
        return "DELETED" if was_in else None

    def stop_watches(self) -> None:
        """End all watch-streams now (call before stopping the server: aiohttp waits for them)."""
        self._stopping = True
        self._wakeup.set()
