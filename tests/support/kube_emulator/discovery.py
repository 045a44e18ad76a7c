"""API discovery (``/version``, ``/api``, ``/apis``, ``/apis/GROUP[/VERSION]``) from the
registered resources only."""

from typing import Any

import kmock

from support.kube_emulator.errors import api_error
from support.kube_emulator.resources import Body, version_priority


class Discovery:
    """Overrides of kmock's discovery hooks in :class:`~support.kube_emulator.KubeEmulator`."""

    __slots__ = ()

    def _get_resources(self) -> list[kmock.resource]:
        return list(self._resources)  # only what is registered, not guessed from objects/reactions

    def _group_versions(self) -> dict[str, list[str]]:
        groups: dict[str, set[str]] = {}
        for resource in self._resources:
            groups.setdefault(resource.group or "", set()).add(resource.version or "")
        return {group: sorted(versions, key=version_priority) for group, versions in groups.items()}

    @staticmethod
    def _api_group(name: str, versions: list[str]) -> Body:
        entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {"name": name, "versions": entries, "preferredVersion": entries[0]}

    async def _serve_server_version(self, request: kmock.Request) -> Any:
        return {
            "major": "1",
            "minor": "32",
            "gitVersion": "v1.32.0+kube-emulator",
            "platform": "linux/amd64",
        }

    async def _serve_api(self, request: kmock.Request) -> Any:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": request.url.host or "127.0.0.1"}
            ],
        }

    async def _serve_apis(self, request: kmock.Request) -> Any:
        groups = self._group_versions()
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self._api_group(group, groups[group]) for group in sorted(groups) if group],
        }

    async def _serve_group(self, request: kmock.Request) -> Any:
        group = request.resource.group if request.resource is not None else None
        versions = self._group_versions().get(group or "")
        if not group or not versions:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        return {"kind": "APIGroup", "apiVersion": "v1", **self._api_group(group, versions)}

    async def _serve_version(self, request: kmock.Request) -> Any:
        assert request.resource is not None
        group, version = request.resource.group or "", request.resource.version
        entries = []
        for resource, info in self._resources.items():
            if (resource.group or "", resource.version) != (group, version):
                continue
            common = {
                "singularName": info.singular or "",
                "namespaced": bool(info.namespaced),
                "kind": info.kind or resource.plural,
            }
            entries.append(
                {
                    "name": resource.plural,
                    **common,
                    "verbs": sorted(info.verbs),
                    "shortNames": sorted(info.shortnames),
                    "categories": sorted(info.categories),
                }
            )
            entries.extend(
                {
                    "name": f"{resource.plural}/{sub}",
                    **common,
                    "singularName": "",
                    "verbs": ["get", "patch", "update"],
                }
                for sub in sorted(info.subresources)
            )
        if not entries:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": entries,
        }
