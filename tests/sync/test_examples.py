"""The threaded example runs for real, as a user runs it: a subprocess, and its verdict."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TARGETS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(params=["memory", "sqlite", "redis"])
def url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    target = TARGETS[request.param]
    yield target.isolated_url(unique, tmp_path)
    if target.cleanup is not None:
        target.cleanup(unique)


def test_32_threads_count_exactly_under_tenure_sync_hold(url: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "threaded_counter.py"), url, "--increments", "10"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "count 320, expected 320, rejected writes 0" in proc.stdout, proc.stdout
