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
HOLD_SECONDS = 0.001


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
        # Free run: grab, hold for a real window (as the SQLite race does), release.
        # A second grant while this one is held must land inside the window, so
        # a lease that is not exclusive shows up as two overlapping windows.
        end = time.monotonic() + FREE_RUN_SECONDS
        while time.monotonic() < end:
            result = await backend.acquire_lease("free-key", me, 30_000)
            if not result.acquired:
                continue
            assert result.token is not None
            granted = time.monotonic_ns()
            await asyncio.sleep(HOLD_SECONDS)
            releasing = time.monotonic_ns()
            holds.append((result.token, granted, releasing))
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

    # Holding windows [reply received, release about to be sent] of all processes,
    # in token order, never overlap (one monotonic clock on this host): a higher
    # token always starts after the lower one's holder was done.
    holds = sorted(h for res in results for h in res["holds"])
    assert len(holds) >= 20, "too few grants to say anything"
    assert len({token for token, _, _ in holds}) == len(holds)
    for before, after in itertools.pairwise(holds):
        assert before[2] < after[1], (before, after)
