"""Repository layout rules a user relies on: the stdlib ``operator`` is never shadowed and
the model package stays pure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("kopf", "kubernetes", "torch", "prometheus_client")


def test_stdlib_operator_not_shadowed_from_repo_root() -> None:
    # `python -c` puts the current directory first on sys.path: a package named `operator`
    # there would shadow the standard library and break enum, numpy and everything else.
    assert not (REPO / "operator" / "__init__.py").exists()
    result = subprocess.run(
        [sys.executable, "-c", "import operator, numpy; print(operator.__file__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "lib/python" in result.stdout and "site-packages" not in result.stdout


def test_no_module_named_operator_py_anywhere() -> None:
    offenders = [p for p in REPO.rglob("operator.py") if ".venv" not in p.parts]
    assert offenders == []


def test_model_package_never_imports_cluster_or_torch_libraries() -> None:
    offenders = []
    for path in (REPO / "shardmeter").rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [
                f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in FORBIDDEN
            ]
    assert offenders == []


def test_importing_every_model_module_loads_none_of_the_forbidden_libraries() -> None:
    code = (
        "import importlib, pkgutil, sys, shardmeter\n"
        "for m in pkgutil.walk_packages(shardmeter.__path__, 'shardmeter.'):\n"
        "    importlib.import_module(m.name)\n"
        f"bad = [n for n in {FORBIDDEN!r} if n in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
