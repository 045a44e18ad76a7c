"""The Helm chart deploy/helm/shardmeter, rendered by a real Helm: helm-python-sdk (a dev
dependency) binds Helm v4's Go SDK, so no helm binary is needed, and a missing one is an import
error, never a skip.

* lint passes (strict); the default render holds exactly the expected objects; the values
  toggles add and remove the ServiceMonitor, the PrometheusRule and the CRDs; the schema
  rejects unknown values at every level; values.yaml is documented line by line;
* the CRDs come from the repository's crds/ (files/crds is a symlink): a test fails on drift;
* RBAC: the ClusterRole and Roles are exactly ``shardmeter_operator.k8s.permissions`` (that the
  operator needs each of them and no other, against a real kube-apiserver: tests/kube/test_rbac.py);
* the rendered manifests apply to the emulated API server with the real kubectl.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

from shardmeter_operator.__main__ import parse as parse_operator_args
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.k8s.permissions import BENCH_PERMISSIONS, PERMISSIONS
from support.kube_emulator import builtins, structural
from support.kube_versions import SUPPORTED_MINORS

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "shardmeter"
RELEASE, NAMESPACE = "sm", "shardmeter-system"
FULLNAME = f"{RELEASE}-shardmeter"
OPERATOR_SA, BENCH_SA = FULLNAME, f"{FULLNAME}-bench"
Doc = dict[str, Any]
Rule = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def render(values: Doc | None = None, *, namespace: str = NAMESPACE) -> list[Doc]:
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name=RELEASE, namespace=namespace)
    docs: list[Doc] = []
    for path, text in sorted(out.items()):
        if not path.endswith(".txt"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def kinds(docs: Iterable[Doc]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def one(docs: Iterable[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def container(docs: Iterable[Doc]) -> Doc:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    return dict(pod["containers"][0])


DEFAULT = render()
EXPECTED = {
    ("CustomResourceDefinition", "gpupools.shardmeter.io"),
    ("CustomResourceDefinition", "trainingplans.shardmeter.io"),
    ("ServiceAccount", OPERATOR_SA),
    ("ServiceAccount", BENCH_SA),
    ("ClusterRole", FULLNAME),
    ("ClusterRoleBinding", FULLNAME),
    ("Role", FULLNAME),
    ("RoleBinding", FULLNAME),
    ("Deployment", FULLNAME),
    ("Service", f"{FULLNAME}-metrics"),
    ("Pod", f"{FULLNAME}-test-metrics"),  # `helm test`
    ("CustomResourceDefinition", "clusterkopfpeerings.kopf.dev"),  # leader election
    ("PodDisruptionBudget", FULLNAME),
}
NAMESPACED = {"operator": {"watchNamespaces": ["team-a", "team-b"]}}
ALL_ON = {
    "metrics": {"serviceMonitor": {"enabled": True}},
    "prometheusRule": {"enabled": True},
    "operator": {"multiCluster": {"readWorkerKubeconfigs": True}},
}


# ---- lint, objects, toggles ------------------------------------------------------------------
@pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "everything-on"])
def test_lint_passes(values: Doc | None) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
    assert problems == [], problems


def test_default_render_holds_the_expected_objects() -> None:
    assert kinds(DEFAULT) == EXPECTED
    for doc in DEFAULT:
        if doc["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


@pytest.mark.parametrize(
    ("values", "added", "removed"),
    [
        (
            {"metrics": {"serviceMonitor": {"enabled": True}}},
            {("ServiceMonitor", FULLNAME)},
            set(),
        ),
        ({"prometheusRule": {"enabled": True}}, {("PrometheusRule", FULLNAME)}, set()),
        (
            {"operator": {"multiCluster": {"readWorkerKubeconfigs": True}}},
            {("Role", f"{FULLNAME}-multicluster"), ("RoleBinding", f"{FULLNAME}-multicluster")},
            set(),
        ),
        (
            ALL_ON,
            {
                ("ServiceMonitor", FULLNAME),
                ("PrometheusRule", FULLNAME),
                ("Role", f"{FULLNAME}-multicluster"),
                ("RoleBinding", f"{FULLNAME}-multicluster"),
            },
            set(),
        ),
        (
            {"crds": {"install": False}},
            set(),
            {k for k in EXPECTED if k[0] == "CustomResourceDefinition"},
        ),
        (
            {"rbac": {"create": False}},
            set(),
            {
                k
                for k in EXPECTED
                if k[0] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
            },
        ),
        (
            {"serviceAccount": {"create": False, "name": "existing"}},
            set(),
            {("ServiceAccount", OPERATOR_SA)},
        ),
        ({"benchServiceAccount": {"create": False}}, set(), {("ServiceAccount", BENCH_SA)}),
        ({"replicas": 1}, set(), {("PodDisruptionBudget", FULLNAME)}),
        (
            {"podDisruptionBudget": {"enabled": False, "minAvailable": 1}},
            set(),
            {("PodDisruptionBudget", FULLNAME)},
        ),
    ],
    ids=[
        "servicemonitor",
        "prometheusrule",
        "worker-kubeconfigs",
        "everything",
        "no-crds",
        "no-rbac",
        "no-sa",
        "no-bench-sa",
        "one-replica",
        "no-pdb",
    ],
)
def test_toggles_add_and_remove_objects(
    values: Doc, added: set[tuple[str, str]], removed: set[tuple[str, str]]
) -> None:
    assert kinds(render(values)) == (EXPECTED | added) - removed


def test_an_existing_service_account_is_used_everywhere() -> None:
    docs = render({"serviceAccount": {"create": False, "name": "existing"}})
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "existing"
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        assert one(docs, kind)["subjects"] == [
            {"kind": "ServiceAccount", "name": "existing", "namespace": NAMESPACE}
        ]


@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
@pytest.mark.parametrize(
    "values", [None, ALL_ON, NAMESPACED], ids=["defaults", "everything-on", "namespaced"]
)
def test_every_rendered_manifest_validates_against_kubernetes(
    values: Doc | None, minor: str
) -> None:
    """Kubernetes' own schemas (kubernetes-validate, strict) and name rules, for the oldest
    and the newest Kubernetes minor the chart supports; CRDs also structural."""
    for doc in render(values):
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # Prometheus Operator kinds: no upstream schema
        assert builtins.validate(doc, minor) == [], (doc["kind"], doc["metadata"]["name"])
        if doc["kind"] == "CustomResourceDefinition":
            for version in doc["spec"]["versions"]:
                schema = version["schema"]["openAPIV3Schema"]
                assert structural.structural_problems(schema) == [], doc["metadata"]["name"]


def test_crds_keep_annotation_toggle() -> None:
    for crd in (d for d in DEFAULT if d["kind"] == "CustomResourceDefinition"):
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for crd in (
        d for d in render({"crds": {"keep": False}}) if d["kind"] == "CustomResourceDefinition"
    ):
        assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})


# ---- the Deployment ----------------------------------------------------------------------------
def test_deployment_runs_two_replicas_that_elect_a_leader() -> None:
    deployment = one(DEFAULT, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    args = parse_operator_args(container(DEFAULT)["args"])
    assert args.standalone is False and args.peering == FULLNAME and args.priority is None
    pdb = one(DEFAULT, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    pod = deployment["spec"]["template"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    spread = pod["spec"]["affinity"]["podAntiAffinity"]
    assert (
        spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"][
            "topologyKey"
        ]
        == "kubernetes.io/hostname"
    )
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["serviceAccountName"] == OPERATOR_SA
    assert pod["spec"]["automountServiceAccountToken"] is True


def test_deployment_security_contexts_are_restricted() -> None:
    pod = one(DEFAULT, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsUser"] != 0
    sc = container(DEFAULT)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod and "hostPID" not in pod
    # the only writable path: /tmp (an emptyDir)
    mounts = {m["mountPath"]: m["name"] for m in container(DEFAULT)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert list(mounts) == ["/tmp"] and "emptyDir" in volumes[mounts["/tmp"]]
    # IDs left to the platform (e.g. OpenShift's restricted SCC): still runAsNonRoot
    free = render({"podSecurityContext": {"runAsUser": None, "runAsGroup": None}})
    pod = one(free, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_deployment_sets_resources() -> None:
    resources = container(DEFAULT)["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]


def test_deployment_args_are_valid_operator_flags() -> None:
    c = container(DEFAULT)
    args = parse_operator_args(c["args"])  # the operator's own parser
    assert args.standalone is False
    assert args.all_namespaces is True and args.namespace == []
    assert args.bench_image == "ghcr.io/shardmeter/bench:0.1.0"
    assert args.bench_service_account == BENCH_SA
    assert args.recheck_interval == 30 and args.retry_backoff == 60
    assert args.metrics_port == 9090
    assert args.liveness == "http://0.0.0.0:8080/healthz"
    assert args.log_json is True
    assert c["image"] == "ghcr.io/shardmeter/operator:0.1.0"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}

    watched = container(render({"operator": {"watchNamespaces": ["team-a", "team-b"]}}))
    args = parse_operator_args(watched["args"])
    assert args.namespace == ["team-a", "team-b"] and not args.all_namespaces

    # observation: the values' defaults are the operator's, a Prometheus URL only when set
    defaults = OperatorConfig()
    assert args.observe_interval == defaults.observe_interval_s
    assert args.observe_tail_lines == defaults.observe_tail_lines
    assert args.observe_limit_bytes == defaults.observe_limit_bytes
    assert args.observe_window == defaults.observe_window
    assert args.observed_min_samples == defaults.observed_min_samples
    assert args.prometheus_url is None
    url = "http://prometheus.monitoring:9090"
    args = parse_operator_args(
        container(
            render(
                {"operator": {"observe": {**VALUES["operator"]["observe"], "prometheusUrl": url}}}
            )
        )["args"]
    )
    assert args.prometheus_url == url


def test_probes_hit_kopfs_liveness_endpoint() -> None:
    c = container(DEFAULT)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    liveness = parse_operator_args(c["args"]).liveness
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz"
        assert liveness == f"http://0.0.0.0:{ports[get['port']]}/healthz"
    assert ports["metrics"] == parse_operator_args(c["args"]).metrics_port


def test_image_tags_follow_the_app_version_and_digests_win() -> None:
    with helm.Chart.load(CHART) as chart:
        app_version = chart.metadata["appVersion"]
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(rf'^version = "{re.escape(app_version)}"$', pyproject, re.M)
    digest = "sha256:" + "a" * 64
    c = container(render({"image": {"digest": digest}, "benchImage": {"tag": "0.2.0"}}))
    assert c["image"] == f"ghcr.io/shardmeter/operator@{digest}"
    assert parse_operator_args(c["args"]).bench_image == "ghcr.io/shardmeter/bench:0.2.0"


def test_metrics_service_servicemonitor_and_prometheusrule() -> None:
    docs = render(ALL_ON)
    service = one(docs, "Service")
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "metrics"
    monitor = one(docs, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["honorLabels"] is True
    assert {"action": "replace", "targetLabel": "job", "replacement": "shardmeter-operator"} in (
        endpoint["relabelings"]
    )
    rule = one(docs, "PrometheusRule")
    shipped = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert rule["spec"] == shipped  # the very file promtool tests (tests/deploy/test_alerts.py)
    assert "shardmeter-operator" in json.dumps(shipped)  # the job the ServiceMonitor sets
    labelled = render({"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}})
    assert one(labelled, "PrometheusRule")["metadata"]["labels"]["release"] == "kps"


def test_helm_test_pod_scrapes_the_metrics_service() -> None:
    pod = one(DEFAULT, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = one(DEFAULT, "Service")
    (port,) = service["spec"]["ports"]
    script = pod["spec"]["containers"][0]["command"][-1]
    url = f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{port['port']}/metrics"
    assert url in script
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    sc = pod["spec"]["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True


def test_chart_files_ship_the_alerts_and_crds_but_not_the_rule_tests() -> None:
    with helm.Chart.load(CHART) as chart:
        files = {f["name"] for f in chart.files}
    assert {
        "files/alerts.yaml",
        "files/crds/gpupools.yaml",
        "files/crds/trainingplans.yaml",
    } <= files
    assert not [f for f in files if f.startswith("tests/")]  # .helmignore keeps them out


# ---- values and schema -------------------------------------------------------------------------
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


@pytest.mark.parametrize(
    "values",
    [
        {"bogus": 1},
        {"image": {"bogus": "x"}},
        {"metrics": {"serviceMonitor": {"enabled": True, "intervall": "30s"}}},
        {"operator": {"watchNamespace": ["a"]}},
        {"resources": {"requests": {"gpu": 1}}},
        {
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"x": 1}}
            }
        },
        {"image": {"tag": "latest"}},
        {"operator": {"watchNamespaces": ["team-*"]}},
        {"podSecurityContext": {"runAsUser": 0}},
        {"crds": {"install": "yes"}},
    ],
    ids=json.dumps,
)
def test_schema_rejects_bad_values(values: Doc) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError):
        render(values)


def _object_schemas(schema: Any, where: str = "$") -> Iterable[tuple[str, Doc]]:
    if isinstance(schema, dict):
        types = schema.get("type")
        if types == "object" or (isinstance(types, list) and "object" in types):
            yield where, schema
        for key, value in schema.items():
            yield from _object_schemas(value, f"{where}.{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from _object_schemas(value, f"{where}[{i}]")


def test_schema_is_strict_at_every_object_level() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    for where, obj in _object_schemas(SCHEMA):
        extra = obj.get("additionalProperties")
        # closed objects, or string maps (labels, annotations, node selectors)
        assert extra is False or extra == {"type": "string"}, where
        if extra is False:
            assert obj.get("properties"), where


def test_values_yaml_matches_the_schema_key_for_key() -> None:
    jsonschema.validate(VALUES, SCHEMA)

    def keys(values: Doc, schema: Doc, where: str) -> None:
        if schema.get("additionalProperties") is not False or not values:
            return  # maps (labels…) and empty defaults (affinity: {})
        assert set(values) == set(schema["properties"]), where
        for key, value in values.items():
            if isinstance(value, dict):
                keys(value, schema["properties"][key], f"{where}.{key}")

    keys(VALUES, SCHEMA, "values")


def test_values_yaml_is_documented_line_by_line() -> None:
    previous = ""
    undocumented = []
    for number, line in enumerate((CHART / "values.yaml").read_text().splitlines(), 1):
        stripped = line.strip()
        if re.match(r"^[\w.-]+:", stripped) and not previous.startswith("#") and "#" not in line:
            undocumented.append(f"{number}: {line}")
        if stripped:
            previous = stripped
    assert undocumented == []


# ---- CRDs: one source --------------------------------------------------------------------------
def test_crds_are_the_repositorys_crds() -> None:
    link = CHART / "files" / "crds"
    assert link.is_symlink() and link.resolve() == (REPO / "crds").resolve(), "one source"
    sources = sorted((REPO / "crds").glob("*.yaml"))
    assert sources
    for source in sources:  # also catches a copied (no longer linked) folder drifting
        assert (link / source.name).read_bytes() == source.read_bytes(), source.name
    assert sorted(p.name for p in link.glob("*.yaml")) == [p.name for p in sources]
    rendered = {
        d["metadata"]["name"]: d
        for d in DEFAULT
        if d["kind"] == "CustomResourceDefinition" and d["spec"]["group"] == "shardmeter.io"
    }
    expected = {}
    for source in sources:
        for doc in yaml.safe_load_all(source.read_text()):
            if doc:
                expected[doc["metadata"]["name"]] = doc
    assert set(rendered) == set(expected)
    for name, crd in rendered.items():
        crd = copy.deepcopy(crd)
        meta = crd["metadata"]
        assert meta.pop("annotations") == {"helm.sh/resource-policy": "keep"}
        assert expected[name]["metadata"]["labels"].items() <= meta["labels"].items()
        meta["labels"] = expected[name]["metadata"]["labels"]
        assert crd == expected[name], f"{name} differs from crds/ once rendered"


# ---- RBAC ------------------------------------------------------------------------------------
def rules_of(role: Doc) -> set[Rule]:
    out = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no names, no URLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), rule
                    out.add((group, resource, verb))
    return out


def declared(*scopes: str) -> set[Rule]:
    return {(p.api_group, p.resource, v) for p in PERMISSIONS if p.scope in scopes for v in p.verbs}


def _show(rules: set[Rule]) -> str:
    return "\n".join(f"  {g or 'core'} {r} {v}" for g, r, v in sorted(rules))


def _same(got: set[Rule], want: set[Rule]) -> None:
    assert got == want, f"missing:\n{_show(want - got)}\nextra:\n{_show(got - want)}"


def test_cluster_role_and_roles_are_exactly_the_declared_permissions() -> None:
    assert {p.scope for p in PERMISSIONS} == {
        "cluster",
        "workload",
        "operator-namespace",
        "namespaced-mode",
        "multicluster",
        "cluster-events",
    }
    # reading worker clusters' kubeconfigs: a Role in Kueue's namespace, only when asked
    assert not [d for d in DEFAULT if d["metadata"]["name"] == f"{FULLNAME}-multicluster"]
    multi = [d for d in render(ALL_ON) if d["metadata"]["name"] == f"{FULLNAME}-multicluster"]
    (role,) = [d for d in multi if d["kind"] == "Role"]
    assert role["metadata"]["namespace"] == "kueue-system"
    _same(rules_of(role), declared("multicluster"))
    (binding,) = [d for d in multi if d["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == f"{FULLNAME}-multicluster"
    # every namespace: the workload rules are cluster-wide (Events in default included)
    assert declared("cluster-events") <= declared("workload")
    _same(rules_of(one(DEFAULT, "ClusterRole")), declared("cluster", "workload"))
    _same(rules_of(one(DEFAULT, "Role")), declared("operator-namespace"))
    # watched namespaces: a Role in each (and in the release namespace), Namespaces listed
    docs = render(NAMESPACED)
    _same(rules_of(one(docs, "ClusterRole")), declared("cluster", "namespaced-mode"))
    _same(rules_of(one(docs, "Role", FULLNAME)), declared("operator-namespace"))
    # Events about GPUPools: kube-apiserver keeps them in default, a Role there
    events = one(docs, "Role", f"{FULLNAME}-cluster-events")
    assert events["metadata"]["namespace"] == "default"
    _same(rules_of(events), declared("cluster-events"))
    workload = [
        d
        for d in docs
        if d["kind"] == "Role"
        and d["metadata"]["name"] not in (FULLNAME, f"{FULLNAME}-cluster-events")
    ]
    assert sorted(d["metadata"]["namespace"] for d in workload) == [NAMESPACE, "team-a", "team-b"]
    for role in workload:
        _same(rules_of(role), declared("workload"))
    subject = {"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": NAMESPACE}
    for docs_ in (DEFAULT, docs):
        for binding in (d for d in docs_ if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            assert binding["subjects"] == [subject]
    assert one(DEFAULT, "RoleBinding")["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": FULLNAME,
    }


def test_the_bench_service_account_is_granted_nothing_by_the_chart() -> None:
    for doc in render(ALL_ON):
        for subject in doc.get("subjects", []):
            assert subject["name"] != BENCH_SA, doc["metadata"]["name"]
    # the operator grants it per pool, and can only because it holds those verbs itself
    namespaced = declared("operator-namespace")
    for p in BENCH_PERMISSIONS:
        assert p.scope == "operator-namespace"
        assert {(p.api_group, p.resource, v) for v in p.verbs} <= namespaced


# ---- RBAC against the operator's real API calls ----------------------------------------------
# That the operator's real API calls need every permission of the chart and no other — with
# the RBAC authorizer and OwnerReferencesPermissionEnforcement deciding — is
# tests/kube/test_rbac.py's, against a real kube-apiserver in both modes.


# ---- the rendered manifests on the emulated API server ----------------------------------------
def _crd(group: str, kind: str, plural: str) -> Doc:
    """A schemaless stand-in for a Prometheus Operator CRD."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "plural": plural,
                "singular": kind.lower(),
                "listKind": f"{kind}List",
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
                }
            ],
        },
    }


@pytest.mark.asyncio
async def test_rendered_manifests_apply_to_the_emulated_api_server(tmp_path: Path) -> None:
    from support.cluster import running_emulator

    docs = render(ALL_ON)
    manifests = tmp_path / "chart.yaml"
    manifests.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    prerequisites = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        _crd("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
        _crd("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
    ]
    async with running_emulator(tmp_path=tmp_path) as cluster:  # no CRDs: the chart brings them
        await cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(prerequisites))
        result = await cluster.kubectl("apply", "-f", str(manifests))  # strict validation
        assert len(result.stdout.strip().splitlines()) == len(docs), result.stdout
        for doc in docs:
            namespace = doc["metadata"].get("namespace")
            stored = cluster.get(doc["kind"], namespace, doc["metadata"]["name"])
            assert stored is not None, (doc["kind"], doc["metadata"]["name"])
            assert stored["metadata"]["labels"] == doc["metadata"]["labels"]
        # the chart's CRDs serve the examples
        examples = REPO / "examples"
        await cluster.kubectl(
            "apply",
            "-f",
            str(examples / "gpupool-cluster-a.yaml"),
            "-f",
            str(examples / "trainingplan.yaml"),
        )
        table = (await cluster.kubectl("get", "gpupools,trainingplans", "-A")).stdout
        assert "cluster-a" in table and "llama-8b-case-study" in table

        # and a second apply (an upgrade without changes) changes nothing. (kubectl may still
        # send a no-op patch for fields whose patch strategy it cannot look up here — the
        # emulator serves no OpenAPI component schemas — so compare what is stored.)
        def versions() -> dict[tuple[str, str], str]:
            return {
                (d["kind"], d["metadata"]["name"]): cluster.get(
                    d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]
                )["metadata"]["resourceVersion"]
                for d in docs
            }

        stored = versions()
        await cluster.kubectl("apply", "-f", str(manifests))  # validated (strict) this time
        assert versions() == stored
