"""A thread's session, step by step (memory backend): what it tells when its lease
is lost, its hand-overs, its close handshake, interrupts, and ``aclose``.

The events a runtime emits (``on_event``), its log lines and the errors a run
sees are what an operator reads, so they are checked exactly here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tenure import LeaseLost, MemoryPubSub, ThreadRun, ThreadRuntime
from tenure.runtime import RuntimeEvent
from tenure.testing import ManualClock, eventually


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
