"""The CLI's rough edges, smoothed: help without docstring markup, what-if files in either
case with an example shipped, "did you mean" first for a misspelt plan-file key, and
``--all-errors`` listing every problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from shardmeter.cli.main import main

REPO = Path(__file__).resolve().parents[1]
CASE = REPO / "examples" / "case-study.yaml"
WHAT_IF = REPO / "examples" / "what-if.yaml"


@pytest.mark.parametrize("command", [[], ["predict"], ["simulate"], ["plan"]])
def test_help_has_no_docstring_markup(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--help"]) == 0
    text = capsys.readouterr().out
    assert "`" not in text, [line for line in text.splitlines() if "`" in line]


def test_what_if_reads_snake_and_camel_case_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--durations", str(WHAT_IF), "--json"]) == 0
    snake = json.loads(capsys.readouterr().out)
    doc = yaml.safe_load(WHAT_IF.read_text())

    def camel(value: object) -> object:
        if isinstance(value, dict):
            return {
                k.split("_")[0] + "".join(p.title() for p in k.split("_")[1:]): camel(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [camel(v) for v in value]
        return value

    f = tmp_path / "camel.yaml"
    f.write_text(yaml.safe_dump(camel(doc)))
    assert "forwardS" in f.read_text() and "fragmentSyncDelay" in f.read_text()
    assert main(["simulate", "--durations", str(f), "--json"]) == 0
    camel_out = json.loads(capsys.readouterr().out)
    assert camel_out["step"] == snake["step"] and camel_out["diloco"] == snake["diloco"]


def test_a_misspelt_key_says_did_you_mean_and_all_errors_lists_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "typo.yaml"
    f.write_text(CASE.read_text().replace("gpusPerNode:", "gpusPerNod:"))
    assert main(["plan", str(f)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "pools[0].gpusPerNod: unknown field (did you mean 'gpusPerNode'?)" in err[0]
    assert "more problems; --all-errors lists them)" in err[0]
    assert main(["plan", str(f), "--all-errors"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("shardmeter plan: error: ") for line in err)
    assert sum("did you mean 'gpusPerNode'" in line for line in err) == 2
    assert sum("gpusPerNode: required field is missing" in line for line in err) == 2
