"""Regenerate the command outputs the docs show: every fenced ``console`` block in README.md
and docs/*.md is a ``$ shardmeter …`` line followed by what the command prints, rewritten here
by running it from the repository root:

    python tools/docoutputs.py        (part of make docs)

``tests/test_docs.py`` runs each command again and fails when a block drifted from the output,
with what varies from run to run (the search's own seconds) masked in both. A block shows
stdout only; a command may end in ``| head -N`` to show the first lines.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```console\n\$ (?P<command>[^\n]*)\n(?P<output>.*?)^```$", re.M | re.S)
VOLATILE = ((re.compile(r"plans scored in [0-9.]+ s"), "plans scored in … s"),)
"""What differs between two runs of the same command, and what it is masked as."""


def pages() -> list[Path]:
    """The pages whose console blocks are generated (the reference pages have none)."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def run(command: str) -> str:
    """``command``'s stdout, run as the docs' reader would from the repository root."""
    words = shlex.split(command)
    head = None
    if "|" in words:
        cut = words.index("|")
        pipe, words = words[cut + 1 :], words[:cut]
        if len(pipe) != 2 or pipe[0] != "head" or not re.fullmatch(r"-\d+", pipe[1]):
            raise ValueError(f"only '| head -N' may follow a documented command: {command!r}")
        head = int(pipe[1][1:])
    if not words or words[0] != "shardmeter":
        raise ValueError(f"a documented command starts with shardmeter: {command!r}")
    result = subprocess.run(
        [sys.executable, "-m", "shardmeter.cli.main", *words[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode not in (0, 1):  # 1: does not fit in memory, an output worth showing
        raise RuntimeError(f"{command!r} exited {result.returncode}: {result.stderr.strip()}")
    lines = result.stdout.splitlines()
    return "\n".join(lines[:head] if head is not None else lines) + "\n"


def masked(text: str) -> str:
    for pattern, replacement in VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def regenerate(text: str) -> str:
    """``text`` with each console block's output replaced by its command's output now."""
    return BLOCK.sub(lambda m: f"```console\n$ {m['command']}\n{run(m['command'])}```", text)


def blocks(text: str) -> list[tuple[str, str]]:
    """(command, output) of every console block in ``text``."""
    return [(m["command"], m["output"]) for m in BLOCK.finditer(text)]


def main() -> int:
    for path in pages():
        text = path.read_text(encoding="utf-8")
        if not BLOCK.search(text):
            continue
        path.write_text(regenerate(text), encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
