"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import strategies as st

from shardmeter.plan.schema import PlanSpec
from shardmeter.spec.model import MLPKind, TransformerSpec


@st.composite
def transformer_specs(draw: st.DrawFn, max_hidden_heads: int = 64) -> TransformerSpec:
    head_dim = draw(st.sampled_from([32, 64, 128]))
    kv = draw(st.integers(1, 8))
    group = draw(st.integers(1, 4))
    heads = kv * group
    return TransformerSpec(
        name="random",
        hidden_size=heads * head_dim,
        num_layers=draw(st.integers(1, 48)),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=draw(st.integers(64, 32768)),
        vocab_size=draw(st.integers(1000, 200_000)),
        tie_embeddings=draw(st.booleans()),
        mlp_kind=draw(st.sampled_from(list(MLPKind))),
    )


GPU_PRESETS = ["a100", "h100", "h200", "l40s"]
WAN_PRESETS = ["wan-10g-30ms", "wan-1g-80ms", "wan-100g-10ms"]


@st.composite
def tiny_plans(draw: st.DrawFn) -> dict[str, Any]:
    """Small planning requests a brute force can enumerate in a fraction of a second: a
    one-to-four-block model, one to three pools of one to three nodes with one, two or four
    GPUs each, a global batch of up to a dozen sequences, both runtimes, every strategy,
    random convergence guard-rails, hsdp shard groups of one to three nodes and pinned
    Streaming DiLoCo fragments. Drawn from a seed with uniform choices (hypothesis' own
    choices favour the simplest values), so multi-pool plans and both runtimes are common;
    prices are continuous, so plans rarely tie on cost."""
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    pools = []
    for i in range(rnd.choice([1, 2, 2, 3, 3, 3, 3])):
        pools.append(
            {
                "name": f"p{i}",
                "gpu": rnd.choice(GPU_PRESETS),
                "nodes": rnd.randint(1, 3),
                "gpusPerNode": rnd.choice([1, 2, 4]),
                "site": rnd.choice(["a", "a", "b"]),
                "wanUplink": rnd.choice(WAN_PRESETS),
                "pricePerGpuHourUsd": round(rnd.uniform(0.5, 4.0), 6),
                **({"maxNodes": rnd.randint(1, 2)} if rnd.random() < 0.1 else {}),
            }
        )
    kind = rnd.choice(["streaming-diloco"] * 4 + ["diloco", "fsdp"])
    seq = 256
    strategy: dict[str, Any] = {
        "kind": kind,
        "outerPrecision": rnd.choice(["bf16", "fp32"]),
        "maxSyncEvery": rnd.choice([10, 20, 50, 500]),
        "maxFragmentSyncDelay": rnd.choice([0, 1, 2, 5]),
    }
    constraints: dict[str, Any] = {
        "maxIslands": rnd.choice([1, 2, 3, 4, 4]),
        "globalBatchTolerance": rnd.choice([0.0, 0.1, 0.25, 0.5]),
    }
    if rnd.random() < 0.3:
        constraints["maxGpus"] = rnd.randint(1, 8)
    if rnd.random() < 0.2:
        constraints["minGpusPerIsland"] = rnd.randint(1, 2)
    layers = rnd.randint(1, 4)
    training: dict[str, Any] = {
        "seqLenTokens": seq,
        "globalBatchTokens": seq * rnd.randint(1, 12),
        "totalTokens": 10**9,
        "activationCheckpointing": rnd.choice(["none", "full", "selective-op"]),
        "gradientSync": rnd.choice(["every-micro-batch", "last-micro-batch", "auto"]),
    }
    runtime = rnd.choice(["torchtitan-ft", "weighted"])
    # drawn last, so that the instances drawn before hsdp and pinned fragments stay as they were
    if rnd.random() < 0.3:  # islands must be whole shard groups
        training |= {"sharding": "hsdp", "shardGroupNodes": rnd.choice([1, 2, 2, 3])}
    if kind == "streaming-diloco" and rnd.random() < 0.25:  # auto syncEvery: multiples of P
        strategy["fragments"] = rnd.randint(1, layers)
    # what a plan really costs (issue 25), drawn after everything above
    objective: dict[str, Any] = {"kind": "min-time", "qualityAdjusted": rnd.random() < 0.6}
    for pool in pools:
        pool["pue"] = round(rnd.uniform(1.0, 2.0), 3)
        pool["gridCarbonIntensityGPerKwh"] = rnd.choice([30.0, 250.0, 480.0, 800.0])
        if rnd.random() < 0.4:
            pool["wanEgressUsdPerGB"] = round(rnd.uniform(0.0, 0.1), 4)
        if rnd.random() < 0.3:
            pool["exclusiveNodes"] = True
    strategy["outerPrecision"] = rnd.choice(["bf16", "fp32", "fp8", "int8", "fp4"])
    strategy["layersPerFragment"] = rnd.choice([1, 2, 3])
    strategy["maxFragmentSyncDelayFraction"] = rnd.choice([0.0, 0.05, 0.2, 1.0])
    if rnd.random() < 0.3:
        strategy |= {"beyondMeasuredIslands": "cap", "maxMeasuredIslands": rnd.randint(1, 3)}
    # pinned settings (the search's quality bounds take each H's least τ), drawn after the rest
    if kind == "streaming-diloco" and rnd.random() < 0.2:
        strategy["fragmentSyncDelay"] = rnd.choice([0, 1, 2])
    if kind != "fsdp" and "fragments" not in strategy and rnd.random() < 0.15:
        strategy["syncEvery"] = rnd.choice([4, 10, 20])
    return {
        "model": {
            "name": "tiny",
            "hiddenSize": 256,
            "numLayers": layers,
            "numAttentionHeads": 4,
            "numKeyValueHeads": 2,
            "intermediateSize": 512,
            "vocabSize": 1000,
        },
        "training": training,
        "strategy": strategy,
        "pools": pools,
        "constraints": constraints,
        "runtime": runtime,
        "objective": objective,
    }


TINY = {
    "name": "tiny",
    "hiddenSize": 512,
    "numLayers": 4,
    "numAttentionHeads": 8,
    "numKeyValueHeads": 4,
    "intermediateSize": 1536,
    "vocabSize": 8000,
}
GPUS = [("a100", 1.19), ("h100", 2.49), ("h200", 3.59), ("l40s", 0.86)]


def random_spec(
    seed: int,
    strategy: str = "streaming-diloco",
    objective: dict | None = None,
    runtime: str = "weighted",
) -> PlanSpec:
    """A fixed medium instance per seed: 2–3 pools of up to 4 nodes × 4 GPUs, a tiny model,
    batches of 8–24 sequences."""
    rnd = random.Random(seed)
    pools = []
    for i in range(rnd.choice([2, 3])):
        gpu, price = rnd.choice(GPUS)
        pools.append(
            {
                "name": f"p{i}",
                "gpu": gpu,
                "nodes": rnd.randint(1, 4),
                "gpusPerNode": rnd.choice([2, 4]),
                "site": rnd.choice(["a", "b"]),
                "wanUplink": rnd.choice(["wan-10g-30ms", "wan-1g-80ms"]),
                "pricePerGpuHourUsd": round(price * rnd.uniform(0.8, 1.2), 3),
            }
        )
    seq = 512
    return PlanSpec.model_validate(
        {
            "model": TINY,
            "training": {
                "seqLenTokens": seq,
                "globalBatchTokens": seq * rnd.choice([8, 12, 16, 24]),
                "totalTokens": 10**9,
            },
            "strategy": {"kind": strategy, "outerPrecision": rnd.choice(["bf16", "fp32"])},
            "pools": pools,
            "constraints": {
                "maxIslands": rnd.choice([2, 3, 4]),
                "globalBatchTolerance": rnd.choice([0.0, 0.1]),
            },
            "objective": objective or {"kind": "min-time"},
            "runtime": runtime,
        }
    )
