"""The bench's import contracts in pyproject.toml hold, and each really catches a wrong-way
import: the same contracts run against a copy of the bench package with one import added
(tests/test_layers.py does the same for the model's contracts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
BENCH_CONTRACTS = (
    "bench-layers",
    "bench-api-server",
    "bench-measures-apart-from-the-fit",
    "bench-own-block",
    "no-cycles",
)
LAYERS = "The bench's layers"


def lint_imports(
    cwd: Path, bench_parent: Path, *contracts: str
) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on ``cwd``'s pyproject.toml with the bench from ``bench_parent`` (a copy
    may stand in for it) and this checkout's model and operator; only ``contracts``."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", *(f"--contract={c}" for c in contracts)],
        cwd=cwd,
        env={
            "PYTHONPATH": os.pathsep.join([str(bench_parent), str(ROOT), str(ROOT / "operator")]),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_bench_contracts_hold() -> None:
    # no-cycles spans the model and the operator too; the bench's own contracts are checked here
    run = lint_imports(ROOT, ROOT / "bench-job", *BENCH_CONTRACTS[:-1])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 kept, 0 broken" in run.stdout, run.stdout


def _bench_copy(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "bench-job" / "shardmeter_bench",
        tmp_path / "bench-job" / "shardmeter_bench",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path / "bench-job" / "shardmeter_bench"


@pytest.mark.parametrize(
    ("module", "wrong_import", "contract"),
    [
        # validation never reaches up to the command line or the run
        ("validation/report.py", "import shardmeter_bench.cli", LAYERS),
        ("validation/unseen.py", "import shardmeter_bench.runconfig", LAYERS),
        # compute does not know what validates it; compute and collectives are independent
        ("compute/sweep.py", "import shardmeter_bench.validation.measure", LAYERS),
        ("compute/profiling.py", "import shardmeter_bench.collectives.distributed", LAYERS),
        ("collectives/timing.py", "import shardmeter_bench.compute.catalog", LAYERS),
        # the fit and the validation that checks it are independent
        ("fit.py", "import shardmeter_bench.validation.report", LAYERS),
        # publishing sits under the run; the shared pieces import no concern
        ("publish.py", "import shardmeter_bench.runconfig", LAYERS),
        ("device.py", "import shardmeter_bench.compute.catalog", LAYERS),
        ("errors.py", "import shardmeter_bench.collectives.distributed", LAYERS),
        ("collectives/timing.py", "import kubernetes", "Only the bench's publish talks"),
        ("fit.py", "import kubernetes", "Only the bench's publish talks"),
        ("validation/measure.py", "import shardmeter.cost.fitting", "The bench measures apart"),
        ("compute/sweep.py", "import shardmeter.cost.regression", "The bench measures apart"),
        ("validation/measure.py", "import shardmeter_bench.fit", "The bench measures apart"),
        ("compute/blocks.py", "import transformers", "the bench's own block"),
        ("collectives/timing.py", "import transformers", "the bench's own block"),
        # a cycle inside a subpackage (catalog ← sweep already)
        ("compute/catalog.py", "import shardmeter_bench.compute.sweep", "No import cycles"),
    ],
)
def test_a_wrong_way_import_breaks_a_bench_contract(
    tmp_path: Path, module: str, wrong_import: str, contract: str
) -> None:
    bench = _bench_copy(tmp_path)
    target = bench / module
    target.write_text(target.read_text() + f"\n{wrong_import}  # noqa\n")
    run = lint_imports(tmp_path, bench.parent, *BENCH_CONTRACTS)
    assert run.returncode == 1, run.stdout + run.stderr
    broken = run.stdout.split("Broken contracts")[-1]
    assert contract in broken, run.stdout
    importer = "shardmeter_bench." + module.removesuffix(".py").replace("/", ".")
    imported = wrong_import.removeprefix("import ")
    if contract == "No import cycles":  # named as the package and its modules' tails
        package, _, tail = importer.rpartition(".")
        named = [f"cycles are allowed in {package}.", f".{tail}", imported.rsplit(".")[-1]]
    else:
        named = [importer, imported]
    assert all(name in broken for name in named), broken  # the import it names


def test_a_module_outside_every_layer_breaks_the_bench_layers(tmp_path: Path) -> None:
    """The layers are exhaustive: a new top-level module must be given its place."""
    bench = _bench_copy(tmp_path)
    (bench / "stray.py").write_text('"""A module no layer names."""\n')
    run = lint_imports(tmp_path, bench.parent, "bench-layers")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "stray" in run.stdout.split("Broken contracts")[-1], run.stdout
