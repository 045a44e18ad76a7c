"""A duplicated key is an error, never "the last one wins": in plan files (YAML and JSON),
TrainingPlan and GPUPool manifests, what-if files, model files, coefficient documents (files
and ConfigMaps), published-throughput files and inline JSON flags. Every reader goes through
`shardmeter.spec.loading.parse_text` / `parse_json`; the error names the key, where it is and
both lines, and the command exits 2 with that one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from shardmeter.calibration import load_document
from shardmeter.cli.main import main
from shardmeter.cost.coefficients import CONFIGMAP_KEY, CoefficientsDocument
from shardmeter.cost.model import CostModel
from shardmeter.errors import SpecError
from shardmeter.spec.loading import network_from_arg, parse_json, parse_text
from shardmeter.spec.model import MODEL_PRESETS
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import TrainingSpec

REPO = Path(__file__).resolve().parents[1]
CASE = REPO / "examples" / "case-study.yaml"


def one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "", captured.err
    return lines[0]


def line_of(text: str, needle: str, occurrence: int = 0) -> int:
    """The 1-based line of the ``occurrence``-th line holding ``needle``."""
    return [i for i, line in enumerate(text.splitlines(), 1) if needle in line][occurrence]


# ---- the parsers ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("a: 1\nb: 2\na: 3\n", "a", "duplicated key 'a' on lines 1 and 3; keep one"),
        ("x:\n  y: 1\n  y: 2\n", "x.y", "duplicated key 'y' on lines 2 and 3"),
        ("l:\n  - {k: 1}\n  - {k: 1, k: 2}\n", "l[1].k", "duplicated key 'k' twice on line 3"),
        ("a: &n {v: 1}\nb: *n\nb: *n\n", "b", "duplicated key 'b' on lines 2 and 3"),
    ],
)
def test_yaml_names_the_key_and_both_lines(text: str, field: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_text(text, "f.yaml")
    assert (err.value.field, err.value.source) == (field, "f.yaml")
    assert err.value.message.startswith(message)


def test_yaml_that_repeats_no_key_reads_as_before() -> None:
    """Aliases, merge keys overridden by the mapping's own (as YAML intends), equal keys in
    different mappings, ``1`` and ``"1"`` (different keys) and multi-document streams."""
    text = "base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  y: 3\nn: *b\nl: [{x: 1}, {x: 1}]\n"
    assert parse_text(text, "f.yaml") == yaml.safe_load(text)
    assert parse_text('1: a\n"1": b\n', "f.yaml") == {1: "a", "1": "b"}
    assert parse_text("a: 1\n---\na: 2\n", "f.yaml", all_documents=True) == [{"a": 1}, {"a": 2}]
    with pytest.raises(SpecError, match="duplicated key 'a' on lines 3 and 4"):
        parse_text("a: 1\n---\na: 2\na: 3\n", "f.yaml", all_documents=True)


def test_json_names_the_key_and_both_lines() -> None:
    text = '{\n  "a": {"b": [1, {"c": 1,\n    "c"\n      :\n  2}]},\n  "d": 1\n}\n'
    with pytest.raises(SpecError) as err:
        parse_json(text, "f.json")
    assert (err.value.field, err.value.source) == ("a.b[1].c", "f.json")
    assert err.value.message == "duplicated key 'c' on lines 2 and 3; keep one"
    with pytest.raises(SpecError, match=r"^x\.json: a: duplicated key 'a' twice on line 1"):
        parse_text('{"a": 1, "a": 1}', "x.json", json_only=True)
    text = '{"a": {"b": [1, {"c": 1}], "e": {}}, "d": [], "f": "\\"g\\": 1"}'
    assert parse_json(text) == json.loads(text)


# ---- the files the commands read ------------------------------------------------------------
def test_a_plan_file_that_says_sync_every_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = CASE.read_text().splitlines(keepends=True)
    at = line_of(CASE.read_text(), "fragmentSyncDelay")
    text = "".join([*lines[:at], "  syncEvery: 100\n", *lines[at:]])
    f = tmp_path / "plan.yaml"
    f.write_text(text)
    first, second = line_of(text, "syncEvery:"), line_of(text, "syncEvery:", 1)
    assert one_line(capsys, ["plan", str(f), "--no-files"]) == (
        f"shardmeter plan: error: {f}: strategy.syncEvery: duplicated key 'syncEvery' on lines "
        f"{first} and {second}; keep one"
    )


def test_a_json_plan_file_with_a_duplicated_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = yaml.safe_load(CASE.read_text())
    text = json.dumps(raw, indent=2).replace(
        '"seqLenTokens": 8192', '"seqLenTokens": 8192,\n    "seqLenTokens": 4096'
    )
    f = tmp_path / "plan.json"
    f.write_text(text)
    first, second = line_of(text, '"seqLenTokens"'), line_of(text, '"seqLenTokens"', 1)
    line = one_line(capsys, ["plan", str(f), "--no-files"])
    assert (
        f"{f}: training.seqLenTokens: duplicated key 'seqLenTokens' on lines {first} and {second}"
        in line
    )


def test_a_gpupool_manifest_with_a_duplicated_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = (REPO / "examples" / "gpupool-cluster-a.yaml").read_text()
    text = pool.replace("  nodes: 10\n", "  nodes: 10\n  nodes: 2\n")
    f = tmp_path / "pool.yaml"
    f.write_text(text)
    plan = tmp_path / "plan.yaml"
    plan.write_text((REPO / "examples" / "trainingplan.yaml").read_text())
    argv = ["plan", str(plan), "--no-files", "--pool-file", str(f)]
    argv += ["--pool-file", str(REPO / "examples" / "gpupool-cluster-b.yaml")]
    line = one_line(capsys, argv)
    first = line_of(text, "nodes:")
    assert f"{f}: spec.nodes: duplicated key 'nodes' on lines {first} and {first + 1}" in line


def test_a_what_if_file_with_a_duplicated_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "what-if.yaml"
    f.write_text(
        "units:\n  - {name: A, forward_s: 2, backward_s: 4}\n"
        "diloco:\n  islands: 2\n  sync_every: 4\n  all_reduce_s: 20\n  sync_every: 8\n"
    )
    line = one_line(capsys, ["simulate", "--durations", str(f)])
    assert f"{f}: diloco.sync_every: duplicated key 'sync_every' on lines 5 and 7" in line


def test_a_model_file_with_a_duplicated_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "model.yaml"
    f.write_text(
        yaml.safe_dump(MODEL_PRESETS["llama-3.2-1b"].model_dump(mode="json", by_alias=True))
        + "numLayers: 2\n"
    )
    line = one_line(capsys, ["predict", "--model", str(f), "--gpu", "h100"])
    first, second = line_of(f.read_text(), "numLayers:"), line_of(f.read_text(), "numLayers:", 1)
    assert f"{f}: numLayers: duplicated key 'numLayers' on lines {first} and {second}" in line


def coefficients_json() -> str:
    training = TrainingSpec(seq_len_tokens=512, global_batch_tokens=512)
    pool = PoolSpec(name="p", gpu="h100", nodes=1, gpus_per_node=8)
    doc = CostModel(MODEL_PRESETS["llama-3.2-1b"], training, pool).coefficients
    return doc.to_json().replace('{\n  "', '{\n  "source": "measured",\n  "', 1)


def test_a_coefficients_file_with_a_duplicated_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = coefficients_json()
    f = tmp_path / "c.json"
    f.write_text(text)
    second = line_of(text, '"source"', 1)
    line = one_line(capsys, ["predict", "--model", "llama-3.2-1b", "--coefficients", str(f)])
    assert f"{f}: source: duplicated key 'source' on lines 2 and {second}" in line


def test_a_coefficients_configmap_with_a_duplicated_key() -> None:
    text = coefficients_json()
    with pytest.raises(SpecError) as err:
        CoefficientsDocument.from_configmap_data({CONFIGMAP_KEY: text}, "configmap/x")
    assert err.value.field == f"configmap/x.data[{CONFIGMAP_KEY}].source"
    assert err.value.message.startswith("duplicated key 'source' on lines 2 and ")


def test_a_published_throughput_file_with_a_duplicated_key(tmp_path: Path) -> None:
    f = tmp_path / "published.json"
    f.write_text('{"points": [],\n "points": []}')
    with pytest.raises(SpecError, match=r"points: duplicated key 'points' on lines 1 and 2"):
        load_document(f)


def test_an_inline_network_with_a_duplicated_key() -> None:
    with pytest.raises(SpecError) as err:
        network_from_arg(
            '{"nicsPerNode": 8, "nicBandwidthBytesPerS": "400 Gbit/s", "nicsPerNode": 4}'
        )
    assert err.value.field == "--network.nicsPerNode"
    assert err.value.message == "duplicated key 'nicsPerNode' twice on line 1; keep one"
