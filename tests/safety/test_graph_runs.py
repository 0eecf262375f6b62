"""The thread harness's LangGraph workload, short runs with faults on SQLite and on a
private PostgreSQL: every thread runs a graph through ``graph_handler`` on a fenced
saver; the checkpoint histories and final states read back must show no token going
back, no two runs interleaved, every stored message answered exactly once. The same
evidence with one stale checkpoint added, or one answer taken away, must fail. The
soak is ``python -m safety threads --workload langgraph --duration ...`` (SAFETY.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from pathlib import Path

import pytest

from safety.threads.checker import check
from safety.threads.evidence import (
    Checkpoint,
    load_checkpoints,
    load_states,
    load_stored,
    load_writes,
)
from safety.threads.runner import ThreadRunConfig, run_threads


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_short_langgraph_run_with_faults_has_no_violation(backend: str, tmp_path: Path) -> None:
    rc = ThreadRunConfig(
        backend=backend,
        duration_s=15.0,
        seed=11,
        workdir=str(tmp_path),
        workload="langgraph",
        send_gap_ms=(150.0, 450.0),  # busier than the soak's default: a short run
    )
    res = asyncio.run(run_threads(rc))
    print(res.figure_line())
    assert res.violations == 0, "\n".join(res.report.describe())
    assert res.drained_s is not None, "stored signals still unwritten after healing"
    assert res.report.signals >= 40
    assert res.report.checkpoints >= 3 * res.report.signals  # input, think, answer
    assert sum(n for k, n in res.faults.items() if "not injected" not in k) >= 5, res.faults

    stored = load_stored(tmp_path)
    writes = load_writes(tmp_path / "sink.db")
    history = load_checkpoints(tmp_path / "checkpoints.jsonl")
    states = load_states(tmp_path / "states.jsonl")
    runs: dict[str, list[Checkpoint]] = defaultdict(list)
    for c in history:
        runs[c.thread].append(c)
    # A thread that changed owners (faults do that): its first run's checkpoint again
    # at the end is a stale run's write after its successors'.
    seen = max(runs.values(), key=lambda cs: len({c.run_id for c in cs}))
    assert len({c.run_id for c in seen}) >= 2, "no thread changed owners"
    stale = dataclasses.replace(seen[0], checkpoint_id="~stale", parent_id=seen[-1].checkpoint_id)
    at = history.index(seen[-1]) + 1
    caught = check(stored, writes, checkpoints=[*history[:at], stale, *history[at:]], states=states)
    assert caught.counts()["checkpoint overlaps"] >= 1
    assert caught.counts()["interleaved"] >= 1
    # A stored message whose answer is missing from its thread's final state.
    sid = stored[0].signal_id
    states = [
        dataclasses.replace(s, answered={k: v for k, v in s.answered.items() if k != sid})
        for s in states
    ]
    assert (
        check(stored, writes, checkpoints=history, states=states).counts()["not answered once"] == 1
    )
