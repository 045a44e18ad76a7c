"""``--publish configmap/NAME``: a patch of an existing ConfigMap's data through the
Kubernetes API, tried against the emulated API server in tests/support."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from shardmeter.cost.coefficients import (
    CONFIGMAP_KEY,
    CoefficientsDocument,
    ComputeSample,
    Samples,
)
from shardmeter.cost.features import Target
from shardmeter.cost.priors import prior_coefficients
from shardmeter.spec.hardware import GPU_PRESETS, LINK_PRESETS
from shardmeter.spec.model import MODEL_PRESETS
from shardmeter_bench.cli import main
from shardmeter_bench.errors import EXIT_PUBLISH, PublishError, UsageError
from shardmeter_bench.publish import configmap_data, parse_target, publish_configmap
from support.cluster import emulator_subprocess


@pytest.fixture(autouse=True)
def keep_torch_threads() -> Iterator[None]:
    """``main`` sets torch's thread count for its process; give the test process its own back."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _doc() -> CoefficientsDocument:
    return prior_coefficients(
        GPU_PRESETS["l40s"], LINK_PRESETS["pcie4"], LINK_PRESETS["eth-100g"], pool="pool-a"
    )


@pytest.mark.parametrize(("value", "name"), [("configmap/coeffs", "coeffs"), ("cm/a.b-c", "a.b-c")])
def test_publish_target_is_parsed(value: str, name: str) -> None:
    assert parse_target(value) == name


@pytest.mark.parametrize("value", ["coeffs", "secret/coeffs", "configmap/", "configmap/UPPER"])
def test_bad_publish_targets_are_usage_errors(value: str) -> None:
    with pytest.raises(UsageError, match="--publish"):
        parse_target(value)


def test_oversized_documents_drop_their_raw_samples() -> None:
    doc = _doc()
    sample = ComputeSample(
        target=Target.BLOCK_FORWARD,
        model=MODEL_PRESETS["llama-3.1-8b"].model_dump(by_alias=False),
        micro_batch=1,
        seq_len=4096,
        seconds=0.01,
        group="g",
    )
    big = doc.model_copy(update={"samples": Samples(compute=[sample] * 5000)})
    data = configmap_data(big)
    assert sum(len(v) for v in data.values()) < 1_000_000
    back = CoefficientsDocument.from_configmap_data(data)
    assert back.samples.compute == [] and any("raw samples omitted" in n for n in back.notes)
    assert back.compute == doc.compute  # the fits themselves are intact
    assert configmap_data(doc) == doc.to_configmap_data()  # small ones go out whole


@pytest.mark.cluster
def test_publish_patches_an_existing_configmap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with emulator_subprocess(tmp_path) as api:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig_path))
        manifest = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "pool-a-coefficients", "namespace": "default"},
            "data": {"owner-note": "kept"},
        }
        api.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(manifest))
        doc = _doc()
        where = publish_configmap(doc, "pool-a-coefficients", "default")
        assert where == "default/pool-a-coefficients"
        got = yaml.safe_load(
            api.kubectl("get", "configmap", where.split("/")[1], "-o", "yaml").stdout
        )
        data = got["data"]
        assert data["owner-note"] == "kept"  # a merge patch: other keys survive
        assert data["gpu"] == "L40S" and data["source"] == "prior"
        assert CoefficientsDocument.from_configmap_data(data) == doc
        assert CONFIGMAP_KEY in data

        with pytest.raises(PublishError, match="does not exist; create it first"):
            publish_configmap(doc, "missing", "default")


@pytest.mark.cluster
@pytest.mark.slow
def test_cli_fits_and_publishes_to_the_configmap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with emulator_subprocess(tmp_path) as api:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig_path))
        manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pool-b"}}
        api.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(manifest))
        argv = ["compute", "--device", "cpu", "--scale", "small", "--configs", "1"]
        argv += ["--publish", "configmap/pool-b", "--namespace", "default", "--pool", "pool-b"]
        assert main([*argv, "--log-format", "json"]) == 0
        assert "configmap: default/pool-b" in capsys.readouterr().out
        got = yaml.safe_load(api.kubectl("get", "configmap", "pool-b", "-o", "yaml").stdout)
        doc = CoefficientsDocument.from_configmap_data(got["data"])
        assert doc.source.value == "measured" and doc.pool == "pool-b"
        assert doc.compute[Target.BLOCK_FORWARD].n_samples >= 3
        assert not (tmp_path / "shardmeter-coefficients.json").exists()  # --publish only

        # the ConfigMap is gone: the run fails with the publish status and one line
        api.kubectl("delete", "configmap", "pool-b")
        assert main([*argv, "--log-format", "json"]) == EXIT_PUBLISH
        err = capsys.readouterr().err.strip().splitlines()
        assert json.loads(err[-1])["error"] == (
            "shardmeter-bench: error: configmap default/pool-b does not exist; "
            "create it first (the Job only patches it)"
        )
