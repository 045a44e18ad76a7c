"""A small blocking REST client for the tests' own calls to a real API server: resources named
as the emulator's helpers name them (``"jobs"``, ``"batch/v1/jobs"``, ``"workloads.kueue.x-k8s.io"``,
a kind or a short name), resolved through aggregated discovery; objects as plain dicts."""

from __future__ import annotations

import base64
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

Body = dict[str, Any]
DISCOVERY_ACCEPT = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


class ApiError(RuntimeError):
    def __init__(self, status: int, body: Any, what: str) -> None:
        self.status, self.body = status, body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{what}: {status} {message}")


@dataclass(frozen=True)
class Resource:
    group_version: str
    plural: str
    kind: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
        return base + (f"/{sub}" if sub else "")


class KubeClient:
    """Blocking HTTPS calls with a kubeconfig's credentials (client certificate or token)."""

    def __init__(self, kubeconfig_path: Path) -> None:
        self.kubeconfig_path = Path(kubeconfig_path)
        config = yaml.safe_load(self.kubeconfig_path.read_text())
        context = next(
            c["context"] for c in config["contexts"] if c["name"] == config["current-context"]
        )
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        self.url: str = cluster["server"].rstrip("/")
        self._files = tempfile.TemporaryDirectory(prefix="kubeclient-")
        files = Path(self._files.name)
        ca = files / "ca.crt"
        ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        self.session = requests.Session()
        self.session.trust_env = False  # $REQUESTS_CA_BUNDLE would override `verify`
        self.session.verify = str(ca)
        if "client-certificate-data" in user:
            crt, key = files / "client.crt", files / "client.key"
            crt.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            self.session.cert = (str(crt), str(key))
        if "token" in user:
            self.session.headers["Authorization"] = f"Bearer {user['token']}"
        self._resources: dict[str, Resource] = {}

    def close(self) -> None:
        self.session.close()
        self._files.cleanup()

    # ---- raw calls ------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> tuple[int, Any]:
        """(status, parsed JSON body or text)."""
        data = None if body is None else json.dumps(body)
        response = self.session.request(
            method,
            self.url + path,
            data=data,
            params=params,
            headers={"Content-Type": content_type, **(headers or {})},
            timeout=timeout,
        )
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        """Like :meth:`request`, raising :class:`ApiError` unless 2xx."""
        status, answer = self.request(method, path, body, **kwargs)
        if not 200 <= status < 300:
            raise ApiError(status, answer, f"{method} {path}")
        return answer

    # ---- discovery ------------------------------------------------------------------------
    def _discover(self) -> None:
        """Every served resource by its names; an unqualified name means the core group's,
        else the first group's that serves it (kube-apiserver lists groups by priority), in
        the group's preferred (first) version."""
        found: dict[str, Resource] = {}
        for root in ("/api", "/apis"):
            listing = self.call("GET", root, headers={"Accept": DISCOVERY_ACCEPT})
            for group in listing.get("items", []):
                name = group["metadata"].get("name", "")
                for version in group.get("versions", []):
                    gv = f"{name}/{version['version']}" if name else version["version"]
                    for res in version.get("resources", []):
                        info = Resource(
                            gv,
                            res["resource"],
                            res.get("responseKind", {}).get("kind", ""),
                            res.get("scope") == "Namespaced",
                        )
                        found[f"{gv}/{info.plural}"] = info
                        names = [info.plural, info.kind.lower(), *res.get("shortNames", [])]
                        if name:
                            names.append(f"{info.plural}.{name}")
                        for key in names:
                            found.setdefault(key, info)
        self._resources = found

    def resource(self, name: str) -> Resource:
        key = name if "/" in name or "." in name else name.lower()
        if key not in self._resources:
            self._discover()
        if key not in self._resources:
            raise KeyError(f"{name!r} is not served by {self.url}")
        return self._resources[key]

    # ---- objects --------------------------------------------------------------------------
    def get(self, resource: str, namespace: str | None, name: str) -> Body | None:
        status, body = self.request("GET", self.resource(resource).path(namespace, name))
        if status == 404:
            return None
        if status != 200:
            raise ApiError(status, body, f"GET {resource} {namespace}/{name}")
        return dict(body)

    def list(
        self, resource: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[Body]:
        params = {"labelSelector": label_selector} if label_selector else None
        items = self.call("GET", self.resource(resource).path(namespace), params=params)["items"]
        return [dict(i) for i in items]

    def _info(self, body: Body) -> Resource:
        api_version, kind = body["apiVersion"], body["kind"]
        group = api_version.rpartition("/")[0]
        self.resource(kind.lower())  # discovery up to date
        for info in self._resources.values():
            if info.group_version == api_version and info.kind == kind:
                return info
        self._discover()
        for info in self._resources.values():
            if info.group_version == api_version and info.kind == kind:
                return info
        raise KeyError(f"{kind} of {api_version or group} is not served by {self.url}")

    def create(self, body: Body, *, dry_run: bool = False, **params: str) -> Body:
        info = self._info(body)
        if dry_run:
            params["dryRun"] = "All"
        namespace = body["metadata"].get("namespace", "default") if info.namespaced else None
        return dict(self.call("POST", info.path(namespace), body, params=params or None))

    def patch(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str = "",
        content_type: str = "application/merge-patch+json",
    ) -> Body:
        path = self.resource(resource).path(namespace, name, subresource)
        return dict(self.call("PATCH", path, patch, content_type=content_type))

    def apply(self, body: Body) -> Body:
        """Create, or merge-patch what exists (``status`` through the status subresource)."""
        info = self._info(body)
        meta = body["metadata"]
        namespace = meta.get("namespace", "default") if info.namespaced else None
        status, answer = self.request("POST", info.path(namespace), body)
        if status == 409:
            spec = {k: v for k, v in body.items() if k != "status"}
            answer = self.call(
                "PATCH",
                info.path(namespace, meta["name"]),
                spec,
                content_type="application/merge-patch+json",
            )
        elif not 200 <= status < 300:
            raise ApiError(status, answer, f"create {body['kind']} {meta['name']}")
        if "status" in body:
            answer = self.call(
                "PATCH",
                info.path(namespace, meta["name"], "status"),
                {"status": body["status"]},
                content_type="application/merge-patch+json",
            )
        return dict(answer)

    def delete(
        self, resource: str, namespace: str | None, name: str, propagation: str = "Background"
    ) -> bool:
        """Delete; False if it was not there."""
        status, body = self.request(
            "DELETE",
            self.resource(resource).path(namespace, name),
            {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation},
        )
        if status == 404:
            return False
        if not 200 <= status < 300:
            raise ApiError(status, body, f"DELETE {resource} {namespace}/{name}")
        return True
