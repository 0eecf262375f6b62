"""Faults the runtime must survive without looping, stalling or guessing: a cancellation
tenure did not cause, a token read that fails once, ``aclose()`` during a hand-over,
an interrupt request that arrives after its signal ran.

On SQLite files (the log and the leases in one database) unless said otherwise.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tenure import (
    ThreadRun,
    ThreadRuntime,
    from_url,
)
from tenure.runtime import RuntimeEvent
from tenure.testing import eventually


async def _cancelled_elsewhere() -> None:
    """Await a task that someone else cancelled: its CancelledError comes out here."""
    other = asyncio.ensure_future(asyncio.sleep(10))
    await asyncio.sleep(0)
    other.cancel()
    await other


@pytest.mark.asyncio
async def test_a_cancellation_tenure_did_not_ask_for_is_the_handlers_failure(
    tmp_path: Path,
) -> None:
    # Taken for the session's own close, it would hand signal 1 back without
    # spending an attempt, end the session, and the next sweep would run it
    # again, forever; signal 2 would never run.
    handed: list[Any] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handed.append(signal.payload)
            if signal.payload == 1:
                await _cancelled_elsewhere()

    url = f"sqlite:///{tmp_path / 'tenure.db'}?max_attempts=3"
    async with from_url(url) as sqlite:
        async with ThreadRuntime(sqlite, handler, idle_timeout=0.05, sweep_interval=0.05) as rt:
            await rt.send_signal("t", 1)
            await rt.send_signal("t", 2)
            await eventually(lambda: 2 in handed)
            await eventually(lambda: not rt.owned_threads())
        assert sorted(handed) == [1, 1, 1, 2]  # three attempts, then dropped


@pytest.mark.asyncio
async def test_an_on_event_callback_that_raises_cancelled_error_is_logged_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    handed: list[Any] = []

    async def handler(run: ThreadRun) -> None:
        handed.extend([signal.payload async for signal in run.signals()])

    def on_event(event: RuntimeEvent) -> None:
        raise asyncio.CancelledError

    url = f"sqlite:///{tmp_path / 'tenure.db'}"
    async with (
        from_url(url) as sqlite,
        ThreadRuntime(sqlite, handler, idle_timeout=0.05, on_event=on_event) as rt,
    ):
        first = await rt.send_signal("t", 1)
        second = await rt.send_signal("t", 2)
        await eventually(lambda: handed == [1, 2] and not rt.owned_threads())
    assert (first.outcome, second.outcome) == ("wake", "deliver")
    assert "on_event callback raised on wake" in caplog.text
