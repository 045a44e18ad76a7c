"""Placement at admission, end to end: the operator's kopf webhook over HTTPS, called by the
emulated API server as kube-apiserver calls it (``support/admission.py``: AdmissionReview v1,
the JSONPatch applied, ``failurePolicy`` and ``timeoutSeconds`` honoured), with real kubectl
creating annotated JobSets in an opted-in namespace and reading the mutated objects back."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
import structlog
import structlog.testing

from operator_support import apply, manifest, operator_cluster, status_of
from placement_support import OPT_IN, PLAN, jobset, webhook_configurations
from shardmeter_operator.admission.placement import (
    ADMITTED_LABEL,
    PLACED_ANNOTATION,
    WORKLOAD_KIND_LABEL,
    WORKLOAD_NAME_LABEL,
)
from shardmeter_operator.render.labels import PLAN_LABEL
from support.admission import Admission, ca_bundle, self_signed_certificate
from support.cluster import EmulatedCluster
from support.realkube.processes import free_port

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
NS = "team-a"
POOL_A = manifest("gpupool-cluster-a.yaml")
POOL_B = manifest("gpupool-cluster-b.yaml")


async def wait_listening(port: int, timeout_s: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)
        else:
            writer.close()
            await writer.wait_closed()
            return


async def placing_cluster(tmp_path: Path, **config: Any) -> Any:
    crt, _ = self_signed_certificate(tmp_path / "certs", ["127.0.0.1"])
    port = free_port()
    cm = operator_cluster(
        tmp_path,
        jobset=True,
        admission_port=port,
        admission_cert_dir=str(tmp_path / "certs"),
        **config,
    )
    return cm, port, ca_bundle(crt)


async def setup(cluster: EmulatedCluster, port: int, ca: str, **hooks: Any) -> Admission:
    """Opted-in and other namespaces, the two pools, the webhook configurations (``ca``
    empty: without caBundle, which the operator sets with ``admission_inject_ca``)."""
    admission = Admission.install(cluster.emulator)
    namespaces = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": OPT_IN}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere"}},
    ]
    await apply(cluster, *namespaces, POOL_A, POOL_B)
    await apply(cluster, *webhook_configurations(f"https://127.0.0.1:{port}", ca=ca, **hooks))
    await wait_listening(port)
    await cluster.wait_for(lambda: len(cluster.list("gpupools")) == 2)
    return admission


async def create(cluster: EmulatedCluster, body: dict[str, Any]) -> Any:
    return await cluster.kubectl("create", "-f", "-", input=json.dumps(body), check=False)


async def test_an_annotated_jobset_is_placed_as_a_launched_plan_renders_it(
    tmp_path: Path,
) -> None:
    cm, port, ca = await placing_cluster(tmp_path, admission_inject_ca="shardmeter")
    async with cm as cluster:
        admission = await setup(cluster, port, "")  # the operator sets the caBundle
        await cluster.wait_for(
            lambda: all(
                h["clientConfig"].get("caBundle") == ca
                for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
                for h in (cluster.get(kind, None, "shardmeter") or {}).get("webhooks", [{}])
            )
        )
        done = await create(cluster, jobset("llama"))
        assert done.returncode == 0, done.stderr
        got = json.loads(
            (await cluster.kubectl("get", "jobset", "llama", "-n", NS, "-o", "json")).stdout
        )
        meta, spec = got["metadata"], got["spec"]
        # the plan's shape: 8 islands of 1 node × 8 H200, one replicated Job (one shape)
        assert meta["annotations"][PLACED_ANNOTATION] == "8×1×8 H200"
        assert meta["labels"]["team"] == "llm" and meta["labels"][ADMITTED_LABEL] == "true"
        assert meta["labels"][PLAN_LABEL] == "llama"
        (group,) = spec["replicatedJobs"]
        assert (group["name"], group["replicas"]) == ("g0", 8)
        job = group["template"]["spec"]
        assert job["parallelism"] == job["completions"] == 1
        pod = job["template"]["spec"]
        assert pod["nodeSelector"] == POOL_A["spec"]["nodeSelector"]
        assert pod["tolerations"] == POOL_A["spec"]["tolerations"]
        (trainer,) = pod["containers"]
        assert str(trainer["resources"]["limits"]["nvidia.com/gpu"]) == "8"
        env = {e["name"] for e in trainer["env"]}
        assert {"SHARDMETER_ISLAND_ID", "TORCHFT_LIGHTHOUSE"} <= env
        assert "--fault_tolerance.semi_sync_method=diloco" in trainer["args"]
        # one review each way, in bounded time
        calls = [(r.webhook, bool(r.response and r.response["allowed"])) for r in admission.reviews]
        assert calls == [("place-jobset.shardmeter.io", True), ("check-jobset.shardmeter.io", True)]

        # the decision is a TrainingPlan owned by the workload, linked both ways, planned by
        # the operator to the same plan; the lighthouse the islands join, owned likewise
        status = await status_of(
            cluster, "trainingplans", NS, "llama", lambda s: s.get("phase") == "Planned"
        )
        assert status["plan"] == "8×1×8 H200"
        plan = cluster.get("trainingplans", NS, "llama")
        assert plan is not None
        assert plan["metadata"]["labels"] == {
            WORKLOAD_KIND_LABEL: "JobSet",
            WORKLOAD_NAME_LABEL: "llama",
        }
        (owner,) = plan["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("JobSet", meta["uid"])
        assert plan["spec"]["launch"] is False
        (lighthouse,) = cluster.list("deployments", NS)
        assert lighthouse["metadata"]["ownerReferences"][0]["uid"] == meta["uid"]

        # exactly as a launched TrainingPlan of that name renders its JobSet (one renderer)
        launched = copy.deepcopy(PLAN)
        launched["metadata"] = {"name": "llama", "namespace": "default"}
        launched["spec"].update(launch=True, workload="JobSet", pools=[{"name": "cluster-a"}])
        await apply(cluster, launched)
        await status_of(
            cluster, "trainingplans", "default", "llama", lambda s: s.get("phase") == "Launched"
        )
        ours = cluster.get("jobsets", "default", "llama")
        assert ours is not None
        uid, rev = (
            meta["labels"]["shardmeter.io/trainingplan-uid"],
            meta["labels"]["shardmeter.io/plan-revision"],
        )
        their = ours["metadata"]["labels"]
        text = json.dumps(spec).replace(uid, their["shardmeter.io/trainingplan-uid"])
        text = text.replace(rev, their["shardmeter.io/plan-revision"]).replace(f"{NS}", "default")
        # the launched plan's template carries its objective and tokens the same way
        assert json.loads(text) == ours["spec"]


async def test_what_cannot_run_is_denied_naming_the_annotation(tmp_path: Path) -> None:
    cm, port, ca = await placing_cluster(tmp_path)
    async with cm as cluster:
        await setup(cluster, port, ca)
        small = copy.deepcopy(POOL_A)  # 2 nodes at site-a: the plan needs site-b's too
        small["metadata"]["name"], small["spec"]["nodes"] = "small-a", 2
        await apply(cluster, small)
        await cluster.wait_for(lambda: len(cluster.list("gpupools")) == 3)
        cases = {
            "bad-tokens": ({"shardmeter.io/total-tokens": "lots"}, "shardmeter.io/total-tokens"),
            "no-memory": (
                {
                    "shardmeter.io/model": "llama-3.1-70b",
                    "shardmeter.io/pools": "cluster-b",
                    "shardmeter.io/activation-checkpointing": "none",
                },
                "does not fit",
            ),
            "tiny-batch": (
                {"shardmeter.io/global-batch-tokens": "8192"},
                "shardmeter.io/global-batch-tokens",
            ),
            "two-sites": (
                {"shardmeter.io/pools": "small-a,cluster-b", "shardmeter.io/objective": "min-time"},
                "needs 2 sites (site-a, site-b)",
            ),
            "no-pool": ({"shardmeter.io/pools": "nope"}, "shardmeter.io/pools"),
        }
        for name, (annotations, named) in cases.items():
            done = await create(cluster, jobset(name, **annotations))
            assert done.returncode != 0, name
            assert (
                'admission webhook "place-jobset.shardmeter.io" denied the request' in done.stderr
            )
            assert named in done.stderr, (name, done.stderr)
            assert cluster.get("jobsets", NS, name) is None
        # outside the opted-in namespaces, or opted out: stored as submitted
        for body in (
            jobset("as-is", "elsewhere"),
            jobset("off", **{"shardmeter.io/placement": "off"}),
        ):
            done = await create(cluster, body)
            assert done.returncode == 0, done.stderr
            stored = cluster.get("jobsets", body["metadata"]["namespace"], body["metadata"]["name"])
            assert stored is not None
            assert [r["name"] for r in stored["spec"]["replicatedJobs"]] == ["trainer"]
        assert cluster.list("trainingplans") == []


async def test_a_denial_is_logged_at_info_with_its_reason_not_as_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A denial is an expected outcome: one INFO line with the handler, the object and the
    reason; kopf's ERROR line for the AdmissionError ("failed permanently") is dropped."""
    cm, port, ca = await placing_cluster(tmp_path)
    async with cm as cluster:
        await setup(cluster, port, ca)
        caplog.clear()
        with structlog.testing.capture_logs() as logs:
            done = await create(cluster, jobset("bad", **{"shardmeter.io/total-tokens": "lots"}))
        assert done.returncode != 0 and "shardmeter.io/total-tokens" in done.stderr
        (denied,) = [e for e in logs if e["event"] == "admission denied"]
        assert denied["log_level"] == "info"
        assert (denied["handler"], denied["obj"]) == ("place-jobset", f"JobSet {NS}/bad")
        assert "shardmeter.io/total-tokens" in denied["reason"]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
            r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
        ]


async def test_out_of_time_fails_open_or_closed_as_configured(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for failure in ("closed", "open"):
        cm, port, ca = await placing_cluster(
            tmp_path / failure, admission_timeout_s=0.001, admission_failure=failure
        )
        async with cm as cluster:
            admission = await setup(cluster, port, ca)
            done = await create(cluster, jobset("llama"))
            stored = cluster.get("jobsets", NS, "llama")
            if failure == "closed":
                assert done.returncode != 0 and "did not decide within 0.001 s" in done.stderr
                assert stored is None
                # failing closed is the operator's failure, not a denial: still an ERROR
                assert [
                    r
                    for r in caplog.records
                    if r.levelno == logging.ERROR and "did not decide" in r.getMessage()
                ]
            else:
                assert done.returncode == 0, done.stderr
                placing = admission.reviews[0]
                assert placing.response is not None
                assert "admitted unplaced" in " ".join(placing.response.get("warnings") or [])
                assert (
                    stored is not None
                    and PLACED_ANNOTATION not in stored["metadata"]["annotations"]
                )


async def test_the_self_signed_certificate_names_the_service_and_loads_with_its_password(
    tmp_path: Path,
) -> None:
    """What the chart's self-signed path asks for (``--admission-host``, the Service's DNS
    name, plus its short name; kopf adds the listening address, 0.0.0.0, never certified)."""
    from cryptography import x509

    from shardmeter_operator.admission.webhook import self_signed_certificate as build

    host = "sm-shardmeter-webhook.shardmeter-system.svc"
    cert_pem, key_pem = build([host, "0.0.0.0", "sm-shardmeter-webhook", host], "secret")
    cert = x509.load_pem_x509_certificate(cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [host, "sm-shardmeter-webhook"]
    assert sans.get_values_for_type(x509.IPAddress) == []
    assert cert.subject.rfc4514_string() == f"CN={host}"
    assert b"ENCRYPTED PRIVATE KEY" in key_pem
    (tmp_path / "c.pem").write_bytes(cert_pem)
    (tmp_path / "k.pem").write_bytes(key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem", "secret")
    with pytest.raises(ssl.SSLError):
        context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem", "wrong")
    with pytest.raises(ValueError, match="no host name"):
        build(["0.0.0.0"])


async def review_update(
    admission: Admission, cluster: EmulatedCluster, old: dict[str, Any], new: dict[str, Any]
) -> dict[str, Any]:
    """The validating webhook's answer to an UPDATE, sent as kube-apiserver sends it (the
    emulated admission calls webhooks on creates only)."""
    config = cluster.get("validatingwebhookconfigurations", None, "shardmeter")
    assert config is not None
    (hook,) = [h for h in config["webhooks"] if h["name"] == "check-jobset.shardmeter.io"]
    assert "UPDATE" in hook["rules"][0]["operations"]
    meta = new["metadata"]
    group = {"group": "jobset.x-k8s.io", "version": "v1alpha2"}
    request = {
        "uid": f"update-{meta['name']}-{len(admission.reviews)}",
        "kind": {**group, "kind": "JobSet"},
        "resource": {**group, "resource": "jobsets"},
        "requestKind": {**group, "kind": "JobSet"},
        "requestResource": {**group, "resource": "jobsets"},
        "name": meta["name"],
        "namespace": meta["namespace"],
        "operation": "UPDATE",
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
        "object": new,
        "oldObject": old,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"},
    }
    return await admission._post(hook, request)


async def test_an_admitted_workloads_placement_cannot_change_on_update(tmp_path: Path) -> None:
    """UPDATE: the placement record of an admitted JobSet (its shardmeter.io labels and
    annotations) is fixed — changing, adding or removing one is denied naming it; other
    edits pass; a JobSet stored unplaced that opts in later is allowed with a warning."""
    cm, port, ca = await placing_cluster(tmp_path)
    async with cm as cluster:
        admission = await setup(cluster, port, ca)
        done = await create(cluster, jobset("llama"))
        assert done.returncode == 0, done.stderr
        stored = cluster.get("jobsets", NS, "llama")
        assert stored is not None and stored["metadata"]["labels"][ADMITTED_LABEL] == "true"

        def edited(**changes: str | None) -> dict[str, Any]:
            new = copy.deepcopy(stored)
            for key, value in changes.items():
                part, _, name = key.partition(":")
                values = new["metadata"].setdefault(part, {})
                if value is None:
                    values.pop(name, None)
                else:
                    values[name] = value
            return new

        refused = {
            "annotations:shardmeter.io/total-tokens": "1e12",  # the request
            "annotations:shardmeter.io/placed": "1×1×8 H200",  # the decision
            "annotations:shardmeter.io/pools": "cluster-b",  # a request key not given before
            "annotations:shardmeter.io/placement": None,  # opting out after admission
            f"labels:{PLAN_LABEL}": "another-plan",
        }
        for key, value in refused.items():
            answer = await review_update(admission, cluster, stored, edited(**{key: value}))
            assert answer["allowed"] is False, key
            message = answer["status"]["message"]
            part, _, name = key.partition(":")
            assert f"metadata.{part}[{name}]" in message, message
            assert "delete and re-create" in message
        answer = await review_update(
            admission, cluster, stored, edited(**{"labels:team": "vision", "annotations:x": "y"})
        )
        assert answer["allowed"] is True and not answer.get("warnings")

        # stored unplaced (outside an opted-in namespace at the time), opted in by an update
        plain = jobset("plain", **{"shardmeter.io/placement": "off"})
        done = await create(cluster, plain)
        assert done.returncode == 0, done.stderr
        before = cluster.get("jobsets", NS, "plain")
        assert before is not None and ADMITTED_LABEL not in before["metadata"]["labels"]
        after = copy.deepcopy(before)
        after["metadata"]["annotations"]["shardmeter.io/placement"] = "auto"
        answer = await review_update(admission, cluster, before, after)
        assert answer["allowed"] is True
        assert "placement happens when a workload is created" in " ".join(answer["warnings"])
