"""The CI's safety runs: a short faulty run per backend, and every negative control.

Each run starts its own servers (Redis, PostgreSQL) on free loopback ports, so
these tests need ``redis-server`` and PostgreSQL's binaries installed (they fail,
never skip, when missing). The long soak is ``python -m safety soak`` (SAFETY.md).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from safety.mutants import MUTANTS
from safety.runner import RunConfig, RunResult, run

BACKENDS = ["memory", "sqlite", "redis", "postgres"]
RUN_S = 20.0
CONTROL_S = 6.0
# Controls: new short runs until caught, for up to this long.
CONTROL_BUDGET_S = 150.0
# At most this share of the per-key histories may be left UNKNOWN by the checker.
MAX_UNKNOWN = 0.05


def _run(rc: RunConfig) -> RunResult:
    result = asyncio.run(run(rc))
    print(result.figure_line())
    return result


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", BACKENDS)
def test_short_run_with_faults_has_no_violation(backend: str, tmp_path: Path) -> None:
    res = _run(RunConfig(backend=backend, duration_s=RUN_S, seed=7, workdir=str(tmp_path)))
    assert res.report.violations == [], "\n".join(v.describe() for v in res.report.violations[:5])
    assert res.sweep_ok, f"keys that could not be acquired after healing: {res.sweep_failed}"
    assert res.integrity in (None, "ok")
    # The run must have done something worth checking.
    assert sum(res.faults.values()) >= 5, res.faults
    assert res.operations >= 300
    assert res.report.counter is not None and res.report.counter.acknowledged > 0
    # FAIL is a violation (above). UNKNOWN is reported, never counted as a pass,
    # and bounded: a checker that gave up on most keys would prove nothing.
    keys = len(res.report.keys)
    assert keys > 0
    assert res.report.passed + res.report.unknown == keys
    assert res.report.unknown <= MAX_UNKNOWN * keys, res.report.summary()


def _assert_healthy(res: RunResult) -> None:
    assert res.report.violations == [], "\n".join(v.describe() for v in res.report.violations[:5])
    assert res.sweep_ok, f"keys that could not be acquired after healing: {res.sweep_failed}"
    assert res.operations >= 300
    assert res.report.counter is not None and res.report.counter.acknowledged > 0
    assert res.report.unknown <= MAX_UNKNOWN * len(res.report.keys), res.report.summary()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_short_run_with_sentinel_failovers_has_no_violation(tmp_path: Path) -> None:
    """Redis under Sentinel with its masters killed, ``min_replicas=1`` (the
    controls are those of ``redis``, which shares the backend). Without
    ``min_replicas`` exclusivity is not promised through every failover (SAFETY.md):
    that configuration has a soak, not a CI run. 3 s between failovers, so grants
    happen between them."""
    rc = RunConfig(
        backend="redis-sentinel-min-replicas",
        duration_s=20.0,
        seed=7,
        workdir=str(tmp_path),
        failover_gap_s=3.0,
    )
    res = _run(rc)
    _assert_healthy(res)
    assert res.faults.get("sentinel-failover", 0) >= 1, res.faults
    assert res.grants >= 10, res.acquires


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_short_run_on_a_redis_cluster_has_no_violation(tmp_path: Path) -> None:
    """Three primaries and three replicas: primaries killed and their replicas
    promoted, manual failovers, node pauses, slot migrations, CLIENT KILL and
    SCRIPT FLUSH on every primary."""
    rc = RunConfig(backend="redis-cluster", duration_s=15.0, seed=7, workdir=str(tmp_path))
    res = _run(rc)
    _assert_healthy(res)
    server = {k: v for k, v in res.faults.items() if k.startswith(("cluster-", "redis-"))}
    assert sum(v for k, v in server.items() if "not injected" not in k) >= 3, res.faults
    assert res.grants >= 20, res.acquires


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mutant", MUTANTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_control_is_caught(backend: str, mutant: str, tmp_path: Path) -> None:
    # A race needs luck and work to show: short runs with new seeds follow each
    # other until the control is caught, for up to CONTROL_BUDGET_S. On a quiet
    # machine the first or second run catches it; on a loaded one a run does a
    # tenth of the work, and more runs make up for it. Each miss is printed.
    props: set[str] = set()
    res = None
    operations = 0
    started = time.monotonic()
    seed = 3
    while res is None or time.monotonic() - started < CONTROL_BUDGET_S:
        res = _run(
            RunConfig(
                backend=backend,
                duration_s=CONTROL_S,
                seed=seed,
                mutant=mutant,
                fault_kinds=["client-pause"],
                workdir=str(tmp_path / f"seed{seed}"),
            )
        )
        operations += res.operations
        props = {v.prop for v in res.report.violations}
        caught = "P4" in props if mutant == "no-fencing" else bool(props)
        if caught:
            return
        print(f"control {mutant} on {backend} not caught with seed {seed}")
        seed += 1
    assert res is not None
    if mutant == "no-fencing":
        pytest.fail(
            f"unfenced counter lost no update in {seed - 3} runs, {operations} operations: "
            f"{res.report.counter}"
        )
    pytest.fail(
        f"mutant {mutant} on {backend} went unnoticed in {seed - 3} runs, "
        f"{operations} operations: {res.figure_line()}"
    )
