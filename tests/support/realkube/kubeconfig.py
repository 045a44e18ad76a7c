"""kubeconfig files for the real control planes: a client certificate or a bearer token,
verified against the plane's CA (everything embedded, so a file is self-contained)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(
    server: str,
    ca_pem: bytes,
    *,
    name: str = "kube",
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> dict[str, object]:
    user: dict[str, str] = {}
    if cert_pem is not None and key_pem is not None:
        user = {"client-certificate-data": _b64(cert_pem), "client-key-data": _b64(key_pem)}
    if token is not None:
        user["token"] = token
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}
        ],
        "current-context": name,
    }


def write(path: Path, config: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
