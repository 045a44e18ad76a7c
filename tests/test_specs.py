"""Specs and presets: parameter counts match the published models, errors name fields."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from shardmeter.errors import SpecError, spec_error_from_validation
from shardmeter.spec import GPUSpec, PoolSpec, StrategySpec, TrainingSpec, TransformerSpec
from shardmeter.spec.base import parse_bandwidth, parse_bytes, parse_seconds
from shardmeter.spec.hardware import GPU_PRESETS, LINK_PRESETS
from shardmeter.spec.loading import gpu_from_arg, model_from_arg
from shardmeter.spec.model import MODEL_PRESETS

# Published totals (Hugging Face model cards / safetensors metadata).
PUBLISHED_PARAMS = {
    "smollm-360m": 362e6,
    "llama-3.2-1b": 1.24e9,
    "phi-1.5": 1.42e9,
    "gemma-2b": 2.51e9,
    "yi-1.5-6b": 6.06e9,
    "llama-3.1-8b": 8.03e9,
    "llama-3.1-70b": 70.6e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_preset_parameter_counts_match_published_figures(name: str) -> None:
    total = MODEL_PRESETS[name].total_params
    assert abs(total / PUBLISHED_PARAMS[name] - 1) < 0.01, f"{name}: {total:,}"


def test_every_preset_is_pinned() -> None:
    assert set(MODEL_PRESETS) == set(PUBLISHED_PARAMS)


def test_exact_counts_from_the_configs() -> None:
    # Exact totals from the models' configs (HF `num_parameters()`).
    assert MODEL_PRESETS["phi-1.5"].total_params == 1_418_270_720
    assert MODEL_PRESETS["llama-3.2-1b"].total_params == 1_235_814_400
    assert MODEL_PRESETS["llama-3.1-8b"].total_params == 8_030_261_248


def test_gemma_head_dim_is_explicit() -> None:
    gemma = MODEL_PRESETS["gemma-2b"]
    assert gemma.head_width == 256 and gemma.q_dim == 2048 and gemma.kv_dim == 256


def test_flops_per_token_is_six_n_plus_attention() -> None:
    m = MODEL_PRESETS["llama-3.1-8b"]
    s = 4096
    matmul = m.num_layers * m.matmul_params_per_block + m.vocab_size * m.hidden_size
    expected = 6 * matmul + 12 * m.num_layers * s * m.q_dim
    assert m.training_flops_per_token(s) == pytest.approx(expected)
    assert m.training_flops_per_token(s) == pytest.approx(3 * m.forward_flops_per_token(s))


def test_head_grouping_must_divide() -> None:
    with pytest.raises(ValidationError, match="multiple of num_key_value_heads"):
        TransformerSpec(
            hidden_size=64,
            num_layers=2,
            num_attention_heads=6,
            num_key_value_heads=4,
            intermediate_size=128,
            vocab_size=100,
        )


def test_gpu_presets_have_datasheet_figures() -> None:
    h200 = GPU_PRESETS["h200-141gb-sxm"]
    assert h200.peak_bf16_flop_per_s == pytest.approx(989.4e12)
    assert h200.memory_bytes > GPU_PRESETS["h100-80gb-sxm"].memory_bytes
    for gpu in GPU_PRESETS.values():
        assert gpu.peak_bf16_flop_per_s > gpu.peak_fp32_flop_per_s or gpu.name == "L40S"
        assert gpu.default_intra_node_link in LINK_PRESETS


def test_pool_links_default_from_gpu() -> None:
    # HGX/DGX A100: NVLink 3 inside, 8 × 200 Gbit/s HDR InfiniBand rails out
    a100 = PoolSpec(name="b", gpu="a100-80gb-sxm", nodes=2, gpus_per_node=8)
    net = a100.node_network
    assert a100.intra.name == "nvlink3" and net.kind == "infiniband"
    assert net.nics_per_node == 8 and net.nic_bandwidth_bytes_per_s == pytest.approx(25e9)
    h100 = PoolSpec(name="h", gpu="h100", nodes=2, gpus_per_node=8).node_network
    assert h100.nics_per_node == 8 and h100.nic_bandwidth_bytes_per_s == pytest.approx(50e9)
    l40s = PoolSpec(name="c", gpu="l40s", nodes=1, gpus_per_node=4, interNodeLink="eth-400g")
    assert l40s.intra.kind == "pcie" and l40s.inter.name == "eth-400g"


def test_legacy_inter_node_link_means_one_rail_per_gpu() -> None:
    # interNodeLink: ib-ndr on an 8-GPU node = 8 NICs of 400 Gbit/s
    pool = PoolSpec(name="p", gpu="h100", nodes=2, gpus_per_node=8, interNodeLink="ib-ndr")
    assert pool.node_network.nics_per_node == 8
    assert pool.node_network.node_bandwidth_bytes_per_s == pytest.approx(8 * 50e9)
    # a per-GPU share of a shared NIC (400 Gbit/s per node / 8 GPUs) is the same node bandwidth
    share = {
        "name": "node-400g-per8",
        "kind": "ethernet",
        "latencyS": 1e-5,
        "bandwidthBytesPerS": 6.25e9,
    }
    shared = PoolSpec(name="s", gpu="h100", nodes=2, gpus_per_node=8, interNodeLink=share)
    assert shared.node_network.node_bandwidth_bytes_per_s == pytest.approx(50e9)


def test_network_in_plain_units_and_exclusive_with_legacy_link() -> None:
    pool = PoolSpec(
        name="p",
        gpu="h200",
        nodes=4,
        gpus_per_node=8,
        network={"nicsPerNode": 8, "nicBandwidthBytesPerS": "400 Gbit/s", "railOptimized": True},
    )
    assert pool.node_network.node_bandwidth_bytes_per_s == pytest.approx(400e9)
    with pytest.raises(ValidationError, match="not both"):
        PoolSpec(
            name="p",
            gpu="h200",
            nodes=4,
            gpus_per_node=8,
            network={"nicsPerNode": 8, "nicBandwidthBytesPerS": "400 Gbit/s"},
            interNodeLink="ib-ndr",
        )


def test_unit_strings() -> None:
    assert parse_bandwidth("10 Gbit/s") == pytest.approx(1.25e9)
    assert parse_bandwidth("10Gb/s") == pytest.approx(1.25e9)
    assert parse_bandwidth("25 GB/s") == pytest.approx(25e9)
    assert parse_seconds("30 ms") == pytest.approx(0.03)
    assert parse_bytes("80 GiB") == 80 * 2**30
    with pytest.raises(ValueError, match="unknown unit"):
        parse_bandwidth("10 furlongs/s")
    link = LINK_PRESETS["wan-10g-30ms"]
    assert link.bandwidth_bytes_per_s == pytest.approx(1.25e9) and link.latency_s == pytest.approx(
        0.03
    )


@pytest.mark.parametrize(
    ("parse", "bad"),
    [(parse_bandwidth, "10 Gbyte/s"), (parse_seconds, "3 days"), (parse_bytes, "80 GiBs")],
)
def test_an_unknown_unit_lists_the_units_as_written_and_each_one_parses(
    parse: Callable[[str], float], bad: str
) -> None:
    with pytest.raises(ValueError, match="unknown unit") as info:
        parse(bad)
    listed = str(info.value).split("use one of: ", 1)[1]
    assert "_" not in listed and "'" not in listed, listed  # no internal keys, no Python list
    listed = listed.replace("(b: bits, B: bytes)", "")
    listed = re.sub(r"\((?:also|or) ([^)]*)\)", r", \1", listed)
    units = [u.strip() for u in listed.split(",") if u.strip()]
    assert len(units) >= 6
    for unit in units:
        assert parse(f"2 {unit}") > 0, unit


def test_unknown_preset_error_names_field_and_suggests() -> None:
    with pytest.raises(ValidationError) as info:
        PoolSpec(name="a", gpu="h200-141gb-sxn", nodes=1, gpus_per_node=8)
    err = spec_error_from_validation(info.value, "pools[0]")
    assert err.field == "pools[0].gpu"
    assert "did you mean 'h200-141gb-sxm'" in str(err)


@pytest.mark.parametrize(
    ("name", "says", "never"),
    [
        # a variant of a preset (memory size in the name): the variant syntax, not another size
        ("a100-40gb", "{preset: a100, memoryBytes: 40 GB}", "did you mean"),
        ("h100-94gb", "{preset: h100, memoryBytes: 94 GB}", "did you mean"),
        # another form factor of a preset's GPU: the preset with the figures that differ
        ("h100-pcie", "{preset: h100, ", "did you mean"),
        # another GPU: how to describe one, no preset of a different GPU offered
        ("b200", "no preset for this GPU", "h200 preset"),
        ("a10", "no preset for this GPU", "did you mean"),
        # a typo of a preset name: the preset
        ("h200-141gb-sxn", "(did you mean 'h200-141gb-sxm'?); presets: a100,", "variant"),
    ],
)
def test_an_unknown_gpu_name_gets_the_variant_syntax_or_a_typo_fix_never_another_gpu(
    name: str, says: str, never: str
) -> None:
    with pytest.raises(SpecError) as info:
        gpu_from_arg(name)
    message = str(info.value)
    assert says in message and never not in message, message
    assert "; presets: a100, " in message  # a separator before the list
    if says.endswith("}"):  # the variant syntax offered is accepted as written
        spec = gpu_from_arg(says)
        size = int(says.split("memoryBytes: ")[1].split(maxsplit=1)[0])
        assert spec.memory_bytes == size * 10**9 and spec.name.endswith(f"(memoryBytes={size} GB)")


def test_extra_field_is_rejected_with_its_name() -> None:
    with pytest.raises(ValidationError) as info:
        GPUSpec.model_validate({**GPU_PRESETS["l40s"].model_dump(), "colour": "green"})
    err = spec_error_from_validation(info.value)
    assert err.field == "colour" and "unknown field" in err.message


def test_preset_with_overrides_and_camel_case() -> None:
    pool = PoolSpec.model_validate(
        {
            "name": "a",
            "gpu": {"preset": "h100", "memoryBytes": "40 GiB"},
            "nodes": 1,
            "gpusPerNode": 4,
            "pricePerGpuHourUsd": 2.5,
        }
    )
    # the name says the variant is not the preset (issue 26)
    assert pool.gpu.memory_bytes == 40 * 2**30
    assert pool.gpu.name == "H100-80GB-SXM (memoryBytes=40 GiB)"
    assert pool.price_per_gpu_hour_usd == 2.5
    assert pool.model_dump()["gpusPerNode"] == 4  # serialises camelCase for custom resources


def test_pool_name_must_be_dns_label() -> None:
    with pytest.raises(ValidationError, match="DNS-1123"):
        PoolSpec(name="Cluster_A", gpu="h200", nodes=1, gpus_per_node=8)


def test_training_batch_must_be_whole_sequences() -> None:
    with pytest.raises(ValidationError, match="multiple of seqLenTokens"):
        TrainingSpec(seq_len_tokens=4096, global_batch_tokens=10000)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sync_every": 100, "fragments": 3}, "multiple of fragments"),
        (
            {"sync_every": 100, "fragments": 4, "fragment_sync_delay": 25},
            "must be < syncEvery / fragments = 25",
        ),
        ({"kind": "diloco", "fragments": 2}, "fragments must be 1"),
        ({"sync_every": 0}, "must be between 1 and 10,000 or 'auto'"),
    ],
)
def test_torchft_rules(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        StrategySpec.model_validate(kwargs)


def test_valid_streaming_settings_and_auto() -> None:
    s = StrategySpec(sync_every=100, fragments=4, fragment_sync_delay=24)
    assert s.is_diloco
    assert StrategySpec().sync_every == "auto"


def test_model_from_file_and_preset(tmp_path: Path) -> None:
    f = tmp_path / "tiny.yaml"
    f.write_text(
        "name: tiny\nhiddenSize: 256\nnumLayers: 2\nnumAttentionHeads: 4\n"
        "intermediateSize: 512\nvocabSize: 1000\n"
    )
    assert model_from_arg(str(f)).num_layers == 2
    assert model_from_arg("Llama-3.1-8B").hidden_size == 4096
    assert gpu_from_arg("H200").name == "H200-141GB-SXM"


def test_model_file_errors_name_file_and_field(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(
        "hiddenSize: -3\nnumLayers: 2\nnumAttentionHeads: 4\nintermediateSize: 512\nvocabSize: 10\n"
    )
    with pytest.raises(SpecError) as info:
        model_from_arg(str(f))
    assert info.value.source == str(f) and info.value.field == "hiddenSize"
    assert info.value.message == "must be between 1 and 65,536 (got -3)"
    broken = tmp_path / "broken.yaml"
    broken.write_text("hiddenSize: [1,\n")
    with pytest.raises(SpecError, match="invalid YAML"):
        model_from_arg(str(broken))
