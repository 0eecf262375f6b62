"""A thread's session, step by step (memory backend): what it tells when its lease
is lost, its hand-overs, its close handshake, interrupts, and ``aclose``.

The events a runtime emits (``on_event``), its log lines and the errors a run
sees are what an operator reads, so they are checked exactly here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tenure import LeaseLost, MemoryPubSub, ThreadRun, ThreadRuntime
from tenure.runtime import RuntimeEvent
from tenure.testing import ManualClock, eventually

from ..hold.support import stall


@pytest_asyncio.fixture
async def backend() -> AsyncIterator[MemoryPubSub]:
    async with MemoryPubSub() as b:
        yield b


def of_kind(events: list[RuntimeEvent], kind: str) -> list[RuntimeEvent]:
    return [e for e in events if e.kind == kind]


def messages(caplog: pytest.LogCaptureFixture, logger: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno >= level]


# -- a lost lease -------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_lost_run_is_told_why_and_without_cancel_on_loss_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tenure.runtime")
    clock = ManualClock()
    events: list[RuntimeEvent] = []
    runs: list[ThreadRun] = []
    errors: list[LeaseLost] = []
    went_on: list[bool] = []
    started = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        runs.append(run)
        async for _ in run.signals():
            started.set()
            await run.lost.wait()  # a cancellation of the run would land here
            try:
                run.ensure_held()
            except LeaseLost as exc:
                errors.append(exc)
            await asyncio.sleep(0)
            went_on.append(True)

    async with MemoryPubSub(clock=clock) as backend:
        rt = ThreadRuntime(
            backend,
            handler,
            ttl_ms=1000,
            renew_every_ms=50,
            idle_timeout=0.1,
            cancel_on_loss=False,
            on_event=events.append,
        )
        async with rt:
            await rt.send_signal("t", "x")
            await asyncio.wait_for(started.wait(), 5)
            clock.advance_ms(1500)  # the lease expires between two renewals: refused
            await eventually(lambda: bool(of_kind(events, "run_end")))
    [run] = runs
    assert went_on == [True]
    [lost] = of_kind(events, "lost")
    reason = "a renewal was refused: the backend reports the lease is no longer held by its owner"
    assert (lost.thread_key, lost.run_id, lost.token, lost.detail) == (
        "t",
        run.run_id,
        run.token,
        reason,
    )
    assert run.token is not None
    [error] = errors
    assert (error.key, error.owner, error.reason) == (
        rt.lease_key("t"),
        f"{rt.process_id}/{run.run_id}",
        reason,
    )
    assert f"run {run.run_id} of thread 't' lost its lease: {reason}" in messages(
        caplog, "tenure.runtime", logging.WARNING
    )


# -- hand-over ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_run_that_overran_the_renew_deadline_hands_over_to_no_next_run(
    backend: MemoryPubSub,
) -> None:
    # The first run blocks the process past the renew deadline (400 ms of its
    # 600 ms TTL) with the next signal waiting: the session must not start
    # another run on a lease it can no longer count on. The signal goes back to
    # the log, and a new session (another owner) runs it.
    events: list[RuntimeEvent] = []
    calls: list[str] = []
    handled: list[tuple[str, Any]] = []

    async def handler(run: ThreadRun) -> None:
        calls.append(run.run_id)
        async for signal in run.signals():
            handled.append((run.run_id, signal.payload))
            if signal.payload == 1:
                stall(0.45)
            return

    rt = ThreadRuntime(
        backend, handler, ttl_ms=600, idle_timeout=0.05, sweep_interval=0.05, on_event=events.append
    )
    async with rt:
        await rt.send_signal("t", 1)
        await rt.send_signal("t", 2)
        await eventually(lambda: len(handled) == 2)
    assert [payload for _, payload in handled] == [1, 2]
    first_run, second_run = (run_id for run_id, _ in handled)
    assert calls == [first_run, second_run]  # no run of the first session after the stall
    assert first_run.rpartition(".")[0] != second_run.rpartition(".")[0]
    assert not of_kind(events, "handover")
    [lost] = of_kind(events, "lost")
    assert (lost.run_id, lost.detail) == (
        first_run,
        "no renewal succeeded within the renew deadline of 400 ms",
    )
