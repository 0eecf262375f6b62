"""A run learns of its lease's loss at the renew deadline at the latest: hung renew, paused owner.

Two runtimes on one memory backend stand for two processes; the lease
provider of the first can be made to hang its renewals (a black-holed
connection at the unit level; the cross-process versions are in
``test_runtime_processes.py``).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tenure import LeaseLost, MemoryPubSub, ThreadRun, ThreadRuntime
from tenure.testing import eventually

from ..hold.support import Flaky, stall


@pytest.mark.asyncio
async def test_a_run_whose_renewals_hang_is_told_before_another_run_can_start() -> None:
    starts: list[tuple[float, str]] = []
    lost: dict[str, float] = {}
    handled: list[object] = []
    started = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        starts.append((time.monotonic(), run.run_id))
        async for signal in run.signals():
            handled.append(signal.payload)
            started.set()
            if signal.payload != 1 or lost:
                continue  # only the first run of signal 1 waits for its loss
            while True:
                try:
                    run.ensure_held()
                except LeaseLost:
                    lost[run.run_id] = time.monotonic()
                    return
                await asyncio.sleep(0.01)

    async with MemoryPubSub() as memory:
        flaky = Flaky(memory)
        a = ThreadRuntime(memory, handler, lease_provider=flaky, ttl_ms=600, cancel_on_loss=False)
        b = ThreadRuntime(memory, handler, ttl_ms=600, sweep_interval=0.05)
        async with a, b:
            await a.send_signal("t", 1)
            await asyncio.wait_for(started.wait(), 5)
            first_run = starts[0][1]
            flaky.hanging = True
            hung = time.monotonic()
            await eventually(lambda: first_run in lost, timeout=3)
            # Lost by the 400 ms renew deadline after the last renewal sent.
            assert lost[first_run] - hung < 0.45
            flaky.hanging = False
            await b.send_signal("t", 2)
            await eventually(lambda: 2 in handled, timeout=5)
    # Whoever ran the thread next, it started after the first run knew it was lost.
    later = [at for at, run_id in starts if run_id != first_run]
    assert later and min(later) > lost[first_run]


@pytest.mark.asyncio
async def test_ensure_held_raises_right_after_the_owner_was_paused_past_its_deadline() -> None:
    outcome: list[str] = []

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            stall(0.45)  # the whole process stalls past the 400 ms deadline
            try:
                run.ensure_held()
                outcome.append("held")
            except LeaseLost:
                outcome.append("lost")

    memory = MemoryPubSub()
    async with memory, ThreadRuntime(memory, handler, ttl_ms=600, cancel_on_loss=False) as rt:
        await rt.send_signal("t", 1)
        await eventually(lambda: bool(outcome), timeout=5)
    assert outcome == ["lost"]


@pytest.mark.asyncio
async def test_a_run_within_its_deadline_is_held() -> None:
    outcome: list[str] = []

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            stall(0.1)
            run.ensure_held()
            outcome.append("held")

    async with MemoryPubSub() as memory, ThreadRuntime(memory, handler, ttl_ms=600) as rt:
        await rt.send_signal("t", 1)
        await eventually(lambda: bool(outcome), timeout=5)
    assert outcome == ["held"]
