"""Several OS processes race for the same Redis keys: one winner per round, rising tokens."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import time
from multiprocessing.synchronize import Barrier
from typing import Any

import pytest

from tenure.backends.redis import RedisStreamsPubSub

from .helpers import delete_prefix

PROCESSES = 4
ROUNDS = 40
FREE_RUN_SECONDS = 1.5


def _racer(url: str, prefix: str, me: str, barrier: Barrier, out: Any) -> None:
    out.put(asyncio.run(_race(url, prefix, me, barrier)))


async def _race(url: str, prefix: str, me: str, barrier: Barrier) -> dict[str, Any]:
    backend = RedisStreamsPubSub.from_url(url, prefix=prefix, quarantine=False)
    rounds: list[tuple[int, bool, str | None, int | None]] = []
    holds: list[tuple[int, int, int]] = []
    try:
        # Lock-step rounds: everyone asks at the same moment, the winner releases.
        for r in range(ROUNDS):
            barrier.wait()
            result = await backend.acquire_lease("round-key", me, 30_000)
            rounds.append((r, result.acquired, result.owner, result.token))
            barrier.wait()
            if result.acquired:
                await backend.release_lease("round-key", me)
            barrier.wait()
        # Free run: grab, note the time, release, as fast as possible.
        end = time.monotonic() + FREE_RUN_SECONDS
        while time.monotonic() < end:
            result = await backend.acquire_lease("free-key", me, 30_000)
            if result.acquired:
                assert result.token is not None
                granted = time.monotonic_ns()
                releasing = time.monotonic_ns()
                holds.append((granted, releasing, result.token))
                await backend.release_lease("free-key", me)
    finally:
        await backend.aclose()
    return {"me": me, "rounds": rounds, "holds": holds}


@pytest.mark.asyncio
@pytest.mark.slow
async def test_processes_racing_for_keys(redis_url: str, unique: str) -> None:
    prefix = f"tenure-test-{unique}:"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES, timeout=60)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(redis_url, prefix, f"proc-{i}", barrier, out))
        for i in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    try:
        loop = asyncio.get_running_loop()
        results = [await loop.run_in_executor(None, out.get, True, 120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        await delete_prefix(redis_url, prefix)
    assert all(proc.exitcode == 0 for proc in procs)

    tokens = []
    for r in range(ROUNDS):
        answers = [res["rounds"][r] for res in results]
        winners = [res["me"] for res, a in zip(results, answers, strict=True) if a[1]]
        assert len(winners) == 1, (r, answers)
        assert all(a[2] == winners[0] for a in answers), (r, answers)  # losers told the holder
        tokens.append(next(a[3] for a in answers if a[1]))
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens

    # Holding intervals [reply received, release sent] of all processes never
    # overlap (one monotonic clock on this host), and tokens rise in that order.
    holds = sorted(h for res in results for h in res["holds"])
    assert len(holds) > PROCESSES
    for before, after in itertools.pairwise(holds):
        assert after[0] > before[1], (before, after)
        assert after[2] > before[2], (before, after)
