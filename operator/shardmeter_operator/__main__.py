"""``python -m shardmeter_operator``: run the operator (kopf embedded).

It stops on SIGTERM/SIGINT (kopf's cleanup runs, no reconcile starts after it) and exits 0;
if kopf's orchestration fails it logs why, with the traceback, and exits 1 so that the
kubelet restarts it. Either way the process ends as soon as its logs are flushed
(:func:`exit_now`): a worker thread still in an API call or a search does not hold it up.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import kopf
import structlog

from shardmeter_operator import log, metrics, worker
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.controller import random_priority
from shardmeter_operator.handlers import build_registry


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="shardmeter-operator", description="The ShardMeter Kubernetes operator."
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch TrainingPlans in this namespace (repeatable; glob patterns allowed)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    p.add_argument(
        "--operator-namespace",
        help="where coefficients ConfigMaps and bench Jobs live "
        "(default $POD_NAMESPACE or shardmeter-system)",
    )
    p.add_argument("--bench-image", help="image of the benchmark Job")
    p.add_argument("--bench-service-account", help="ServiceAccount of benchmark Jobs")
    p.add_argument(
        "--recheck-interval", type=float, help="seconds between coefficient re-checks (default 30)"
    )
    p.add_argument(
        "--retry-backoff", type=float, help="first benchmark retry delay in seconds (default 60)"
    )
    p.add_argument("--kubeconfig", help="kubeconfig outside a cluster (default $KUBECONFIG)")
    p.add_argument(
        "--observe-interval",
        type=float,
        help="seconds between reads of a launched plan's island logs (default 60; 0: never)",
    )
    p.add_argument(
        "--observe-tail-lines", type=int, help="log lines read per island (default 2000)"
    )
    p.add_argument(
        "--observe-limit-bytes", type=int, help="log bytes read per island (default 1 MiB)"
    )
    p.add_argument(
        "--observe-window", type=int, help="metric lines an observation summarises (default 20)"
    )
    p.add_argument(
        "--observed-min-samples",
        type=int,
        help="observed islands a pool's correction needs before plans use it (default 2)",
    )
    p.add_argument(
        "--prometheus-url",
        help="Prometheus for plans with spec.observe.stepSecondsQuery (default: none)",
    )
    p.add_argument(
        "--default-workload",
        choices=["auto", "Job", "JobSet"],
        help="what a launch creates when spec.workload is unset (default auto: JobSet where the "
        "cluster serves it, else Job)",
    )
    p.add_argument(
        "--kueue-namespace",
        help="where Kueue runs: the MultiKueueClusters' kubeconfig Secrets (default kueue-system)",
    )
    p.add_argument(
        "--read-worker-kubeconfigs",
        action="store_true",
        default=None,
        help="read the pods of islands in MultiKueue's worker clusters with the kubeconfig "
        "Secrets of their MultiKueueClusters (needs get on Secrets in the Kueue namespace)",
    )
    p.add_argument(
        "--admission-port",
        type=int,
        help="HTTPS port of the placement admission webhook (default 0: no webhook)",
    )
    p.add_argument(
        "--admission-cert-dir",
        help="directory with tls.crt and tls.key (default: kopf's self-signed certificate)",
    )
    p.add_argument("--admission-host", help="hostname of the webhook (its Service's DNS name)")
    p.add_argument(
        "--admission-inject-ca",
        help="webhook configurations (by name) whose caBundle the operator sets (self-signed)",
    )
    p.add_argument(
        "--admission-timeout", type=float, help="seconds placing one workload may take (5)"
    )
    p.add_argument(
        "--admission-failure",
        choices=["open", "closed"],
        help="placement out of time or failed: admit unplaced (open) or deny (closed, default)",
    )
    p.add_argument(
        "--standalone", action="store_true", help="no peering with other operator instances"
    )
    p.add_argument(
        "--peering",
        default="shardmeter",
        help="kopf ClusterKopfPeering name shared by the replicas (leader election: the live "
        "replica with the highest priority works, the others wait)",
    )
    p.add_argument(
        "--priority",
        type=int,
        help="peering priority (default: random per process, so that replicas never tie)",
    )
    p.add_argument(
        "--metrics-port", type=int, default=9090, help="Prometheus /metrics port (0 disables)"
    )
    p.add_argument(
        "--liveness", default="http://0.0.0.0:8080/healthz", help="kopf liveness endpoint URL"
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument(
        "--log-json", action="store_true", default=None, help="JSON logs (default: when not a TTY)"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    worker.limit_arenas()
    log.configure(args.log_level, args.log_json)
    config = OperatorConfig.from_env(
        namespace=args.operator_namespace,
        bench_image=args.bench_image,
        bench_service_account=args.bench_service_account,
        recheck_interval_s=args.recheck_interval,
        retry_backoff_s=args.retry_backoff,
        kubeconfig=args.kubeconfig,
        observe_interval_s=args.observe_interval,
        observe_tail_lines=args.observe_tail_lines,
        observe_limit_bytes=args.observe_limit_bytes,
        observe_window=args.observe_window,
        observed_min_samples=args.observed_min_samples,
        prometheus_url=args.prometheus_url,
        default_workload=args.default_workload,
        kueue_namespace=args.kueue_namespace,
        read_worker_kubeconfigs=args.read_worker_kubeconfigs,
        admission_port=args.admission_port,
        admission_cert_dir=args.admission_cert_dir,
        admission_host=args.admission_host,
        admission_inject_ca=args.admission_inject_ca,
        admission_timeout_s=args.admission_timeout,
        admission_failure=args.admission_failure,
    )
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    # Namespaced mode also serves the operator's namespace: its coefficients ConfigMaps and
    # benchmark Jobs are watched there (GPUPools are cluster-scoped and always served).
    namespaces = sorted({*args.namespace, config.namespace}) if args.namespace else []
    logger = structlog.get_logger("shardmeter_operator")
    try:
        kopf.run(
            registry=build_registry(config),
            memo=kopf.Memo(config=config, kube=None),
            standalone=args.standalone,
            peering_name=None if args.standalone else args.peering,
            priority=args.priority if args.priority is not None else random_priority(),
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=args.liveness or None,
        )
    except Exception as exc:
        logger.error("operator stopped: it failed", error=str(exc)[:500], exc_info=True)
        return 1
    logger.info("operator stopped")
    return 0


def exit_now(code: int) -> None:
    """Flush the logs and end the process with ``code`` at once: no interpreter shutdown
    that would wait for worker threads (the planning thread, an API call up to its request
    timeout) or log from a half-finalised interpreter."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
