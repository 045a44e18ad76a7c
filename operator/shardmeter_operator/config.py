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

    ENV: ClassVar[dict[str, str]] = {
        "namespace": "POD_NAMESPACE",
        "bench_image": "SHARDMETER_BENCH_IMAGE",
        "bench_service_account": "SHARDMETER_BENCH_SERVICE_ACCOUNT",
        "recheck_interval_s": "SHARDMETER_RECHECK_INTERVAL_S",
        "retry_backoff_s": "SHARDMETER_RETRY_BACKOFF_S",
        "kubeconfig": "SHARDMETER_KUBECONFIG",
    }

    @classmethod
    def from_env(cls, **overrides: Any) -> OperatorConfig:
        """Defaults, then environment variables, then non-None ``overrides`` (flags)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = os.environ.get(cls.ENV[f.name])
            if raw:
                values[f.name] = float(raw) if f.type == "float" else raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
