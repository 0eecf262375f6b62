"""Safety evidence for tenure's leases: histories, checkers, workloads, faults, controls.

Not part of the installed library: run from the repository root with
``python -m safety ...`` (see ``SAFETY.md``).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker_env() -> dict[str, str]:
    """The environment of a worker process: this tree's ``src`` first, never an
    installed tenure (a worktree sharing another tree's editable install would
    otherwise run that tree's code in its workers)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
