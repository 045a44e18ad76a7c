"""The API's vocabulary: object types, well-known resources, the builtin resources, API version
ordering, URL paths and timestamps."""

import datetime
import functools
import gzip
import importlib.resources
import re
from typing import Any

import kmock
from kmock._internal import parsing

Body = dict[str, Any]
ObjectKey = tuple[kmock.resource, str | None, str]
CRD = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACES = kmock.resource("", "v1", "namespaces")
JOBS = kmock.resource("batch", "v1", "jobs")
SKIPPED_GROUPS = {"gateway.networking.k8s.io", "metrics.k8s.io"}  # CRDs/aggregated in k3s
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def version_priority(version: str) -> tuple[Any, ...]:
    """Kubernetes' version ordering: GA before beta before alpha, higher numbers first."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if m is None:
        return (3, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m[2]]
    return (stage, -int(m[1]), -int(m[3] or 0))


def parse_api_path(path: str) -> parsing.ParsedPath:
    """Like ``kmock.parsing.parse_path()``, but also right for the ``namespaces`` resource."""
    parts = [part for part in path.split("/") if part]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    elif len(parts) == 2 and parts[0] == "apis":
        return parsing.ParsedPath(group=parts[1])
    else:
        return parsing.ParsedPath()
    namespace = None
    is_ns_subresource = len(rest) == 3 and rest[2] in {"status", "finalize"}
    if len(rest) >= 3 and rest[0] == "namespaces" and not is_ns_subresource:
        namespace, rest = rest[1], rest[2:]
    plural, name, *subs = [*rest, None, None][: max(2, len(rest))]
    return parsing.ParsedPath(group, version, plural, namespace, name, "/".join(subs) or None)


@functools.cache
def bundled_resources() -> bytes:
    """kmock's bundled discovery data of the builtin resources (from a K3s cluster)."""
    data = importlib.resources.files("kmock._internal").joinpath("resources.json.gz").read_bytes()
    return gzip.decompress(data)
