"""Tests of the emulated Kubernetes API server (tests/support/kube_emulator/) and its helpers."""

import asyncio
import json
import logging
import pathlib
import textwrap
from collections.abc import AsyncIterator
from typing import Any

import attrs
import kmock
import pytest
import pytest_asyncio
import yaml

from support.cluster import (
    EmulatedCluster,
    KubectlError,
    akubectl,
    current_kubeconfig,
    embedded_operator,
    emulator_login,
    emulator_subprocess,
    running_emulator,
)
from support.kube_emulator import (
    jsonpath,
    label_selector_matcher,
    parse_api_path,
    strategic_merge_patch,
)

GROUP = "test.shardmeter.io"
WIDGETS = f"/apis/{GROUP}/v1/namespaces/default/widgets"
CMS = "/api/v1/namespaces/default/configmaps"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def widget_crd(scope: str = "Namespaced", plural: str = "widgets", kind: str = "Widget") -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "shortNames": [plural[:2]],
                "categories": ["shardmeter"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {
                            "name": "Planned",
                            "type": "string",
                            "jsonPath": '.status.conditions[?(@.type=="Planned")].status',
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


def widget(name: str = "w1", size: int = 1, **extra: Any) -> dict:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size},
        **extra,
    }


@pytest_asyncio.fixture
async def cluster(tmp_path: pathlib.Path) -> AsyncIterator[EmulatedCluster]:
    async with running_emulator(tmp_path=tmp_path) as cluster:
        yield cluster
        assert not cluster.emulator.failures  # no internal errors (500s) in the emulator


@pytest_asyncio.fixture
async def widgets(cluster: EmulatedCluster) -> EmulatedCluster:
    status, _ = await cluster.api(
        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", widget_crd()
    )
    assert status == 201
    return cluster


# --- pure helpers ------------------------------------------------------------------------------


def test_path_parsing_includes_the_namespaces_resource() -> None:
    def parse(path: str) -> tuple[str | None, ...]:  # group, version, plural, ns, name, sub
        return attrs.astuple(parse_api_path(path))

    assert parse("/api/v1/namespaces") == ("", "v1", "namespaces", None, None, None)
    assert parse("/api/v1/namespaces/ns1") == ("", "v1", "namespaces", None, "ns1", None)
    assert parse("/api/v1/namespaces/ns1/status")[2:] == ("namespaces", None, "ns1", "status")
    assert parse("/apis/g/v1/namespaces/ns1/ws/w/status") == ("g", "v1", "ws", "ns1", "w", "status")
    assert parse("/apis/g/v1/ws") == ("g", "v1", "ws", None, None, None)
    assert parse("/apis/g") == ("g", None, None, None, None, None)


def test_label_selectors_and_jsonpath_and_strategic_merge() -> None:
    labels = {"a": "b", "e": "x", "f": ""}
    assert label_selector_matcher("a=b,c!=d,e in (x,y),f")(labels)
    assert label_selector_matcher("a==b,!g,e notin (y)")(labels)
    assert not label_selector_matcher("a=b,e in (y,z)")(labels)
    assert not label_selector_matcher("g")(labels)
    obj = {
        "status": {
            "conditions": [{"type": "A", "status": "False"}, {"type": "Planned", "status": "True"}]
        }
    }
    assert jsonpath(obj, '.status.conditions[?(@.type=="Planned")].status') == ["True"]
    assert jsonpath(obj, "{.status.conditions[0].type}") == ["A"]
    assert jsonpath(obj, ".status.conditions[*].type") == ["A", "Planned"]
    assert jsonpath(obj, ".spec.missing") == []
    old = {
        "containers": [
            {"name": "a", "image": "x", "env": [{"name": "K", "value": "1"}]},
            {"name": "b", "image": "y"},
        ],
        "args": ["1", "2"],
    }
    patch = {
        "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
        "containers": [
            {"name": "a", "env": [{"name": "L", "value": "2"}]},
            {"name": "b", "$patch": "delete"},
        ],
        "args": ["3"],
    }
    assert strategic_merge_patch(old, patch) == {
        "containers": [
            {
                "name": "a",
                "image": "x",
                "env": [{"name": "K", "value": "1"}, {"name": "L", "value": "2"}],
            }
        ],
        "args": ["3"],
    }


# --- discovery ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_discovery_of_builtins(cluster: EmulatedCluster) -> None:
    status, core = await cluster.api("GET", "/api/v1")
    assert status == 200 and core["groupVersion"] == "v1"
    names = {r["name"]: r for r in core["resources"]}
    assert names["configmaps"]["namespaced"] and names["configmaps"]["kind"] == "ConfigMap"
    assert not names["namespaces"]["namespaced"] and "namespaces/status" in names
    _, batch = await cluster.api("GET", "/apis/batch/v1")
    assert {"jobs", "jobs/status"} <= {r["name"] for r in batch["resources"]}
    _, groups = await cluster.api("GET", "/apis")
    assert {"batch", "events.k8s.io", "apiextensions.k8s.io"} <= {
        g["name"] for g in groups["groups"]
    }
    status, namespaces = await cluster.api("GET", "/api/v1/namespaces")
    assert status == 200 and namespaces["kind"] == "NamespaceList"
    assert "default" in {ns["metadata"]["name"] for ns in namespaces["items"]}
    status, body = await cluster.api("GET", "/openapi/v2")
    assert status == 404 and body["kind"] == "Status"
    status, body = await cluster.api("GET", "/apis/nonexistent.io/v1/things")
    assert status == 404 and body["reason"] == "NotFound"


@pytest.mark.asyncio
async def test_crd_registers_resources_in_discovery(widgets: EmulatedCluster) -> None:
    cluster = widgets
    _, groups = await cluster.api("GET", "/apis")
    group = next(g for g in groups["groups"] if g["name"] == GROUP)
    assert group["preferredVersion"]["version"] == "v1"
    _, g = await cluster.api("GET", f"/apis/{GROUP}")
    assert g["kind"] == "APIGroup" and g["versions"][0]["groupVersion"] == f"{GROUP}/v1"
    _, resources = await cluster.api("GET", f"/apis/{GROUP}/v1")
    by_name = {r["name"]: r for r in resources["resources"]}
    assert by_name["widgets"] | {"verbs": None} == {
        "name": "widgets",
        "kind": "Widget",
        "singularName": "widget",
        "namespaced": True,
        "shortNames": ["wi"],
        "categories": ["shardmeter"],
        "verbs": None,
    }
    assert {"watch", "list", "patch", "create"} <= set(by_name["widgets"]["verbs"])
    assert by_name["widgets/status"]["namespaced"] is True
    crd = cluster.get("customresourcedefinitions", None, f"widgets.{GROUP}")
    assert crd is not None
    assert {c["type"] for c in crd["status"]["conditions"]} == {"Established", "NamesAccepted"}

    status, _ = await cluster.api("POST", WIDGETS, widget())
    assert status == 201
    _, listing = await cluster.api("GET", WIDGETS)
    assert listing["kind"] == "WidgetList" and listing["apiVersion"] == f"{GROUP}/v1"

    # Deleting the CRD deletes its objects and unregisters the resource.
    status, _ = await cluster.api(
        "DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.{GROUP}"
    )
    assert status == 200
    status, _ = await cluster.api("GET", WIDGETS)
    assert status == 404
    status, _ = await cluster.api("GET", f"/apis/{GROUP}/v1")
    assert status == 404


@pytest.mark.asyncio
async def test_crd_versions_share_objects_and_schema_defaults_apply(
    cluster: EmulatedCluster,
) -> None:
    crd = widget_crd()
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "size": {"type": "integer", "default": 1},
                    "mode": {"type": "string", "default": "fast"},
                    "items": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"weight": {"type": "integer", "default": 5}},
                        },
                    },
                },
            },
        },
    }
    v1 = crd["spec"]["versions"][0]
    v1["schema"] = {"openAPIV3Schema": schema}
    crd["spec"]["versions"] = [v1, {**v1, "name": "v1alpha1", "storage": False}]
    await cluster.api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    _, groups = await cluster.api("GET", f"/apis/{GROUP}")
    assert [v["version"] for v in groups["versions"]] == ["v1", "v1alpha1"]  # by priority

    body = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"items": [{}, {"weight": 2}]},
    }
    status, w = await cluster.api(
        "POST", f"/apis/{GROUP}/v1alpha1/namespaces/default/widgets", body
    )
    assert status == 201 and w["apiVersion"] == f"{GROUP}/v1alpha1"
    assert w["spec"] == {"size": 1, "mode": "fast", "items": [{"weight": 5}, {"weight": 2}]}
    status, w = await cluster.api("GET", f"{WIDGETS}/w1")  # the same object via v1
    assert status == 200 and w["apiVersion"] == f"{GROUP}/v1"
    _, w = await cluster.api("PATCH", f"{WIDGETS}/w1", {"spec": {"mode": None}}, content_type=MERGE)
    assert w["spec"]["mode"] == "fast"  # defaulted again


@pytest.mark.asyncio
async def test_cluster_scoped_crd(cluster: EmulatedCluster) -> None:
    crd = widget_crd(scope="Cluster", plural="gadgets", kind="Gadget")
    status, _ = await cluster.api(
        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd
    )
    assert status == 201
    _, resources = await cluster.api("GET", f"/apis/{GROUP}/v1")
    assert resources["resources"][0]["namespaced"] is False
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Gadget",
        "metadata": {"name": "g1", "namespace": "ignored"},
        "spec": {},
    }
    status, obj = await cluster.api("POST", f"/apis/{GROUP}/v1/gadgets", body)
    assert status == 201 and "namespace" not in obj["metadata"]
    status, _ = await cluster.api("GET", f"/apis/{GROUP}/v1/namespaces/default/gadgets/g1")
    assert status == 404
    status, obj = await cluster.api("GET", f"/apis/{GROUP}/v1/gadgets/g1")
    assert status == 200 and obj["metadata"]["name"] == "g1"
    assert cluster.get("gadgets", None, "g1") is not None


# --- object semantics --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_create_assigns_identity_and_rejects_duplicates(cluster: EmulatedCluster) -> None:
    status, cm = await cluster.api("POST", CMS, {"metadata": {"name": "cm1"}, "data": {"a": "1"}})
    assert status == 201
    meta = cm["metadata"]
    assert meta["namespace"] == "default" and meta["generation"] == 1
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0
    assert (cm["apiVersion"], cm["kind"]) == ("v1", "ConfigMap")
    status, cm2 = await cluster.api("POST", CMS, {"metadata": {"name": "cm2"}})
    assert int(cm2["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert cm2["metadata"]["uid"] != meta["uid"]

    status, error = await cluster.api("POST", CMS, {"metadata": {"name": "cm1"}})
    assert status == 409
    assert error | {"message": None, "details": None} == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "reason": "AlreadyExists",
        "code": 409,
        "message": None,
        "details": None,
    }
    status, error = await cluster.api("GET", f"{CMS}/missing")
    assert (status, error["reason"], error["code"]) == (404, "NotFound", 404)
    assert error["details"]["name"] == "missing"
    status, error = await cluster.api("POST", CMS, {"metadata": {"generateName": "cm-"}})
    assert status == 201 and error["metadata"]["name"].startswith("cm-")


@pytest.mark.asyncio
async def test_generation_and_resource_version(widgets: EmulatedCluster) -> None:
    cluster = widgets
    _, w = await cluster.api("POST", WIDGETS, widget(status={"phase": "Ignored"}))
    assert "status" not in w  # the status cannot be set on creation
    rv = int(w["metadata"]["resourceVersion"])
    _, w = await cluster.api("PATCH", f"{WIDGETS}/w1", {"spec": {"size": 2}}, content_type=MERGE)
    assert w["metadata"]["generation"] == 2 and int(w["metadata"]["resourceVersion"]) > rv
    rv = int(w["metadata"]["resourceVersion"])
    _, w = await cluster.api(
        "PATCH", f"{WIDGETS}/w1", {"metadata": {"labels": {"a": "b"}}}, content_type=MERGE
    )
    assert w["metadata"]["generation"] == 2 and int(w["metadata"]["resourceVersion"]) > rv
    rv = int(w["metadata"]["resourceVersion"])
    _, w = await cluster.api(
        "PATCH", f"{WIDGETS}/w1/status", {"status": {"phase": "P"}}, content_type=MERGE
    )
    assert w["metadata"]["generation"] == 2 and w["status"] == {"phase": "P"}
    assert int(w["metadata"]["resourceVersion"]) > rv
    rv = int(w["metadata"]["resourceVersion"])
    # A no-op patch changes nothing, not even the resourceVersion.
    _, w = await cluster.api("PATCH", f"{WIDGETS}/w1", {"spec": {"size": 2}}, content_type=MERGE)
    assert int(w["metadata"]["resourceVersion"]) == rv
    # The resourceVersion is global: it grows across resources.
    _, cm = await cluster.api("POST", CMS, {"metadata": {"name": "cm1"}})
    assert int(cm["metadata"]["resourceVersion"]) > rv


@pytest.mark.asyncio
async def test_optimistic_concurrency_with_put_and_patch(cluster: EmulatedCluster) -> None:
    _, cm = await cluster.api("POST", CMS, {"metadata": {"name": "cm1"}, "data": {"a": "1"}})
    stale = cm["metadata"]["resourceVersion"]
    cm["data"] = {"a": "2"}
    status, cm = await cluster.api("PUT", f"{CMS}/cm1", cm)
    assert status == 200 and cm["data"] == {"a": "2"}
    cm["metadata"]["resourceVersion"] = stale
    status, error = await cluster.api("PUT", f"{CMS}/cm1", cm)
    assert (status, error["reason"]) == (409, "Conflict")
    status, error = await cluster.api(
        "PATCH",
        f"{CMS}/cm1",
        {"metadata": {"resourceVersion": stale}, "data": {"b": "1"}},
        content_type=MERGE,
    )
    assert (status, error["reason"]) == (409, "Conflict")
    status, cm = await cluster.api("PUT", f"{CMS}/cm1", {"metadata": {"name": "cm1"}, "data": {}})
    assert status == 200 and cm["data"] == {}  # no resourceVersion: an unconditional replace
    # kmock's object histories keep every stored version (the failed writes left none).
    history = cluster.emulator.objects["v1/configmaps", "default", "cm1"].history
    assert [version["data"] for version in history] == [{"a": "1"}, {"a": "2"}, {}]
    status, _ = await cluster.api("PUT", f"{CMS}/missing", {"metadata": {"name": "missing"}})
    assert status == 404


@pytest.mark.asyncio
async def test_json_patch_with_test_op(cluster: EmulatedCluster) -> None:
    _, cm = await cluster.api("POST", CMS, {"metadata": {"name": "cm1"}})
    rv = cm["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "stale"},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
    ]
    status, error = await cluster.api("PATCH", f"{CMS}/cm1", ops, content_type=JSON_PATCH)
    assert (status, error["kind"], error["code"]) == (422, "Status", 422)
    assert "finalizers" not in cluster.get("configmaps", "default", "cm1")["metadata"]
    ops[0]["value"] = rv
    status, cm = await cluster.api("PATCH", f"{CMS}/cm1", ops, content_type=JSON_PATCH)
    assert status == 200 and cm["metadata"]["finalizers"] == ["x/y"]
    status, _ = await cluster.api("PATCH", f"{CMS}/cm1", {"data": {}}, content_type="text/plain")
    assert status == 415


@pytest.mark.asyncio
async def test_strategic_merge_patch_and_server_side_apply(widgets: EmulatedCluster) -> None:
    cluster = widgets
    jobs = "/apis/batch/v1/namespaces/default/jobs"
    spec = {
        "template": {
            "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}
        }
    }
    await cluster.api("POST", jobs, {"metadata": {"name": "j1"}, "spec": spec})
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "z"}]}}}}
    status, job = await cluster.api(
        "PATCH", f"{jobs}/j1", patch, content_type="application/strategic-merge-patch+json"
    )
    assert status == 200
    assert job["spec"]["template"]["spec"]["containers"] == [
        {"name": "a", "image": "x"},
        {"name": "b", "image": "z"},
    ]
    # As in Kubernetes, custom resources do not support strategic merge patches.
    await cluster.api("POST", WIDGETS, widget())
    status, _ = await cluster.api(
        "PATCH",
        f"{WIDGETS}/w1",
        {"spec": {"size": 9}},
        content_type="application/strategic-merge-patch+json",
    )
    assert status == 415
    # Server-side apply (simplified): creates, then merges.
    ssa = "application/apply-patch+yaml"
    status, w = await cluster.api(
        "PATCH", f"{WIDGETS}/w2", widget("w2", 5), content_type=ssa, params={"fieldManager": "test"}
    )
    assert status == 201 and w["spec"] == {"size": 5}
    status, w = await cluster.api(
        "PATCH", f"{WIDGETS}/w2", widget("w2", 6), content_type=ssa, params={"fieldManager": "test"}
    )
    assert status == 200 and w["spec"] == {"size": 6}


@pytest.mark.asyncio
async def test_status_subresource_is_separate(widgets: EmulatedCluster) -> None:
    cluster = widgets
    await cluster.api("POST", WIDGETS, widget())
    _, w = await cluster.api(
        "PATCH", f"{WIDGETS}/w1/status", {"status": {"phase": "A"}}, content_type=MERGE
    )
    # Writes to the main resource ignore the status…
    _, w = await cluster.api(
        "PATCH",
        f"{WIDGETS}/w1",
        {"spec": {"size": 3}, "status": {"phase": "B"}},
        content_type=MERGE,
    )
    assert w["status"] == {"phase": "A"} and w["spec"] == {"size": 3}
    w["status"] = {"phase": "C"}
    _, w = await cluster.api("PUT", f"{WIDGETS}/w1", w)
    assert w["status"] == {"phase": "A"}
    # … and writes to the status ignore everything else.
    gen = w["metadata"]["generation"]
    _, w = await cluster.api(
        "PUT", f"{WIDGETS}/w1/status", {**w, "spec": {"size": 100}, "status": {"phase": "D"}}
    )
    assert w["spec"] == {"size": 3} and w["status"] == {"phase": "D"}
    assert w["metadata"]["generation"] == gen
    # Resources without the status subresource: no /status, and the status is a usual field.
    await cluster.api("POST", CMS, {"metadata": {"name": "cm1"}})
    status, _ = await cluster.api("PATCH", f"{CMS}/cm1/status", {}, content_type=MERGE)
    assert status == 404


@pytest.mark.asyncio
async def test_label_and_field_selectors(cluster: EmulatedCluster) -> None:
    for name, labels in [("a", {"app": "x", "tier": "db"}), ("b", {"app": "x"}), ("c", {})]:
        await cluster.api("POST", CMS, {"metadata": {"name": name, "labels": labels}})
    await cluster.api("POST", "/api/v1/namespaces/other/configmaps", {"metadata": {"name": "d"}})

    async def names(**params: str) -> list[str]:
        status, body = await cluster.api("GET", "/api/v1/configmaps", params=params)
        assert status == 200, body
        return sorted(item["metadata"]["name"] for item in body["items"])

    assert await names() == ["a", "b", "c", "d"]
    assert await names(labelSelector="app=x") == ["a", "b"]
    assert await names(labelSelector="app=x,tier!=db") == ["b"]
    assert await names(labelSelector="tier") == ["a"]
    assert await names(labelSelector="!app") == ["c", "d"]
    assert await names(labelSelector="tier in (db,cache)") == ["a"]
    assert await names(fieldSelector="metadata.name=b") == ["b"]
    assert await names(fieldSelector="metadata.namespace!=default") == ["d"]
    assert await names(fieldSelector="metadata.namespace=default,metadata.name!=a") == ["b", "c"]
    status, _ = await cluster.api("GET", CMS, params={"labelSelector": "a b c"})
    assert status == 400
    # Pagination with limit/continue.
    _, page = await cluster.api("GET", "/api/v1/configmaps", params={"limit": "3"})
    assert len(page["items"]) == 3 and page["metadata"]["remainingItemCount"] == 1
    _, page = await cluster.api(
        "GET", "/api/v1/configmaps", params={"limit": "3", "continue": page["metadata"]["continue"]}
    )
    assert [item["metadata"]["name"] for item in page["items"]] == ["d"]

    # Watches with selectors see objects entering/leaving the selection as ADDED/DELETED.
    _, listing = await cluster.api("GET", CMS)
    rv = listing["metadata"]["resourceVersion"]
    await cluster.api(
        "PATCH", f"{CMS}/c", {"metadata": {"labels": {"app": "x"}}}, content_type=MERGE
    )
    await cluster.api(
        "PATCH", f"{CMS}/a", {"metadata": {"labels": {"app": "y"}}}, content_type=MERGE
    )
    await cluster.api("PATCH", f"{CMS}/b", {"data": {"k": "v"}}, content_type=MERGE)
    events = await cluster.watch(
        CMS, resourceVersion=rv, labelSelector="app=x", timeoutSeconds="0.2"
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "c"),
        ("DELETED", "a"),
        ("MODIFIED", "b"),
    ]


@pytest.mark.asyncio
async def test_watch_starts_after_the_resource_version(cluster: EmulatedCluster) -> None:
    await cluster.api("POST", CMS, {"metadata": {"name": "a"}})
    _, listing = await cluster.api("GET", CMS)
    rv = listing["metadata"]["resourceVersion"]
    await cluster.api("POST", CMS, {"metadata": {"name": "b"}})
    await cluster.api("PATCH", f"{CMS}/a", {"data": {"x": "1"}}, content_type=MERGE)
    await cluster.api("DELETE", f"{CMS}/b")

    async with cluster.server.client.get(
        CMS,
        params={
            "watch": "true",
            "resourceVersion": rv,
            "timeoutSeconds": "0.3",
            "allowWatchBookmarks": "true",
        },
    ) as response:
        assert response.headers["Content-Type"] == "application/json"
        events = [json.loads(line) async for line in response.content if line.strip()]
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
        ("BOOKMARK", None),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)

    # Without a resourceVersion: the existing objects first, then live events.
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.create_task(cluster.watch(CMS, timeoutSeconds="1"))
    await asyncio.sleep(0.2)
    await cluster.api("POST", CMS, {"metadata": {"name": "c"}})
    events = await task
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "c"),
    ]
    assert 0.9 < loop.time() - started < 3  # timeoutSeconds ends the stream

    # With sendInitialEvents: the initial objects, then a bookmark marking the end of them.
    events = await cluster.watch(
        CMS,
        sendInitialEvents="true",
        timeoutSeconds="0.1",
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true",
    )
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK", "BOOKMARK"]
    assert events[2]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


@pytest.mark.asyncio
async def test_namespace_from_url_reaches_watchers(cluster: EmulatedCluster) -> None:
    task = asyncio.create_task(
        cluster.watch("/api/v1/namespaces/ns1/configmaps", timeoutSeconds="0.5")
    )
    await asyncio.sleep(0.1)
    status, cm = await cluster.api(
        "POST", "/api/v1/namespaces/ns1/configmaps", {"metadata": {"name": "a"}}
    )
    assert status == 201 and cm["metadata"]["namespace"] == "ns1"
    events = await task
    assert [(e["type"], e["object"]["metadata"]["namespace"]) for e in events] == [("ADDED", "ns1")]


@pytest.mark.asyncio
async def test_owner_references_garbage_collection(widgets: EmulatedCluster) -> None:
    cluster = widgets
    _, owner = await cluster.api("POST", WIDGETS, widget("owner"))
    ref = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    _, child = await cluster.api(
        "POST", CMS, {"metadata": {"name": "child", "ownerReferences": [ref]}}
    )
    grandchild_ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "child",
        "uid": child["metadata"]["uid"],
    }
    await cluster.api(
        "POST", CMS, {"metadata": {"name": "grandchild", "ownerReferences": [grandchild_ref]}}
    )
    await cluster.api("POST", CMS, {"metadata": {"name": "unrelated"}})
    status, _ = await cluster.api("DELETE", f"{WIDGETS}/owner")
    assert status == 200
    assert [cm["metadata"]["name"] for cm in cluster.list("configmaps")] == ["unrelated"]

    # With propagationPolicy=Orphan, the dependents stay.
    _, owner = await cluster.api("POST", WIDGETS, widget("owner"))
    ref["uid"] = owner["metadata"]["uid"]
    await cluster.api("POST", CMS, {"metadata": {"name": "child", "ownerReferences": [ref]}})
    await cluster.api("DELETE", f"{WIDGETS}/owner", {"propagationPolicy": "Orphan"})
    assert cluster.get("configmaps", "default", "child") is not None

    # Deleting a namespace deletes its content.
    await cluster.api("POST", "/api/v1/namespaces", {"metadata": {"name": "doomed"}})
    await cluster.api("POST", "/api/v1/namespaces/doomed/configmaps", {"metadata": {"name": "x"}})
    await cluster.api("DELETE", "/api/v1/namespaces/doomed")
    assert cluster.list("configmaps", "doomed") == []


@pytest.mark.asyncio
async def test_deletion_with_finalizers(widgets: EmulatedCluster) -> None:
    cluster = widgets
    _, w = await cluster.api(
        "POST", WIDGETS, widget(metadata={"name": "w1", "finalizers": ["a/b", "c/d"]})
    )
    task = asyncio.create_task(
        cluster.watch(
            WIDGETS, resourceVersion=w["metadata"]["resourceVersion"], timeoutSeconds="0.5"
        )
    )
    await asyncio.sleep(0.1)
    status, w = await cluster.api("DELETE", f"{WIDGETS}/w1")
    assert status == 200 and w["metadata"]["deletionTimestamp"]
    assert cluster.get("widgets", "default", "w1") is not None
    _, again = await cluster.api("DELETE", f"{WIDGETS}/w1")
    assert again["metadata"]["resourceVersion"] == w["metadata"]["resourceVersion"]
    await cluster.api(
        "PATCH", f"{WIDGETS}/w1", {"metadata": {"finalizers": ["c/d"]}}, content_type=MERGE
    )
    assert cluster.get("widgets", "default", "w1") is not None
    status, _ = await cluster.api(
        "PATCH", f"{WIDGETS}/w1", {"metadata": {"finalizers": None}}, content_type=MERGE
    )
    assert status == 200
    assert cluster.get("widgets", "default", "w1") is None
    events = await task
    assert [e["type"] for e in events] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert events[-1]["object"]["metadata"].get("finalizers") is None


@pytest.mark.asyncio
async def test_job_controller_simulation_and_events(cluster: EmulatedCluster) -> None:
    jobs = "/apis/batch/v1/namespaces/default/jobs"
    spec = {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}
    for name in ("ok", "bad"):
        status, _ = await cluster.api("POST", jobs, {"metadata": {"name": name}, "spec": spec})
        assert status == 201, _
    task = asyncio.create_task(cluster.watch(jobs, timeoutSeconds="0.5"))
    await asyncio.sleep(0.1)
    cluster.set_job_succeeded("default", "ok")
    cluster.set_job_failed("default", "bad", reason="DeadlineExceeded")
    events = await task
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "ok"),
        ("ADDED", "bad"),
        ("MODIFIED", "ok"),
        ("MODIFIED", "bad"),
    ]
    ok, bad = cluster.get("jobs", "default", "ok"), cluster.get("jobs", "default", "bad")
    assert ok["status"]["succeeded"] == 1 and ok["status"]["conditions"][0]["type"] == "Complete"
    assert bad["status"]["failed"] == 1
    assert bad["status"]["conditions"][0] | {
        "lastProbeTime": None,
        "lastTransitionTime": None,
        "message": None,
    } == {
        "type": "Failed",
        "status": "True",
        "reason": "DeadlineExceeded",
        "lastProbeTime": None,
        "lastTransitionTime": None,
        "message": None,
    }
    assert cluster.count("PUT", "jobs") == 0 and cluster.count("POST", "jobs") == 2

    # Events are accepted in both API groups, also with generated names.
    status, event = await cluster.api(
        "POST",
        "/api/v1/namespaces/default/events",
        {
            "metadata": {"generateName": "kopf-event-"},
            "reason": "R",
            "message": "M",
            "involvedObject": {"kind": "Job", "name": "ok", "namespace": "default"},
        },
    )
    assert status == 201 and event["metadata"]["name"].startswith("kopf-event-")
    status, _ = await cluster.api(
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        {"metadata": {"name": "e2"}, "reason": "R", "note": "N"},
    )
    assert status == 422  # events.k8s.io/v1 requires eventTime, as kube-apiserver does
    status, _ = await cluster.api(
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        {
            "metadata": {"name": "e2"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reason": "R",
            "note": "N",
        },
    )
    assert status == 201
    assert len(cluster.list("events", "default")) == 1  # the core/v1 one
    assert len(cluster.list("events.events.k8s.io", "default")) == 1


@pytest.mark.asyncio
async def test_tables_for_kubectl_get(widgets: EmulatedCluster) -> None:
    cluster = widgets
    await cluster.api("POST", WIDGETS, widget(size=7))
    await cluster.api(
        "PATCH",
        f"{WIDGETS}/w1/status",
        {"status": {"phase": "Planned", "conditions": [{"type": "Planned", "status": "True"}]}},
        content_type=MERGE,
    )
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    _, table = await cluster.api("GET", WIDGETS, headers={"Accept": accept})
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "Size",
        "Phase",
        "Planned",
        "Age",
    ]
    assert table["rows"][0]["cells"][:4] == ["w1", 7, "Planned", "True"]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


@pytest.mark.asyncio
async def test_user_reactions_override_the_api(cluster: EmulatedCluster) -> None:
    await cluster.api("POST", CMS, {"metadata": {"name": "cm1"}})
    cluster.emulator[kmock.method.PATCH, kmock.resource("v1/configmaps")] << 503
    status, _ = await cluster.api("PATCH", f"{CMS}/cm1", {"data": {"a": "1"}}, content_type=MERGE)
    assert status == 503
    assert "data" not in cluster.get("configmaps", "default", "cm1")  # intercepted: no changes
    assert cluster.count("PATCH", "configmaps") == 1


# --- kubectl & kopf ----------------------------------------------------------------------------


def _manifest(path: pathlib.Path, *docs: dict) -> pathlib.Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


@pytest.mark.asyncio
async def test_kubectl_round_trip(cluster: EmulatedCluster, tmp_path: pathlib.Path) -> None:
    crd = _manifest(tmp_path / "crd.yaml", widget_crd())
    res = await cluster.kubectl("apply", "--validate=false", "-f", str(crd))
    assert "created" in res.stdout
    res = await cluster.kubectl("apply", "--validate=false", "-f", str(crd))
    assert "unchanged" in res.stdout

    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm1"}, "data": {"a": "1"}}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j1"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox"}],
                }
            }
        },
    }
    objs = _manifest(tmp_path / "objs.yaml", widget(size=1), cm, job)
    res = await cluster.kubectl("apply", "--validate=false", "-f", str(objs))
    assert res.stdout.count("created") == 3
    cm["data"] = {"a": "2"}
    job["spec"]["template"]["spec"]["containers"][0]["image"] = "alpine"
    objs = _manifest(tmp_path / "objs.yaml", widget(size=2), cm, job)
    res = await cluster.kubectl("apply", "--validate=false", "-f", str(objs))
    assert res.stdout.count("configured") == 3
    assert cluster.get("widgets", "default", "w1")["metadata"]["generation"] == 2
    assert cluster.get("configmaps", "default", "cm1")["data"] == {"a": "2"}
    image = cluster.get("jobs", "default", "j1")["spec"]["template"]["spec"]["containers"][0]
    assert image["image"] == "alpine"

    res = await cluster.kubectl("get", "widgets", "-o", "json")
    assert [item["spec"]["size"] for item in json.loads(res.stdout)["items"]] == [2]
    res = await cluster.kubectl("get", "wi", "w1", "-o", "jsonpath={.spec.size}")
    assert res.stdout == "2"
    cluster.emulator.patch(
        "widgets",
        "default",
        "w1",
        {"status": {"phase": "Planned", "conditions": [{"type": "Planned", "status": "True"}]}},
        subresource="status",
    )
    res = await cluster.kubectl("get", "widgets")
    assert res.stdout.split("\n")[0].split() == ["NAME", "SIZE", "PHASE", "PLANNED", "AGE"]
    assert res.stdout.split("\n")[1].split()[:4] == ["w1", "2", "Planned", "True"]
    res = await cluster.kubectl("get", "configmaps")
    assert res.stdout.split("\n")[0].split() == ["NAME", "AGE"]
    await cluster.kubectl(
        "wait", "--for=jsonpath={.status.phase}=Planned", "widget/w1", "--timeout=10s"
    )
    asyncio.get_running_loop().call_later(0.5, cluster.set_job_succeeded, "default", "j1")
    await cluster.kubectl("wait", "--for=condition=Complete", "job/j1", "--timeout=10s")

    # Typed `kubectl create` sends protobuf (unsupported); the dry-run/apply pipe works.
    created = await cluster.kubectl(
        "create", "configmap", "cm2", "--from-literal=k=v", "--dry-run=client", "-o", "yaml"
    )
    await cluster.kubectl("apply", "--validate=false", "-f", "-", input=created.stdout)
    assert cluster.get("configmaps", "default", "cm2")["data"] == {"k": "v"}

    res = await cluster.kubectl("delete", "-f", str(objs))
    assert res.stdout.count("deleted") == 3
    assert cluster.list("widgets") == [] and cluster.get("jobs", "default", "j1") is None
    assert cluster.count("PUT") == 0  # kubectl apply patches, never replaces

    # CRD updates re-register the resource (kubectl re-discovers despite its cache).
    updated_crd = widget_crd()
    updated_crd["spec"]["names"]["shortNames"] = ["wdg"]
    res = await cluster.kubectl("apply", "--validate=false", "-f", str(_manifest(crd, updated_crd)))
    assert "configured" in res.stdout
    await cluster.kubectl("apply", "--validate=false", "-f", str(_manifest(objs, widget())))
    assert (
        await cluster.kubectl("get", "wdg", "-o", "name")
    ).stdout.strip() == f"widget.{GROUP}/w1"
    await cluster.kubectl("delete", "-f", str(crd))
    assert cluster.list("configmaps") and cluster.get("widgets", "default", "w1") is None
    res = await cluster.kubectl("get", "widgets", check=False)
    assert res.returncode != 0


@pytest.mark.cluster
def test_subprocess_emulator_with_kubectl(tmp_path: pathlib.Path) -> None:
    crds = tmp_path / "crds"
    crds.mkdir()
    _manifest(crds / "widgets.yaml", widget_crd())
    with emulator_subprocess(tmp_path, crds_dir=crds) as cluster:
        assert cluster.url.startswith("http://127.0.0.1:")
        manifest = _manifest(tmp_path / "w.yaml", widget(size=3))
        res = cluster.kubectl("apply", "--validate=false", "-f", str(manifest))
        assert "created" in res.stdout
        res = cluster.kubectl("get", "widgets", "w1", "-o", "json")
        assert json.loads(res.stdout)["spec"] == {"size": 3}
        assert cluster.kubectl("get", "widgets", "-o", "name").stdout.strip() == (
            f"widget.{GROUP}/w1"
        )
    assert cluster.process.returncode == 0  # SIGTERM is a clean shutdown


# --- an embedded kopf operator -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_login_handler_follows_the_running_emulator(cluster: EmulatedCluster) -> None:
    assert current_kubeconfig() == cluster.kubeconfig_path
    info = emulator_login()
    assert info.server == cluster.url and info.insecure and info.default_namespace == "default"
    async with running_emulator() as inner:
        assert emulator_login().server == inner.url != cluster.url
    assert emulator_login().server == cluster.url


def _toy_operator() -> Any:
    """A tiny kopf operator: a finalizer, an adopted ConfigMap, status, events, updates."""
    import kopf
    import kubernetes

    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(emulator_login)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix="shardmeter.io"
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="shardmeter.io", key="last-handled-configuration"
        )
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 5
        settings.watching.client_timeout = 10
        settings.networking.request_timeout = 5

    def core_api() -> Any:
        client = kubernetes.config.new_client_from_config(config_file=str(current_kubeconfig()))
        return kubernetes.client.CoreV1Api(client)

    @kopf.on.create(GROUP, "v1", "widgets", registry=registry)
    def created(
        body: Any, spec: Any, name: str, namespace: str, patch: Any, memo: Any, **_: Any
    ) -> None:
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-cfg"},
            "data": {"size": str(spec["size"])},
        }
        kopf.adopt(cm, owner=body)
        api = core_api()
        with api.api_client:
            api.create_namespaced_config_map(namespace, cm)
        patch.status["phase"] = "Planned"
        patch.status["conditions"] = [{"type": "Planned", "status": "True"}]
        kopf.info(body, reason="Planned", message=f"Planned {name}")
        memo.calls.append(("create", spec["size"]))

    @kopf.on.update(GROUP, "v1", "widgets", field="spec", registry=registry)
    def updated(spec: Any, name: str, namespace: str, patch: Any, memo: Any, **_: Any) -> None:
        api = core_api()
        with api.api_client:
            api.patch_namespaced_config_map(
                f"{name}-cfg", namespace, {"data": {"size": str(spec["size"])}}
            )
        patch.status["observedSize"] = spec["size"]
        memo.calls.append(("update", spec["size"]))

    @kopf.on.delete(GROUP, "v1", "widgets", registry=registry)
    def deleted(memo: Any, **_: Any) -> None:
        memo.calls.append(("delete", None))

    return registry


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_embedded_kopf_operator_end_to_end(tmp_path: pathlib.Path) -> None:
    import kopf

    crds = tmp_path / "crds"
    crds.mkdir()
    _manifest(crds / "widgets.yaml", widget_crd())
    memo = kopf.Memo(calls=[])
    async with (
        running_emulator(crds_dir=crds, tmp_path=tmp_path) as cluster,
        embedded_operator(_toy_operator(), memo=memo),
    ):
        manifest = tmp_path / "w.yaml"
        manifest.write_text(
            textwrap.dedent(f"""
                apiVersion: {GROUP}/v1
                kind: Widget
                metadata: {{name: w1, namespace: default}}
                spec: {{size: 1}}
            """)
        )
        await cluster.kubectl("apply", "--validate=false", "-f", str(manifest))
        await cluster.kubectl(
            "wait", "--for=jsonpath={.status.phase}=Planned", "widget/w1", "--timeout=15s"
        )
        w = cluster.get("widgets", "default", "w1")
        assert w["metadata"]["finalizers"]  # added by kopf before the handlers
        assert any(key.startswith("shardmeter.io/") for key in w["metadata"]["annotations"])
        cm = cluster.get("configmaps", "default", "w1-cfg")
        assert cm["data"] == {"size": "1"}
        assert cm["metadata"]["ownerReferences"][0]["uid"] == w["metadata"]["uid"]
        await cluster.wait_for(
            lambda: [e for e in cluster.list("events", "default") if e["reason"] == "Planned"]
        )

        manifest.write_text(manifest.read_text().replace("size: 1", "size: 2"))
        await cluster.kubectl("apply", "--validate=false", "-f", str(manifest))
        await cluster.wait_for(
            lambda: cluster.get("widgets", "default", "w1")["status"].get("observedSize") == 2
        )
        assert cluster.get("configmaps", "default", "w1-cfg")["data"] == {"size": "2"}
        assert cluster.get("widgets", "default", "w1")["metadata"]["generation"] == 2

        await cluster.kubectl("delete", "-f", str(manifest), "--timeout=15s")
        assert cluster.get("widgets", "default", "w1") is None  # the finalizer was removed
        assert cluster.get("configmaps", "default", "w1-cfg") is None  # garbage-collected
        assert memo.calls == [("create", 1), ("update", 2), ("delete", None)]
        assert cluster.count("PATCH", "widgets") >= 3 and cluster.count("PUT") == 0
    assert not cluster.emulator.failures


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_kopf_discovers_a_cluster_scoped_crd_created_later(cluster: EmulatedCluster) -> None:
    import kopf

    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(emulator_login)

    @kopf.on.resume(GROUP, "v1", "gadgets", registry=registry)
    @kopf.on.create(GROUP, "v1", "gadgets", registry=registry)
    def seen(name: str, patch: Any, **_: Any) -> None:
        patch.status["seen"] = name

    async with embedded_operator(registry):
        await cluster.wait_for(lambda: cluster.count("GET", "customresourcedefinitions"))
        assert cluster.count("GET", "gadgets") == 0  # kopf watches CRDs, but not gadgets yet
        crd = widget_crd(scope="Cluster", plural="gadgets", kind="Gadget")
        await cluster.api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        gadget = {"apiVersion": f"{GROUP}/v1", "kind": "Gadget", "metadata": {"name": "g1"}}
        await cluster.api("POST", f"/apis/{GROUP}/v1/gadgets", gadget)
        await cluster.wait_for(
            lambda: (cluster.get("gadgets", None, "g1") or {}).get("status", {}).get("seen"),
            timeout=15,
        )


@pytest.mark.asyncio
async def test_async_kubectl_helper_reports_failures(cluster: EmulatedCluster) -> None:
    res = await akubectl(
        "get", "nonexistentthings", kubeconfig=cluster.kubeconfig_path, check=False
    )
    assert res.returncode != 0 and "nonexistentthings" in res.stderr
    with pytest.raises(KubectlError, match="nonexistentthings"):
        await cluster.kubectl("get", "nonexistentthings")


@pytest.mark.asyncio
@pytest.mark.parametrize("namespaces", [["default"], ["def*"]])
async def test_kopf_namespaced_operator_with_namespace_observer(
    cluster: EmulatedCluster, namespaces: list[str]
) -> None:
    import kopf

    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(emulator_login)

    @kopf.on.create("v1", "configmaps", registry=registry)
    def label(patch: Any, **_: Any) -> None:
        patch.metadata.labels["seen"] = "yes"

    async with embedded_operator(registry, namespaces=namespaces):
        await cluster.api("POST", CMS, {"metadata": {"name": "a"}})
        await cluster.api(
            "POST", "/api/v1/namespaces/other/configmaps", {"metadata": {"name": "b"}}
        )
        await cluster.wait_for(
            lambda: cluster.get("configmaps", "default", "a")["metadata"].get("labels")
        )
    assert "labels" not in cluster.get("configmaps", "other", "b")["metadata"]
    assert cluster.count("GET", "namespaces") >= 1  # kopf observes the namespaces
