"""``/openapi/v3``: enough of the OpenAPI v3 documents for ``kubectl apply`` with its default
``--validate=strict``. kubectl looks for the ``fieldValidation`` parameter on the PATCH
operation of the object's group-version-kind; finding it, it sends ``fieldValidation=Strict``
and leaves validation to the server (:meth:`KubeEmulator._admit`). The documents list the
served resources' operations (no component schemas: kubectl then builds strategic merge
patches from its compiled-in types, as it does without OpenAPI)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import aiohttp.web
import kmock

from support.kube_emulator.errors import api_error
from support.kube_emulator.resources import Body

_PARAMETERS = [
    {"name": name, "in": "query", "schema": {"type": "string"}, "uniqueItems": True}
    for name in ("dryRun", "fieldManager", "fieldValidation")
]


class OpenAPI:
    """The OpenAPI v3 endpoints of :class:`~support.kube_emulator.KubeEmulator` (a mixin)."""

    __slots__ = ()

    def _openapi_documents(self) -> dict[str, Body]:
        documents: dict[str, Body] = {}
        for resource, info in self._resources.items():
            group, version = resource.group or "", resource.version or ""
            key = f"apis/{group}/{version}" if group else f"api/{version}"
            doc = documents.setdefault(
                key,
                {
                    "openapi": "3.0.0",
                    "info": {"title": "Kubernetes (emulated)", "version": "v1.32.0"},
                    "paths": {},
                },
            )
            gvk = {"group": group, "version": version, "kind": info.kind}
            scope = "/namespaces/{namespace}" if info.namespaced else ""
            base = f"/{key}{scope}/{resource.plural}"

            def operation(verb: str, gvk: Body = gvk) -> Body:
                return {
                    "operationId": f"{verb}{gvk['kind']}",
                    "parameters": _PARAMETERS,
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": verb,
                    "x-kubernetes-group-version-kind": gvk,
                }

            doc["paths"][base] = {"get": operation("list"), "post": operation("post")}
            doc["paths"][base + "/{name}"] = {
                "get": operation("get"),
                "put": operation("put"),
                "patch": operation("patch"),
                "delete": operation("delete"),
            }
        return documents

    async def _serve_openapi(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        documents = self._openapi_documents()
        path = request.url.path.removeprefix("/openapi/v3").strip("/")
        if not path:
            root: dict[str, Any] = {"paths": {}}
            for key, doc in sorted(documents.items()):
                digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
                root["paths"][key] = {
                    "serverRelativeURL": f"/openapi/v3/{key}?hash={digest[:32].upper()}"
                }
            return aiohttp.web.json_response(root)
        if path not in documents:
            raise api_error(404, "NotFound", f"no OpenAPI document for {path}")
        return aiohttp.web.json_response(documents[path])
