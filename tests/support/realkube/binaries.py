"""Where ``tools/kube/build.sh`` (``make kube``) put the control plane's binaries and manifests:
``${SHARDMETER_KUBE_CACHE:-~/.cache/shardmeter/kube}/<name>-v<version>/``, the versions pinned
in ``tools/kube/versions.env``."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VERSIONS_FILE = REPO / "tools" / "kube" / "versions.env"
CACHE_ENV = "SHARDMETER_KUBE_CACHE"


class NotBuiltError(RuntimeError):
    """A component is missing from the cache."""


@functools.cache
def versions() -> dict[str, str]:
    """``{"KUBE_VERSION": "1.37.2", …}`` from versions.env."""
    found = re.findall(r"^([A-Z_]+)=(\S+)$", VERSIONS_FILE.read_text(), re.MULTILINE)
    return dict(found)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "shardmeter" / "kube")


@dataclass(frozen=True)
class Component:
    name: str
    version: str

    @property
    def root(self) -> Path:
        """The component's directory in the cache (raises :class:`NotBuiltError` if unbuilt)."""
        root = cache_dir() / f"{self.name}-v{self.version}"
        if not (root / ".built").is_file():
            raise NotBuiltError(
                f"{self.name} v{self.version} is not built in {root.parent}: run `make kube` "
                f"(tools/kube/build.sh {self.name}; set ${CACHE_ENV} to use another cache)"
            )
        return root

    def binary(self, name: str) -> Path:
        return self.root / "bin" / name

    def config(self, *parts: str) -> Path:
        """A path in the module's kustomize tree (``config/default`` renders its install)."""
        return self.root.joinpath("config", *parts)


def kubernetes() -> Component:
    return Component("kubernetes", versions()["KUBE_VERSION"])


def etcd() -> Component:
    return Component("etcd", versions()["ETCD_VERSION"])


def jobset() -> Component:
    return Component("jobset", versions()["JOBSET_VERSION"])


def kueue() -> Component:
    return Component("kueue", versions()["KUEUE_VERSION"])
