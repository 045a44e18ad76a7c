"""Errors as Kubernetes ``Status`` objects: raised as ``kmock.KubernetesError``, sent as JSON."""

from typing import Any

import aiohttp.web
import kmock


def api_error(code: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    """An exception rendered as a Kubernetes ``Status`` object (see ``KubeEmulator.__call__``)."""
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details)


def object_error(
    code: int, reason: str, message: str, resource: kmock.resource, name: str
) -> kmock.KubernetesError:
    """An error about an object: the message starts with ``plural.group "name"``."""
    what = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
    message = message.format(what=f'{what} "{name}"')
    return api_error(code, reason, message, name=name, group=resource.group, kind=resource.plural)


def not_found(resource: kmock.resource, name: str) -> kmock.KubernetesError:
    return object_error(404, "NotFound", "{what} not found", resource, name)


def status_response(error: kmock.KubernetesError) -> aiohttp.web.Response:
    """The HTTP response with the ``Status`` body of an error."""
    return aiohttp.web.json_response(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": error.message,
            "reason": error.reason,
            "details": error.details or {},
            "code": error.status,
        },
        status=error.status,
    )
