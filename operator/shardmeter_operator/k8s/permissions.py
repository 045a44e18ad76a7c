"""Every Kubernetes permission the operator needs, and why. The Helm chart's RBAC is generated
from nothing else: a test compares its ClusterRole and Roles with this list in both modes,
and another replays the operator's real API calls (its Kube facade and kopf's) against them.

Scopes:

* ``cluster`` — always a ClusterRole: cluster-scoped objects (GPUPools, CRDs, kopf's peering);
* ``workload`` — where TrainingPlans live: a ClusterRole when the operator watches every
  namespace; with ``operator.watchNamespaces`` a Role in each watched namespace and in the
  release namespace (which the operator then serves too: its benchmark Jobs live there);
* ``operator-namespace`` — a Role in the release namespace (coefficients ConfigMaps, the
  benchmark's narrow Role);
* ``namespaced-mode`` — a ClusterRole only with ``operator.watchNamespaces`` (kopf lists and
  watches Namespaces to serve a fixed set of them);
* ``multicluster`` — a Role in Kueue's namespace, only with
  ``operator.multiCluster.readWorkerKubeconfigs``;
* ``cluster-events`` — where the Events about cluster-scoped objects (GPUPools) must go, the
  ``default`` namespace: a Role there with ``operator.watchNamespaces`` (the workload
  ClusterRole covers it otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Permission:
    api_group: str
    resource: str
    verbs: tuple[str, ...]
    scope: str
    """"cluster" | "workload" | "operator-namespace" | "namespaced-mode" | "multicluster" |
    "cluster-events" (module docstring)."""
    why: str


PERMISSIONS: tuple[Permission, ...] = (
    # GPUPools (cluster-scoped): watched; patch only to drop finalizers an older version left
    Permission(
        "shardmeter.io",
        "gpupools",
        ("get", "list", "watch", "patch"),
        "cluster",
        "the operator watches GPUPools (patch: kopf removes finalizers left by v0.1)",
    ),
    Permission(
        "shardmeter.io",
        "gpupools/status",
        ("patch",),
        "cluster",
        "GPUPool status (written with a merge patch, never read through the subresource)",
    ),
    Permission(
        "shardmeter.io",
        "gpupools/finalizers",
        ("update",),
        "cluster",
        "set blockOwnerDeletion on the ConfigMaps, Jobs and Roles a GPUPool owns "
        "(clusters enforcing OwnerReferencesPermissionEnforcement)",
    ),
    Permission(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        ("get", "list", "watch"),
        "cluster",
        "kopf discovers the CRDs; a launch reads JobSet's and Kueue's to choose the workload",
    ),
    Permission(
        "kueue.x-k8s.io",
        "resourceflavors",
        ("get",),
        "cluster",
        "a GPUPool's spec.kueue.flavor: its node labels and taints, checked at launch",
    ),
    Permission(
        "kueue.x-k8s.io",
        "clusterqueues",
        ("get",),
        "cluster",
        "a site queue's ClusterQueue: its MultiKueue admission check, checked at launch",
    ),
    Permission(
        "kueue.x-k8s.io",
        "admissionchecks",
        ("get",),
        "cluster",
        "a site queue's admission checks: one must be MultiKueue's, checked at launch",
    ),
    Permission(
        "kueue.x-k8s.io",
        "multikueueconfigs",
        ("get",),
        "cluster",
        "a site queue's MultiKueueConfig must list the site's worker cluster alone",
    ),
    Permission(
        "kueue.x-k8s.io",
        "multikueueclusters",
        ("get",),
        "cluster",
        "a worker cluster's kubeconfig Secret, named by its MultiKueueCluster (observation)",
    ),
    Permission(
        "",
        "secrets",
        ("get",),
        "multicluster",
        "the MultiKueueClusters' kubeconfig Secrets in Kueue's namespace, to read the pods of "
        "islands in worker clusters (only with multiCluster.readWorkerKubeconfigs)",
    ),
    Permission(
        "kopf.dev",
        "clusterkopfpeerings",
        ("get", "list", "watch", "patch", "create"),
        "cluster",
        "leader election between replicas (kopf peering); the operator creates its peering",
    ),
    Permission(
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        ("get", "patch"),
        "cluster",
        "the placement webhook's self-signed path: the operator sets its caBundle",
    ),
    Permission(
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        ("get", "patch"),
        "cluster",
        "the placement webhook's self-signed path: the operator sets its caBundle",
    ),
    Permission(
        "",
        "namespaces",
        ("list", "watch"),
        "namespaced-mode",
        "kopf lists and watches Namespaces to serve the watched ones",
    ),
    # TrainingPlans and their children, where the plans are
    Permission(
        "shardmeter.io",
        "trainingplans",
        ("get", "list", "watch", "patch", "create"),
        "workload",
        "the operator watches TrainingPlans (patch: kopf removes finalizers left by v0.1); "
        "creates the one recording a workload placed at admission",
    ),
    Permission(
        "shardmeter.io",
        "trainingplans/status",
        ("patch",),
        "workload",
        "TrainingPlan status (written with a merge patch, never read through the subresource)",
    ),
    Permission(
        "shardmeter.io",
        "trainingplans/finalizers",
        ("update",),
        "workload",
        "set blockOwnerDeletion on the Jobs, Services and Deployments a TrainingPlan owns",
    ),
    Permission(
        "batch",
        "jobs",
        ("get", "list", "watch", "create", "delete"),
        "workload",
        "island Jobs (and benchmark Jobs): created, followed, deleted by a relaunch",
    ),
    Permission(
        "",
        "services",
        ("get", "list", "create", "delete"),
        "workload",
        "a headless Service per Job (rendezvous) and the torchft lighthouse's; deleted by a "
        "relaunch",
    ),
    Permission(
        "apps",
        "deployments",
        ("get", "list", "create", "delete"),
        "workload",
        "the torchft lighthouse of a launched DiLoCo plan; deleted by a relaunch",
    ),
    Permission(
        "jobset.x-k8s.io",
        "jobsets",
        ("get", "list", "watch", "create", "delete"),
        "workload",
        "the JobSet of a plan launched as workload JobSet: created, followed, deleted by a "
        "relaunch",
    ),
    Permission(
        "jobset.x-k8s.io",
        "jobsets/finalizers",
        ("update",),
        "workload",
        "set blockOwnerDeletion on the TrainingPlan and lighthouse a JobSet placed at "
        "admission owns",
    ),
    Permission(
        "trainer.kubeflow.org",
        "trainjobs",
        ("get", "list", "watch"),
        "workload",
        "Kubeflow Trainer v2 TrainJobs placed at admission: their TrainingPlan follows them",
    ),
    Permission(
        "trainer.kubeflow.org",
        "trainjobs/finalizers",
        ("update",),
        "workload",
        "set blockOwnerDeletion on the TrainingPlan a TrainJob placed at admission owns",
    ),
    Permission(
        "",
        "configmaps",
        ("get",),
        "workload",
        "the model architecture a workload placed at admission names "
        "(shardmeter.io/model-configmap)",
    ),
    Permission(
        "kueue.x-k8s.io",
        "workloads",
        ("list", "watch"),
        "workload",
        "Kueue's Workloads of a queued plan's JobSet or Jobs: QuotaReserved and Admitted",
    ),
    Permission(
        "kueue.x-k8s.io",
        "localqueues",
        ("get",),
        "workload",
        "spec.queueName must name a LocalQueue of the plan's namespace",
    ),
    Permission(
        "",
        "pods",
        ("list",),
        "workload",
        "find rank 0's pod of a running island (by its Job's labels) to observe it",
    ),
    Permission(
        "",
        "pods/log",
        ("get",),
        "workload",
        "read rank 0's log (bounded tail) for step times and fragment syncs; never exec",
    ),
    Permission(
        "",
        "events",
        ("create", "list", "watch"),
        "workload",
        "Events on the operator's objects; the Job controller's FailedCreate Events "
        "(pods rejected by quota or PodSecurity)",
    ),
    Permission(
        "events.k8s.io", "events", ("create",), "workload", "kopf posts Events (events.k8s.io)"
    ),
    # Events about GPUPools: kube-apiserver keeps those about cluster-scoped objects in default
    Permission(
        "",
        "events",
        ("create",),
        "cluster-events",
        "Events on GPUPools, which kube-apiserver accepts only in the default namespace",
    ),
    Permission(
        "events.k8s.io",
        "events",
        ("create",),
        "cluster-events",
        "kopf's Events on GPUPools (the default namespace too)",
    ),
    # the operator namespace: coefficients and the benchmark's narrow Role
    Permission(
        "",
        "configmaps",
        ("get", "watch", "create", "patch"),
        "operator-namespace",
        "the coefficients ConfigMap of every GPUPool, watched for edits (a watch without a "
        "list: the first events are the ConfigMaps there)",
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
