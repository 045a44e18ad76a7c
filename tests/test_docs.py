"""The docs are generated or executed, never left to drift:

* docs/reference/*.md and the generated blocks of the chart's README are exactly what
  ``tools/gendocs.py`` writes from the pydantic models, values.yaml, the alerts and the RBAC
  declaration (run ``make docs`` after changing any of them);
* every fenced block marked ``sh test`` in README.md and docs/**/*.md runs and succeeds, from
  the repository root with ``shardmeter`` on the PATH and ``$TMP`` a scratch folder;
* every ``console`` block (``$ shardmeter …`` and its output) shows what the command prints
  now (``tools/docoutputs.py``, part of ``make docs``, rewrites them).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
BLOCK = re.compile(r"^```sh test\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gendocs() -> ModuleType:
    return tool("gendocs")


def test_reference_pages_match_the_models() -> None:
    for name, text in gendocs().pages().items():
        path = REPO / "docs" / "reference" / name
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(REPO)} drifted from the models: run `make docs`"
        )


def test_chart_readme_matches_values_alerts_and_rbac() -> None:
    readme = REPO / "deploy" / "helm" / "shardmeter" / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert gendocs().chart_readme(text) == text, "the chart README drifted: run `make docs`"


def test_every_value_is_in_the_chart_readme() -> None:
    g = gendocs()
    text = (REPO / "deploy" / "helm" / "shardmeter" / "README.md").read_text(encoding="utf-8")
    rows = g.values_rows((g.CHART / "values.yaml").read_text(encoding="utf-8"))
    assert len(rows) > 40 and all(doc for _, _, doc in rows)
    assert all(f"| `{path}` |" in text for path, _, _ in rows)
    assert "crds.kopfPeering" in {path for path, _, _ in rows}


def test_the_plan_file_reference_documents_objectives_and_constraints() -> None:
    text = (REPO / "docs" / "reference" / "plan-file.md").read_text(encoding="utf-8")
    for needle in ("### ObjectiveKind", "`min-cost`", "`time-budget`", "### ConstraintsSpec"):
        assert needle in text
    for key in ("`maxIslands`", "`minGpusPerIsland`", "`maxNodes`", "`gradReduceBytes`"):
        assert key in text
    crds = (REPO / "docs" / "reference" / "crds.md").read_text(encoding="utf-8")
    assert "### GPUPoolSpec" in crds and "### TrainingPlanStatus" in crds
    assert "`RuntimeCannotExpress`" in crds


def examples() -> list[tuple[str, str]]:
    out = []
    for path in DOCS:
        for i, match in enumerate(BLOCK.finditer(path.read_text(encoding="utf-8"))):
            out.append((f"{path.relative_to(REPO)}#{i + 1}", match.group(1)))
    return out


EXAMPLES = examples()


def test_the_docs_have_examples_to_run() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize(("where", "script"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_doc_example_runs(where: str, script: str, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "shardmeter"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m shardmeter.cli.main "$@"\n')
    wrapper.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "TMP": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(
            [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        ),
    }
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{where} failed:\n{script}\n{result.stdout}\n{result.stderr}"


def test_the_model_doc_states_the_auto_fragment_rule_the_planner_follows() -> None:
    """docs/model.md's rule for ``fragments: auto`` (nearest blocks ÷ layersPerFragment, not
    the fewest) and its worked example hold against the case study's golden plan."""
    import json

    from shardmeter.plan.schema import load_plan
    from shardmeter.spec.training import StrategySpec

    text = " ".join((REPO / "docs" / "model.md").read_text(encoding="utf-8").split())
    rule = text[text.index("**Convergence guard-rails**") :]
    rule = rule[: rule.index("**No plan**")]
    assert "nearest blocks ÷ `layersPerFragment`" in rule and "not the fewest" in rule
    example = re.search(
        r"case study's (\d+) blocks ÷ `layersPerFragment` (\d+) give `fragments` (\d+) at "
        r"`syncEvery` (\d+)",
        rule,
    )
    assert example, "the worked example is gone from docs/model.md"
    blocks, per, fragments, sync_every = map(int, example.groups())
    spec, _ = load_plan(str(REPO / "examples" / "case-study.yaml"), [])
    assert blocks == spec.model.num_layers
    assert per == StrategySpec.model_fields["layers_per_fragment"].default
    golden = json.loads((REPO / "tests" / "golden" / "case_study.json").read_text())["chosen"]
    assert (fragments, sync_every) == (golden["fragments"], golden["sync_every"])
    divisors = [f for f in range(1, sync_every + 1) if sync_every % f == 0]
    assert fragments == min(divisors, key=lambda f: (abs(f - blocks / per), f)) != min(divisors)


DOCOUTPUTS = tool("docoutputs")
CONSOLE = [
    (f"{path.relative_to(REPO)}: $ {command}", command, output)
    for path in DOCOUTPUTS.pages()
    for command, output in DOCOUTPUTS.blocks(path.read_text(encoding="utf-8"))
]


def test_the_readme_and_the_cli_guide_show_outputs() -> None:
    shown = {where.split(":")[0] for where, _, _ in CONSOLE}
    assert {"README.md", "docs/cli.md"} <= shown


@pytest.mark.parametrize(("where", "command", "output"), CONSOLE, ids=[w for w, _, _ in CONSOLE])
def test_a_shown_output_is_what_the_command_prints(where: str, command: str, output: str) -> None:
    now = DOCOUTPUTS.run(command)
    assert DOCOUTPUTS.masked(output) == DOCOUTPUTS.masked(now), (
        f"{where} drifted from the command's output: run `make docs`\n{now}"
    )
