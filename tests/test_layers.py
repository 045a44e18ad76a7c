"""The import contracts in pyproject.toml hold, and they really catch a wrong-way import: the
same contracts run against a copy of the model in which the simulator imports the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        # this checkout's packages (the model from ``cwd``: a copy may stand in for it)
        env={
            "PYTHONPATH": os.pathsep.join(
                [str(cwd), str(ROOT / "operator"), str(ROOT / "bench-job")]
            ),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_layer_contracts_hold() -> None:
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


@pytest.mark.parametrize(
    ("module", "wrong_import", "contract"),
    [
        ("sim/engine.py", "import shardmeter.output.trace", "The model's layers"),
        ("cost/model.py", "import shardmeter.plan.search", "The model's layers"),
        ("plan/search.py", "import kopf", "The model is pure"),
        ("plan/schema.py", "import shardmeter.plan.search", "No import cycles"),
        ("sim/outer.py", "import shardmeter.cost.regression", "The operator stays light"),
    ],
)
def test_a_wrong_way_import_breaks_a_contract(
    tmp_path: Path, module: str, wrong_import: str, contract: str
) -> None:
    shutil.copytree(ROOT / "shardmeter", tmp_path / "shardmeter")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "shardmeter" / module
    target.write_text(target.read_text() + f"\n{wrong_import}  # noqa\n")
    run = lint_imports(tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert wrong_import.rsplit(".", maxsplit=1)[-1] in run.stdout  # the module it names
    broken = run.stdout.split("Broken contracts")[-1]
    assert contract in broken, run.stdout
