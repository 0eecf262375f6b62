"""The import-linter contracts hold, and a wrong import breaks them by name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    for part in ("src", "safety", "benchmarks"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def test_a_runtime_module_importing_a_backend_fails_naming_the_rule(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    sending = copy / "src" / "tenure" / "runtime" / "_sending.py"
    sending.write_text(sending.read_text() + "\nfrom ..backends import memory as _memory  # noqa\n")
    done = _lint(copy)
    assert done.returncode != 0
    assert "The runtime reaches a backend through the contract" in done.stdout
    assert "BROKEN" in done.stdout


def test_a_runtime_room_importing_one_above_it_fails_naming_the_rule(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    inbox = copy / "src" / "tenure" / "runtime" / "_inbox.py"
    inbox.write_text(inbox.read_text() + "\nfrom . import _session as _up  # noqa\n")
    done = _lint(copy)
    assert done.returncode != 0
    assert "The runtime's rooms (docs/runtime.md)" in done.stdout
    assert "tenure.runtime._inbox -> tenure.runtime._session" in done.stdout
