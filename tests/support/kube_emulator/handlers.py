"""The HTTP side: the aiohttp entry point, request parsing, routing, the object API over HTTP."""

import contextlib
import json
import logging
from collections.abc import Mapping

import aiohttp.web
import kmock
import yaml
from kmock._internal import apps, enums, parsing, rendering

from support.kube_emulator.builtins import MAX_REQUEST_BODY_BYTES
from support.kube_emulator.errors import api_error, status_response
from support.kube_emulator.resources import Body, parse_api_path
from support.kube_emulator.tables import table

logger = logging.getLogger(__package__)  # "support.kube_emulator", as before the split


class HttpHandlers:
    """The request handling of :class:`~support.kube_emulator.KubeEmulator` (a mixin)."""

    __slots__ = ()

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """The aiohttp entry point. Like ``RawHandler.__call__``, but with our URL/body parser."""
        request = await self._parse_request(raw_request)
        self._requests.append(request)
        try:
            return await self._handle(request)
        except rendering.StreamingError as e:  # a stream of a user reaction failed mid-way
            raw_response: aiohttp.web.StreamResponse = e.args[0]
            with contextlib.suppress(ConnectionError):
                await self._stream_error(e.__cause__ or e, raw_response)
                await raw_response.write_eof()
            return raw_response
        except kmock.KubernetesError as e:
            return status_response(e)
        except Exception as e:
            logger.exception("The emulator failed on %s %s", request.method.value, request.url)
            self.failures.append(e)
            if self._errors:
                self._errors[-1].append(e)  # kmock's strict mode re-raises it at exit
            return status_response(api_error(500, "InternalError", repr(e)))

    async def _parse_request(self, raw_request: aiohttp.web.BaseRequest) -> kmock.Request:
        # Not raw_request.read(): aiohttp caps that at 1 MiB, kube-apiserver at 3 MiB (413 later).
        body = await raw_request.content.read()
        raw_request._read_bytes = body  # what aiohttp's read() caches, for later readers
        text = body.decode("utf-8", errors="replace")
        data = None
        if body:
            with contextlib.suppress(ValueError, yaml.YAMLError):  # garbage in: data is None
                is_yaml = "yaml" in raw_request.content_type  # server-side apply
                data = yaml.safe_load(text) if is_yaml else json.loads(text)
        k8s = parse_api_path(raw_request.path)
        method = enums.method(raw_request.method)
        resource = (
            None
            if k8s.group is None
            else kmock.resource(group=k8s.group, version=k8s.version, plural=k8s.plural)
        )
        return kmock.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=text,
            data=data,
            action=parsing.guess_k8s(k8s, method, dict(raw_request.query)),
            resource=resource,
            namespace=k8s.namespace,
            name=k8s.name,
            subresource=k8s.subresource,
        )

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # Discovery and anything non-API goes to kmock's DSL (incl. our overridden _serve_* hooks).
        # So do the API requests intercepted by user reactions. The rest is served by us directly;
        # note: the parent's _handle() is skipped deliberately — it mutates objects kmock-style.
        if request.url.path.startswith("/openapi/v3"):
            return await self._serve_openapi(request)
        if (
            request.resource is None
            or request.resource.plural is None
            or self._intercepted(request)
        ):
            return await apps.RawHandler._handle(self, request)
        return await self._serve_object_api(request)

    def _intercepted(self, request: kmock.Request) -> bool:
        """Whether a user-defined (non-fallback) reaction matches the request."""
        return any(
            not (payload.priorities and payload.priorities[0] == float("-inf"))
            and not payload._disabled.is_set()
            and request in payload._source
            for payload in self._payloads
        )

    # --- the object API over HTTP ---------------------------------------------------------------

    async def _serve_object_api(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        assert request.resource is not None
        resource, info = self.lookup(request.resource)
        namespace, name, sub = request.namespace, request.name, request.subresource
        params = request.params
        if (namespace is not None and not info.namespaced) or sub not in {None, *info.subresources}:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        if info.namespaced and name is not None and namespace is None:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        if sub == "log" and resource.plural == "pods" and request.method.value == "GET":
            assert namespace is not None and name is not None
            return await self._serve_pod_log(namespace, name, dict(params))
        if sub not in {None, "status"}:
            raise api_error(405, "MethodNotAllowed", f"subresource {sub!r} is not emulated")
        if request.headers.get("Content-Type", "").startswith(
            "application/vnd.kubernetes.protobuf"
        ):
            raise api_error(
                415,
                "UnsupportedMediaType",
                "protobuf is not emulated; send JSON (e.g. kubectl create --dry-run=client "
                "-o yaml | kubectl apply -f -)",
            )
        method, dry_run = request.method.value, "dryRun" in params
        validation = params.get("fieldValidation")
        if len(request.body or b"") > MAX_REQUEST_BODY_BYTES:
            raise api_error(413, "RequestEntityTooLarge", "the request body is larger than 3 MiB")
        data = request.data if isinstance(request.data, dict) else None
        if method in {"POST", "PUT"} and data is None:
            raise api_error(400, "BadRequest", "the request body must be a JSON/YAML object")

        status, result = 200, None
        if method == "GET" and params.get("watch") in {"true", "1"}:
            return await self._serve_watch_stream(request, resource, info)
        elif method == "GET" and name is None:
            result = self._list_body(resource, info, namespace, params)
        elif method == "GET":
            result = self.read(resource, namespace, name)
        elif method == "POST" and name is None:
            for admit in self.external_admission:  # dynamic admission (support/admission.py)
                data = await admit(resource, namespace, data or {}, dry_run)
            status, result = (
                201,
                self.create(
                    resource, namespace, data or {}, dry_run=dry_run, field_validation=validation
                ),
            )
        elif method == "PUT" and name is not None:
            result = self.replace(
                resource,
                namespace,
                name,
                data or {},
                subresource=sub,
                dry_run=dry_run,
                field_validation=validation,
            )
        elif method == "PATCH" and name is not None:
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            status, result = self.patch(
                resource,
                namespace,
                name,
                request.data,
                content_type,
                subresource=sub,
                dry_run=dry_run,
                field_validation=validation,
            )
        elif method == "DELETE":
            options = {**(data or {}), **{k: v for k, v in params.items() if k != "dryRun"}}
            if name is not None:
                result = self.delete(resource, namespace, name, options, dry_run=dry_run)
            else:
                result = self._list_body(resource, info, namespace, params)
                for obj in result["items"]:
                    meta = obj["metadata"]
                    self.delete(
                        resource, meta.get("namespace"), meta["name"], options, dry_run=dry_run
                    )
        else:
            raise api_error(405, "MethodNotAllowed", f"{method} is not supported here")

        if method == "GET" and "as=Table" in request.headers.get("Accept", ""):
            items = result["items"] if name is None else [result]
            columns = self._printer_columns.get(resource) or []
            include = params.get("includeObject", "Metadata")
            result = table(items, columns, include, self._rv)
        return aiohttp.web.json_response(result, status=status)

    def _list_body(
        self,
        resource: kmock.resource,
        info: kmock.ResourceInfo,
        namespace: str | None,
        params: Mapping[str, str],
    ) -> Body:
        objs = self.select(
            resource, namespace, params.get("labelSelector"), params.get("fieldSelector")
        )
        objs.sort(key=lambda obj: (obj["metadata"].get("namespace") or "", obj["metadata"]["name"]))
        rv, offset = self._rv, 0
        if params.get("continue"):
            try:
                rv, offset = (int(x) for x in params["continue"].split(":"))
            except ValueError:
                raise api_error(400, "BadRequest", "invalid continue token") from None
        limit = int(params.get("limit") or 0) or len(objs)
        chunk, rest = objs[offset : offset + limit], objs[offset + limit :]
        metadata: Body = {"resourceVersion": str(rv)}
        if rest:
            metadata.update({"continue": f"{rv}:{offset + limit}", "remainingItemCount": len(rest)})
        return {
            "kind": f"{info.kind}List",
            "apiVersion": self._api_version(resource),
            "metadata": metadata,
            "items": chunk,
        }
