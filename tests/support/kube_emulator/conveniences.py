"""The Python conveniences for tests: apply, get, simulate the Job controller, the request log."""

import kmock

from support.kube_emulator.errors import api_error
from support.kube_emulator.resources import JOBS, Body, now_iso


class Conveniences:
    """Helpers of :class:`~support.kube_emulator.KubeEmulator` for tests (a mixin)."""

    __slots__ = ()

    def resource_for(self, api_version: str, kind: str) -> kmock.resource:
        """The served resource for an ``apiVersion`` & ``kind`` (e.g. ``batch/v1``, ``Job``)."""
        group, _, version = api_version.rpartition("/")
        for resource, info in self._resources.items():
            if (resource.group, resource.version, info.kind) == (group, version, kind):
                return resource
        raise api_error(404, "NotFound", f'no matches for kind "{kind}" in version "{api_version}"')

    def apply(self, body: Body, resource: str | kmock.resource | None = None) -> Body:
        """Create the object, or merge-patch it if it exists (like a naive ``kubectl apply``)."""
        resource = (
            self.resolve(resource)
            if resource is not None
            else self.resource_for(body.get("apiVersion", "v1"), body.get("kind", ""))
        )
        meta = body.get("metadata") or {}
        return self.patch(
            resource, meta.get("namespace"), meta["name"], body, "application/apply-patch+yaml"
        )[1]

    def get_object(
        self, resource: str | kmock.resource, namespace: str | None, name: str
    ) -> Body | None:
        """The current state of an object, or None if absent."""
        try:
            return self.read(resource, namespace, name)
        except kmock.KubernetesError:
            return None

    def set_job_running(self, namespace: str, name: str) -> Body:
        """Simulate the Job controller: every pod of the Job is running and ready."""
        job = self.read(JOBS, namespace, name)
        pods = int((job.get("spec") or {}).get("parallelism") or 1)
        status = {**(job.get("status") or {}), "active": pods, "ready": pods}
        status.setdefault("startTime", now_iso())
        return self.patch(JOBS, namespace, name, {"status": status}, subresource="status")[1]

    def reject_job_pods(
        self,
        namespace: str,
        name: str,
        message: str = 'pods "x" is forbidden: exceeded quota: gpu-quota, requested: '
        "requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=0, limited: "
        "requests.nvidia.com/gpu=4",
    ) -> Body:
        """Simulate the Job controller failing to create pods (quota, PodSecurity admission):
        it posts a Warning ``FailedCreate`` Event on the Job and the Job stays without pods."""
        job = self.read(JOBS, namespace, name)
        now = now_iso()
        event = {
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "namespace": namespace,
                "uid": job["metadata"]["uid"],
            },
            "reason": "FailedCreate",
            "message": f"Error creating: {message}",
            "type": "Warning",
            "source": {"component": "job-controller"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        return self.create(kmock.resource("", "v1", "events"), namespace, event)

    def set_job_succeeded(self, namespace: str, name: str) -> Body:
        """Simulate the Job controller: mark a batch/v1 Job as complete (via /status)."""
        return self._finish_job(namespace, name, {"succeeded": 1}, {"type": "Complete"})

    def set_job_failed(
        self,
        namespace: str,
        name: str,
        reason: str = "BackoffLimitExceeded",
        message: str = "Job has reached the specified backoff limit",
    ) -> Body:
        """Simulate the Job controller: mark a batch/v1 Job as failed (via /status)."""
        condition = {"type": "Failed", "reason": reason, "message": message}
        return self._finish_job(namespace, name, {"failed": 1}, condition)

    def _finish_job(self, namespace: str, name: str, counts: Body, condition: Body) -> Body:
        now = now_iso()
        status = self.read(JOBS, namespace, name).get("status") or {}
        condition = {**condition, "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
        conditions = [c for c in status.get("conditions") or [] if c["type"] != condition["type"]]
        new_status = {"active": 0, "startTime": status.get("startTime", now), **counts}
        new_status["conditions"] = [*conditions, condition]
        if condition["type"] == "Complete":
            new_status["completionTime"] = now
        return self.patch(JOBS, namespace, name, {"status": new_status}, subresource="status")[1]

    def api_requests(
        self,
        method: str | None = None,
        resource: str | kmock.resource | None = None,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> list[kmock.Request]:
        """The logged API requests, filtered (e.g. ``api_requests('PUT', 'jobs')``)."""
        if resource is None:
            plural, group = None, None
        elif isinstance(resource, kmock.resource):
            plural, group = resource.plural, resource.group
        else:
            try:  # also served under other names: shortnames, kinds, other versions
                plural, group = (served := self.resolve(resource)).plural, served.group
            except kmock.KubernetesError:  # e.g. the CRD does not exist (yet)
                plural, _, group = resource.partition(".")
        return [
            req
            for req in self._requests
            if method is None or req.method.value == method.upper()
            if plural is None or (req.resource is not None and req.resource.plural == plural)
            if not group or (req.resource is not None and req.resource.group == group)
            if namespace is None or req.namespace == namespace
            if name is None or req.name == name
            if subresource is None or req.subresource == subresource
        ]
