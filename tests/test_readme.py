"""The README never lies: its quickstart runs, and its commands are the ones CI runs."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section_code(heading: str) -> str:
    section = README.split(f"## {heading}", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, f"no python block under {heading!r}"
    return match.group(1)


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_quickstart_runs() -> None:
    _run(_section_code("Quickstart"))


def test_holding_example_runs() -> None:
    assert "working under fencing token 1" in _run(_section_code("Holding a lease"))


def test_runtime_example_runs() -> None:
    out = _run(_section_code("The thread runtime"))
    assert "hello" in out
    assert "and another thing" in out
    assert any(line.startswith("wake ") for line in out.splitlines())


def test_ci_runs_the_readme_test_command() -> None:
    block = README.split("## Set-up: two commands", 1)[1].split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert commands == ["bash scripts/demo", "bash scripts/test"]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "\nbash scripts/test" in ci
    assert (ROOT / "scripts" / "demo").exists()


def test_sync_example_runs() -> None:
    out = _run(_section_code("Sync code: Django, Flask, Celery, scripts")).splitlines()
    assert out[0] == "working under fencing token 1"
    tokens = ast.literal_eval(out[1])  # a list of ints, printed by the example
    assert len(tokens) == 3 and len(set(tokens)) == 3
