"""Every Kubernetes permission the operator needs, and why. The Helm chart's RBAC is
generated from nothing else: a test compares its ClusterRole and Role with this list, and
another checks that the operator's API calls (`shardmeter_operator.kube`) and kopf's stay
inside it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Permission:
    api_group: str
    resource: str
    verbs: tuple[str, ...]
    scope: str
    """"cluster" (ClusterRole) or "operator-namespace" (Role in the release namespace)."""
    why: str


PERMISSIONS: tuple[Permission, ...] = (
    # kopf: watch and patch the custom resources (status via the subresource)
    Permission(
        "shardmeter.io",
        "gpupools",
        ("get", "list", "watch", "patch"),
        "cluster",
        "kopf watches GPUPools and stores handler progress in annotations",
    ),
    Permission("shardmeter.io", "gpupools/status", ("get", "patch"), "cluster", "GPUPool status"),
    Permission(
        "shardmeter.io",
        "trainingplans",
        ("get", "list", "watch", "patch"),
        "cluster",
        "kopf watches TrainingPlans and stores handler progress in annotations",
    ),
    Permission(
        "shardmeter.io", "trainingplans/status", ("get", "patch"), "cluster", "TrainingPlan status"
    ),
    # children carry blockOwnerDeletion: clusters that enforce owner-reference permissions
    # (OwnerReferencesPermissionEnforcement) require update on the owner's finalizers
    Permission(
        "shardmeter.io",
        "gpupools/finalizers",
        ("update",),
        "cluster",
        "set blockOwnerDeletion on the ConfigMaps, Jobs and Roles a GPUPool owns",
    ),
    Permission(
        "shardmeter.io",
        "trainingplans/finalizers",
        ("update",),
        "cluster",
        "set blockOwnerDeletion on the Jobs, Services and Deployments a TrainingPlan owns",
    ),
    # kopf: resource discovery and events
    Permission(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        ("get", "list", "watch"),
        "cluster",
        "kopf discovers the CRDs",
    ),
    Permission("", "events", ("create",), "cluster", "kopf posts Events on key transitions"),
    Permission(
        "events.k8s.io", "events", ("create",), "cluster", "kopf posts Events (events.k8s.io)"
    ),
    # island Jobs and their rendezvous Services, in the TrainingPlans' namespaces
    Permission("batch", "jobs", ("get", "create"), "cluster", "one Indexed Job per island"),
    Permission(
        "",
        "services",
        ("get", "create"),
        "cluster",
        "a headless Service per Job (rendezvous) and the torchft lighthouse's Service",
    ),
    Permission(
        "apps",
        "deployments",
        ("get", "create"),
        "cluster",
        "the torchft lighthouse of a launched DiLoCo plan",
    ),
    # the operator namespace: coefficients, benchmark Jobs and the benchmark's narrow Role
    Permission(
        "",
        "configmaps",
        ("get", "create", "patch"),
        "operator-namespace",
        "the coefficients ConfigMap of every GPUPool",
    ),
    Permission(
        "rbac.authorization.k8s.io",
        "roles",
        ("get", "create"),
        "operator-namespace",
        "a Role letting the bench Job patch only its pool's ConfigMap",
    ),
    Permission(
        "rbac.authorization.k8s.io",
        "rolebindings",
        ("get", "create"),
        "operator-namespace",
        "binds that Role to the bench ServiceAccount",
    ),
)

BENCH_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "",
        "configmaps",
        ("get", "patch"),
        "operator-namespace",
        "publish the coefficients (granted per pool with resourceNames by the operator)",
    ),
)
