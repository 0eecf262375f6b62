"""The import-linter contracts hold, and a wrong import breaks them by name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), str(root)]))
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_layers_hold() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "wrong", "rule", "named"),
    [
        # A runtime module importing a backend.
        (
            "_sending.py",
            "from ..backends import memory as _memory",
            "The runtime reaches a backend through the contract",
            "BROKEN",
        ),
        # A runtime room importing one above it.
        (
            "_inbox.py",
            "from . import _session as _up",
            "The runtime's rooms (docs/runtime.md)",
            "tenure.runtime._inbox -> tenure.runtime._session",
        ),
    ],
)
def test_a_wrong_import_fails_naming_the_rule(
    tmp_path: Path, module: str, wrong: str, rule: str, named: str
) -> None:
    copy = tmp_path / "tree"
    for part in ("src", "safety", "benchmarks"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    source = copy / "src" / "tenure" / "runtime" / module
    source.write_text(source.read_text() + f"\n{wrong}  # noqa\n")
    done = _lint(copy)
    assert done.returncode != 0
    assert rule in done.stdout
    assert named in done.stdout
