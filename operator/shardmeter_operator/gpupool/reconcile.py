"""GPUPool reconciliation, the acting half: read what the pool's decision needs (its
coefficients ConfigMap, its running benchmark Job), decide (:func:`~.gpupool.decide.decide_pool`,
pure), then write the ConfigMap and create the benchmark's children (the controller writes the
status and publishes the gauges).

Level-triggered: the same function runs when the pool, its coefficients ConfigMap or its
benchmark Job change (and when a benchmark retry is due). Running it twice changes nothing
the second time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from shardmeter.cost.observed import ObservedStepSample
from shardmeter_operator.api import GPUPoolStatus
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.gpupool.decide import PoolDecision, PoolInputs, decide_pool, pool_reads
from shardmeter_operator.k8s.client import Kube


async def reconcile_pool(
    body: Mapping[str, Any],
    cfg: OperatorConfig,
    kube: Kube,
    samples: Sequence[ObservedStepSample] = (),
) -> PoolDecision:
    """The new status of a GPUPool (see the module docstring); ``samples``: steps observed
    on the pool by launched plans, for its observed correction (:mod:`~.gpupool.correction`)."""
    meta = body.get("metadata") or {}
    name, generation = str(meta["name"]), int(meta.get("generation") or 1)
    spec = body.get("spec") or {}
    status = GPUPoolStatus.model_validate(body.get("status") or {})
    reads = pool_reads(name, spec, status, generation)
    ns = cfg.namespace
    inputs = PoolInputs(
        name=name,
        uid=str(meta["uid"]),
        generation=generation,
        spec=spec,
        status=status,
        now=datetime.now(UTC),
        configmap=await kube.get("v1", "ConfigMap", ns, reads.configmap)
        if reads.configmap
        else None,
        bench_job=await kube.get("batch/v1", "Job", ns, reads.bench_job)
        if reads.bench_job
        else None,
        samples=samples,
        annotations=meta.get("annotations") or {},
    )
    decision = decide_pool(inputs, cfg)
    await apply_pool(name, decision, reads.configmap or "", ns, kube)
    return decision


async def apply_pool(
    name: str, decision: PoolDecision, configmap: str, namespace: str, kube: Kube
) -> None:
    """The decision's writes, in order (the status and the gauges are the controller's)."""
    if decision.configmap_create is not None:
        await kube.create(decision.configmap_create)
    elif decision.configmap_data is not None:
        await kube.patch("v1", "ConfigMap", namespace, configmap, {"data": decision.configmap_data})
    for manifest in decision.create:
        await kube.create(manifest)
