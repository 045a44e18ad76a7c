"""Operator settings (flags and environment), shared with handlers through kopf's memo."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, ClassVar


@dataclass(frozen=True)
class OperatorConfig:
    namespace: str = "shardmeter-system"
    """Where coefficients ConfigMaps, benchmark Jobs and their Roles live."""
    bench_image: str = "ghcr.io/shardmeter/bench:0.1.0"
    bench_service_account: str = "shardmeter-bench"
    recheck_interval_s: float = 30.0
    """How long a launch blocked by a name conflict waits before it looks again (everything
    else is driven by watch events)."""
    retry_backoff_s: float = 60.0
    """First benchmark retry delay; doubles per attempt."""
    kubeconfig: str | None = None
    """Outside a cluster: the kubeconfig to use (default $KUBECONFIG)."""
    observe_interval_s: float = 60.0
    """How often a launched plan's running islands are observed (0: never)."""
    observe_tail_lines: int = 2000
    """Lines of rank 0's log read per island and observation (``tailLines``)."""
    observe_limit_bytes: int = 1 << 20
    """Bytes read at most per island and observation (``limitBytes``)."""
    observe_window: int = 20
    """Recent torchtitan metric lines an observation summarises."""
    observed_min_samples: int = 2
    """Observed islands a pool's correction needs before plans use it."""
    prometheus_url: str = ""
    """Prometheus for plans that name a step-seconds query (empty: the log only)."""
    default_workload: str = "auto"
    """What a launch creates when ``spec.workload`` is unset: ``Job``, ``JobSet``, or ``auto``
    (JobSet where the cluster serves it, else Job; the Launched condition says which)."""
    kueue_namespace: str = "kueue-system"
    """Where Kueue runs: the MultiKueueClusters' kubeconfig Secrets live there."""
    read_worker_kubeconfigs: bool = False
    """Read the worker clusters' pods (islands of a launch through MultiKueue) with the
    kubeconfig Secrets of their MultiKueueClusters (:mod:`~.k8s.clusters`)."""
    admission_port: int = 0
    """Port of the placement admission webhook's HTTPS server (0: no webhook)."""
    admission_cert_dir: str = ""
    """A directory with ``tls.crt`` and ``tls.key`` (cert-manager's Secret) for the webhook;
    empty: kopf's self-signed certificate (needs the ``certbuilder`` package)."""
    admission_host: str = ""
    """The hostname the webhook is reached by (its Service's DNS name), for the self-signed
    certificate."""
    admission_inject_ca: str = ""
    """The name of the Mutating- and ValidatingWebhookConfiguration (the chart's) whose
    ``caBundle`` the operator sets from its own certificate — the self-signed path; empty:
    cert-manager's CA injector sets it."""
    admission_timeout_s: float = 5.0
    """How long placing one workload may take; keep it below the webhook's timeoutSeconds."""
    admission_failure: str = "closed"
    """When placement cannot decide in time (or fails unexpectedly): ``closed`` denies the
    workload with the reason, ``open`` admits it unplaced with a warning."""

    ENV: ClassVar[dict[str, str]] = {
        "namespace": "POD_NAMESPACE",
        "bench_image": "SHARDMETER_BENCH_IMAGE",
        "bench_service_account": "SHARDMETER_BENCH_SERVICE_ACCOUNT",
        "recheck_interval_s": "SHARDMETER_RECHECK_INTERVAL_S",
        "retry_backoff_s": "SHARDMETER_RETRY_BACKOFF_S",
        "kubeconfig": "SHARDMETER_KUBECONFIG",
        "observe_interval_s": "SHARDMETER_OBSERVE_INTERVAL_S",
        "observe_tail_lines": "SHARDMETER_OBSERVE_TAIL_LINES",
        "observe_limit_bytes": "SHARDMETER_OBSERVE_LIMIT_BYTES",
        "observe_window": "SHARDMETER_OBSERVE_WINDOW",
        "observed_min_samples": "SHARDMETER_OBSERVED_MIN_SAMPLES",
        "prometheus_url": "SHARDMETER_PROMETHEUS_URL",
        "default_workload": "SHARDMETER_DEFAULT_WORKLOAD",
        "kueue_namespace": "SHARDMETER_KUEUE_NAMESPACE",
        "read_worker_kubeconfigs": "SHARDMETER_READ_WORKER_KUBECONFIGS",
        "admission_port": "SHARDMETER_ADMISSION_PORT",
        "admission_cert_dir": "SHARDMETER_ADMISSION_CERT_DIR",
        "admission_host": "SHARDMETER_ADMISSION_HOST",
        "admission_inject_ca": "SHARDMETER_ADMISSION_INJECT_CA",
        "admission_timeout_s": "SHARDMETER_ADMISSION_TIMEOUT_S",
        "admission_failure": "SHARDMETER_ADMISSION_FAILURE",
    }

    @classmethod
    def from_env(cls, **overrides: Any) -> OperatorConfig:
        """Defaults, then environment variables, then non-None ``overrides`` (flags)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = os.environ.get(cls.ENV[f.name])
            if raw:
                if str(f.type) == "bool":
                    values[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
                    continue
                convert = {"float": float, "int": int}.get(str(f.type), str)
                values[f.name] = convert(raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
