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
from tenure.runtime import RuntimeEvent
from tenure.testing import eventually

from ..hold.support import Flaky, LateRenewal, stall


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
            # Lost at the 400 ms renew deadline after the last renewal sent (before
            # the hang): before its 600 ms TTL could end, whatever the machine's load.
            assert lost[first_run] - hung < 0.6
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


def _runtime_events(events: list[RuntimeEvent], kind: str) -> list[RuntimeEvent]:
    return [e for e in events if e.kind == kind]


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["hang", "fail"])
async def test_the_renewer_alone_ends_a_run_whose_renewals_never_succeed(fault: str) -> None:
    # The handler never looks (no ensure_held): only the renewer giving up at the
    # deadline, while the renewals still hang or fail, can tell and cancel the run.
    events: list[RuntimeEvent] = []
    started = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            started.set()
            await asyncio.sleep(3600)

    async with MemoryPubSub() as memory:
        flaky = Flaky(memory)
        rt = ThreadRuntime(
            memory, handler, lease_provider=flaky, ttl_ms=600, on_event=events.append
        )
        async with rt:
            await rt.send_signal("t", 1)
            await asyncio.wait_for(started.wait(), 5)
            if fault == "hang":
                flaky.hanging = True
            else:
                flaky.failing = True
            await eventually(lambda: bool(_runtime_events(events, "run_end")), timeout=5)
            failed = flaky.hangs if fault == "hang" else flaky.failures
            flaky.hanging = flaky.failing = False
    assert failed >= 1
    # The first run ended lost (the sweep may then have run the signal again).
    end = _runtime_events(events, "run_end")[0]
    assert end.detail == "lost"
    [lost] = [e for e in _runtime_events(events, "lost") if e.run_id == end.run_id]
    assert "renew deadline" in (lost.detail or "")
    if fault == "fail":
        assert "simulated network error" in (lost.detail or "")


@pytest.mark.asyncio
async def test_a_run_whose_renewal_succeeds_after_the_deadline_is_lost() -> None:
    events: list[RuntimeEvent] = []
    started = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            started.set()
            await asyncio.sleep(3600)

    async with MemoryPubSub() as memory:
        late = LateRenewal(memory)
        rt = ThreadRuntime(
            memory,
            handler,
            lease_provider=late,
            ttl_ms=3000,
            renew_every_ms=100,
            renew_deadline_ms=400,
            on_event=events.append,
        )
        async with rt:
            await rt.send_signal("t", 1)
            await asyncio.wait_for(started.wait(), 5)
            # The next renewal (due within 100 ms) succeeds, but is seen 350 ms
            # after its send: past the deadline of the one before (sent at least
            # 100 ms earlier), within its own.
            late.then = lambda: stall(0.35)
            await eventually(lambda: bool(_runtime_events(events, "run_end")), timeout=5)
    assert late.late == 1
    end = _runtime_events(events, "run_end")[0]
    assert end.detail == "lost"
    [lost] = [e for e in _runtime_events(events, "lost") if e.run_id == end.run_id]
    assert "succeeded only after" in (lost.detail or "")
