"""The emulated API server's Job pods and ``pods/log``, through the real kubectl and the
kubernetes client: the Job controller's labels, kube-apiserver's parameters and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardmeter_operator.k8s.client import Kube, LogUnavailableError, load_configuration
from support.cluster import running_emulator

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "island", "namespace": "default"},
    "spec": {
        "completionMode": "Indexed",
        "completions": 2,
        "parallelism": 2,
        "template": {
            "metadata": {"labels": {"app": "train"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {"name": "trainer", "image": "t"},
                    {"name": "sidecar", "image": "s"},
                ],
            },
        },
    },
}
LOG = "".join(f"line {i}\n" for i in range(10))


async def test_job_pods_and_their_logs(tmp_path: Path) -> None:
    async with running_emulator(tmp_path=tmp_path) as cluster:
        cluster.apply(JOB)
        pod = cluster.create_job_pod("default", "island", 0)
        name = pod["metadata"]["name"]
        labels, meta = pod["metadata"]["labels"], pod["metadata"]
        assert labels["batch.kubernetes.io/job-name"] == "island" and labels["app"] == "train"
        assert meta["annotations"]["batch.kubernetes.io/job-completion-index"] == "0"
        assert meta["ownerReferences"][0]["kind"] == "Job" and pod["spec"]["hostname"] == "island-0"
        assert pod["status"]["phase"] == "Running"
        cluster.set_pod_log("default", name, LOG)

        out = await cluster.kubectl("logs", name, "-c", "trainer", "--tail=3")
        assert out.stdout == "line 7\nline 8\nline 9\n"
        out = await cluster.kubectl("logs", name, "-c", "trainer", "--limit-bytes=9")
        assert out.stdout == "line 0\nli"
        status, body = await cluster.api("GET", f"/api/v1/namespaces/default/pods/{name}/log")
        assert status == 400 and "a container name must be specified" in body["message"]
        refused = await cluster.kubectl("logs", name, "-c", "trainer", "--previous", check=False)
        assert "previous terminated container" in refused.stderr

        kube = Kube(load_configuration(str(cluster.kubeconfig_path)))
        try:
            assert await kube.pod_log(
                "default", name, "trainer", tail_lines=2, limit_bytes=100
            ) == ("line 8\nline 9\n")
            assert await kube.pod_log("default", name, "sidecar", tail_lines=2, limit_bytes=9) == ""
            pending = cluster.create_job_pod("default", "island", 1, phase="Pending")
            for pod_name, container, status, text in [
                ("gone", "trainer", 404, 'pods "gone" not found'),
                (name, "nope", 400, "container nope is not valid"),
                (
                    pending["metadata"]["name"],
                    "trainer",
                    400,
                    "waiting to start: ContainerCreating",
                ),
            ]:
                with pytest.raises(LogUnavailableError, match=text) as info:
                    await kube.pod_log("default", pod_name, container, tail_lines=5, limit_bytes=99)
                assert info.value.status == status
            pods = await kube.list("v1", "Pod", "default", "batch.kubernetes.io/job-name=island")
            assert len(pods) == 2
            status, _ = await cluster.api("POST", f"/api/v1/namespaces/default/pods/{name}/log")
            assert status == 405  # only GET is served on pods/log
        finally:
            kube.close()
