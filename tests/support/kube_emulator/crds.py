"""CustomResourceDefinitions: validation, (un)registration of their served versions, and the
``default`` values of their schemas."""

import copy
import os
import pathlib

import kmock
import yaml

from support.kube_emulator import builtins, structural
from support.kube_emulator.errors import api_error
from support.kube_emulator.resources import Body

CRD_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


apply_schema_defaults = structural.apply_defaults  # the name it had before


class CRDRegistry:
    """The CRD part of :class:`~support.kube_emulator.KubeEmulator` (a mixin; uses its state)."""

    __slots__ = ()

    @staticmethod
    def _validate_crd(crd: Body) -> None:
        spec = crd.get("spec") or {}
        names, group = spec.get("names") or {}, spec.get("group")
        if (
            not group
            or not names.get("plural")
            or not names.get("kind")
            or not spec.get("versions")
        ):
            raise api_error(
                422, "Invalid", "a CRD needs spec.group, spec.names.plural/kind, and spec.versions"
            )
        if crd["metadata"]["name"] != f"{names['plural']}.{group}":
            raise api_error(
                422, "Invalid", 'metadata.name must be spec.names.plural+"."+spec.group'
            )
        if len([v for v in spec["versions"] if v.get("storage")]) != 1:
            raise api_error(422, "Invalid", "exactly one version must be the storage version")
        problems = builtins.schema_errors(crd)
        for i, version in enumerate(spec["versions"]):
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if schema is None:
                problems.append(f"spec.versions[{i}].schema.openAPIV3Schema: Required value")
            else:
                where = f"spec.versions[{i}].schema.openAPIV3Schema"
                problems += structural.structural_problems(schema, where)
        if problems:
            name = crd["metadata"]["name"]
            raise api_error(
                422,
                "Invalid",
                f'CustomResourceDefinition.apiextensions.k8s.io "{name}" is invalid: '
                + "; ".join(problems),
            )

    def _sync_crd(self, old: Body | None, new: Body | None) -> None:
        """Register the served versions of a CRD as resources; unregister removed ones."""
        old_resources = self._crd_resources(old) if old else {}
        new_resources = self._crd_resources(new) if new else {}
        if new is None and old_resources:  # the CRD is gone: so are its objects
            storage = self._storage(next(iter(old_resources)))
            for (res, namespace, name), obj in list(self._objects.items()):
                if res == storage and not obj.deleted:
                    self._remove((res, namespace, name), copy.deepcopy(obj.raw))
        for resource in old_resources.keys() - new_resources.keys():
            del self._resources[resource]
            self._printer_columns.pop(resource, None)
            self._schemas.pop(resource, None)
        if new is None and old is not None:
            group_plural = (old["spec"]["group"], old["spec"]["names"]["plural"])
            self._custom.discard(group_plural)
            self._storage_versions.pop(group_plural, None)
        # The objects are stored under the first storage version forever: no conversions.
        versions = new["spec"]["versions"] if new is not None else []
        storage = next((v["name"] for v in versions if v.get("storage")), None)
        for resource, (info, version) in new_resources.items():
            self._resources[resource] = info
            self._printer_columns[resource] = version.get("additionalPrinterColumns") or []
            self._schemas[resource] = (version.get("schema") or {}).get("openAPIV3Schema") or {}
            self._custom.add((resource.group, resource.plural))
            self._storage_versions.setdefault((resource.group, resource.plural), storage or "")

    @staticmethod
    def _crd_resources(crd: Body) -> dict[kmock.resource, tuple[kmock.ResourceInfo, Body]]:
        """The served resources of a CRD: their discovery info & the CRD's version entry."""
        spec, names = crd["spec"], crd["spec"]["names"]
        result = {}
        for version in spec["versions"]:
            if version.get("served", True):
                subresources = version.get("subresources") or {}
                info = kmock.ResourceInfo(
                    kind=names["kind"],
                    singular=names.get("singular") or names["kind"].lower(),
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    verbs=CRD_VERBS,
                    shortnames=names.get("shortNames") or [],
                    categories=names.get("categories") or [],
                    subresources=[s for s in ("status", "scale") if s in subresources],
                )
                resource = kmock.resource(spec["group"], version["name"], names["plural"])
                result[resource] = (info, version)
        return result

    def load_crds(self, path: str | os.PathLike[str]) -> list[Body]:
        """Create/update the CRDs from a YAML file, or from all ``*.yaml``/``*.yml`` in a dir."""
        path = pathlib.Path(path)
        files = sorted([*path.glob("*.yaml"), *path.glob("*.yml")]) if path.is_dir() else [path]
        loaded = []
        for file in files:
            for doc in yaml.safe_load_all(file.read_text()):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    loaded.append(self.apply(doc))
        return loaded
