"""Faults the runtime must survive without looping, stalling or guessing: a cancellation
tenure did not cause, a token read that fails once, ``aclose()`` during a hand-over,
an interrupt request that arrives after its signal ran.

On SQLite files (the log and the leases in one database) unless said otherwise.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tenure import (
    AcquireResult,
    BackendUnavailable,
    Capability,
    Event,
    LeaseRecord,
    ThreadRun,
    ThreadRuntime,
    from_url,
)
from tenure.runtime import RuntimeEvent
from tenure.runtime._log import INTERRUPT, SIGNAL_TYPE
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


class HandOverFaults:
    """The SQLite backend's leases, with a fault at a hand-over (the transfer from a
    run to the next, not a session's opening move), a moment no real schedule
    lands on: ``fail_token_read``, the next ``get_lease`` fails once;
    ``lock_file``, another connection holds the file's write lock for 0.5 s as
    the transfer starts, so the transfer waits for it."""

    capabilities = Capability.RECORD

    def __init__(self, inner: Any, path: Path) -> None:
        self.inner = inner
        self.path = path
        self.fail_token_read = False
        self.lock_file = False
        self.token_reads_failed = 0
        self.transfer_started = asyncio.Event()
        self.lockers: list[threading.Thread] = []

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        result: AcquireResult = await self.inner.acquire_lease(key, owner, ttl_ms)
        return result

    async def get_lease_owner(self, key: str) -> str | None:
        owner: str | None = await self.inner.get_lease_owner(key)
        return owner

    async def release_lease(self, key: str, owner: str) -> None:
        await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return bool(await self.inner.renew_lease(key, owner, ttl_ms))

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        hand_over = not from_owner.endswith(".0")
        if hand_over and self.lock_file:
            self.lock_file = False
            locked = threading.Event()
            locker = threading.Thread(target=self._hold_write_lock, args=(locked,))
            locker.start()
            self.lockers.append(locker)
            locked.wait()
            self.transfer_started.set()
        ok = bool(await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms))
        if ok and hand_over:
            self.fail_token_read, armed = False, self.fail_token_read
            self._armed = armed
        return ok

    def _hold_write_lock(self, locked: threading.Event) -> None:
        blocker = sqlite3.connect(self.path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            locked.set()
            time.sleep(0.5)
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()

    _armed = False

    async def get_lease(self, key: str) -> LeaseRecord | None:
        if self._armed:
            self._armed = False
            self.token_reads_failed += 1
            raise BackendUnavailable("simulated network error") from OSError("connection reset")
        record: LeaseRecord | None = await self.inner.get_lease(key)
        return record


@pytest.mark.asyncio
async def test_a_token_read_that_fails_after_a_hand_over_is_read_again_never_guessed(
    tmp_path: Path,
) -> None:
    tokens: list[tuple[Any, int | None]] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            tokens.append((signal.payload, run.token))
            return  # one signal a run: signal 2 gets a run of its own, by hand-over

    path = tmp_path / "tenure.db"
    async with from_url(f"sqlite:///{path}") as sqlite:
        leases = HandOverFaults(sqlite, path)
        leases.fail_token_read = True
        async with ThreadRuntime(sqlite, handler, lease_provider=leases, idle_timeout=0.05) as rt:
            await rt.send_signal("t", 1)
            await rt.send_signal("t", 2)
            await eventually(lambda: len(tokens) == 2 and not rt.owned_threads())
    assert leases.token_reads_failed == 1
    (_, first), (_, second) = tokens
    assert first is not None and second is not None and second > first


@pytest.mark.asyncio
async def test_aclose_during_a_hand_over_leaves_no_lease_held(tmp_path: Path) -> None:
    # The hand-over's transfer waits behind another connection's write lock, and
    # aclose() comes meanwhile; the transfer still lands after aclose stopped
    # waiting for it. The lease must not stay with the next run's name, a run
    # that never starts (the next runtime would wait the whole TTL).
    handed: list[Any] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handed.append(signal.payload)
            return

    path = tmp_path / "tenure.db"
    async with from_url(f"sqlite:///{path}") as sqlite:
        leases = HandOverFaults(sqlite, path)
        leases.lock_file = True
        rt = ThreadRuntime(sqlite, handler, lease_provider=leases, idle_timeout=0.05, ttl_ms=30_000)
        await rt.send_signal("t", 1)
        await rt.send_signal("t", 2)
        await leases.transfer_started.wait()
        await rt.aclose()
        for locker in leases.lockers:
            locker.join()
        assert await sqlite.get_lease_owner(rt.lease_key("t")) is None
    assert handed == [1]


@pytest.mark.asyncio
async def test_an_interrupt_request_that_arrives_after_its_signal_ran_changes_nothing(
    tmp_path: Path,
) -> None:
    # A sender elsewhere publishes signal A, then, a round trip later, the request
    # to interrupt for it; the owner reads the two on separate subscriptions. Here
    # the request comes after A ran and while B (sent after A) runs, C waiting: it
    # must neither cancel B nor skip C, which were sent after A. D's request, read
    # after A's on the same subscription, then interrupts as it should.
    handled: list[Any] = []
    events: list[RuntimeEvent] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append(signal.payload)
            if signal.payload == "B":
                await asyncio.Event().wait()  # runs until interrupted

    path = tmp_path / "tenure.db"
    async with (
        from_url(f"sqlite:///{path}") as sqlite,
        ThreadRuntime(
            sqlite, handler, policy="interrupt", idle_timeout=10, on_event=events.append
        ) as rt,
    ):
        log: Any = sqlite
        await rt.send_signal("t", "start")  # this process owns the thread from here

        async def sent_elsewhere(payload: str) -> Event:
            # What a sender's first round trip stores (its request still to come).
            stored: Event = await log.publish(
                rt.topic("t"), Event(SIGNAL_TYPE, {"thread": "t", "payload": payload})
            )
            return stored

        async def request(signal: Event) -> None:
            # The sender's second round trip.
            data = {"signal": signal.id, "sent_at": signal.created_at}
            await log.publish(rt.names.control("t"), Event(INTERRUPT, data))

        a = await sent_elsewhere("A")
        await eventually(lambda: "A" in handled)
        await sent_elsewhere("B")
        await eventually(lambda: "B" in handled)
        await sent_elsewhere("C")
        await request(a)  # late: A ran already
        d = await sent_elsewhere("D")
        await request(d)
        await eventually(lambda: "D" in handled)
    interrupts = [e for e in events if e.kind == "interrupted" and "waiting" in (e.detail or "")]
    assert [e.signal_id for e in interrupts] == [d.id]
    assert handled == ["start", "A", "B", "D"]  # C, sent before D, skipped by D's request
