"""The operator's import contracts (pyproject.toml: ``operator-layers``, ``operator-pure``)
hold, and they catch a wrong-way import: the same contracts run against a copy of the operator
in which one module imports what its layer may not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
LAYERS = "The operator's layers"
PURE = "What decides and renders cannot call the API"


def lint_imports(operator_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=ROOT,
        env={
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(operator_dir), str(ROOT / "bench-job")]),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_operator_contracts_hold() -> None:
    run = lint_imports(ROOT / "operator")
    assert run.returncode == 0, run.stdout + run.stderr
    for contract in (LAYERS, PURE):
        kept = [line for line in run.stdout.splitlines() if "KEPT" in line or contract in line]
        assert any(contract in line for line in kept), run.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "wrong_import", "contract"),
    [
        # a renderer calls the API: impure, and above its layer
        ("render/island.py", "import shardmeter_operator.k8s.client", PURE),
        ("render/island.py", "import shardmeter_operator.k8s.client", LAYERS),
        ("launch/rules.py", "import kubernetes", PURE),
        ("observe/summary.py", "import kopf", PURE),
        ("trainingplan/decide.py", "import shardmeter_operator.k8s.children", PURE),
        # the layers, top to bottom
        ("api/common.py", "import shardmeter_operator.render.labels", LAYERS),
        ("render/jobset.py", "import shardmeter_operator.launch.rules", LAYERS),
        ("k8s/client.py", "import shardmeter_operator.trainingplan.decide", LAYERS),
        ("trainingplan/decide.py", "import shardmeter_operator.controller", LAYERS),
        ("decision.py", "import shardmeter_operator.render.names", LAYERS),
        # siblings of one layer stay apart
        ("gpupool/decide.py", "import shardmeter_operator.trainingplan.validate", LAYERS),
        ("launch/follow.py", "import shardmeter_operator.observe.record", LAYERS),
    ],
)
def test_a_wrong_way_import_breaks_an_operator_contract(
    tmp_path: Path, module: str, wrong_import: str, contract: str
) -> None:
    copy = tmp_path / "operator"
    shutil.copytree(ROOT / "operator", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "shardmeter_operator" / module
    target.write_text(target.read_text() + f"\n{wrong_import}  # noqa\n")
    run = lint_imports(copy)
    assert run.returncode == 1, run.stdout + run.stderr
    broken = run.stdout.split("Broken contracts")[-1]
    assert contract in broken, run.stdout
    assert wrong_import.rsplit(maxsplit=1)[-1].rsplit(".", 1)[0] in broken  # it names the import


@pytest.mark.slow
def test_a_module_without_a_layer_breaks_the_layers(tmp_path: Path) -> None:
    """The layers contract is exhaustive: a new top-level module must be given a layer."""
    copy = tmp_path / "operator"
    shutil.copytree(ROOT / "operator", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "shardmeter_operator" / "stray.py").write_text('"""A module of no layer."""\n')
    run = lint_imports(copy)
    assert run.returncode == 1, run.stdout + run.stderr
    assert LAYERS in run.stdout.split("Broken contracts")[-1]
