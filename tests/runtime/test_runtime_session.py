"""A thread's session, step by step (memory backend): what it tells when its lease
is lost, its hand-overs, its close handshake, interrupts, and ``aclose``.

The events a runtime emits (``on_event``), its log lines and the errors a run
sees are what an operator reads, so they are checked exactly here.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tenure import (
    BackendClosed,
    BackendUnavailable,
    Capability,
    Event,
    LeaseLost,
    MemoryPubSub,
    ThreadRun,
    ThreadRuntime,
    capabilities_of,
    from_url,
)
from tenure.runtime import RuntimeEvent, Signal
from tenure.runtime._log import CLOSE_MARKER, GROUP, INTERRUPT
from tenure.testing import ManualClock, eventually

from ..hold.support import FiveMethodsOnly, stall
from .test_runtime_loss import FailingCalls


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
    assert not of_kind(events, "release")  # a lost lease is not announced as released
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


@pytest.mark.asyncio
async def test_a_run_kept_after_its_lease_moved_on_or_was_released_is_not_held(
    backend: MemoryPubSub,
) -> None:
    # A handler may keep its ThreadRun (in a task of its own, say). Once the lease
    # was handed over to the next run, or released as the session ended,
    # ensure_held raises for it, as HeldLease.ensure_held does after a transfer
    # or a release.
    runs: list[ThreadRun] = []
    during: list[str] = []  # what the first run's ensure_held says during the second

    async def handler(run: ThreadRun) -> None:
        runs.append(run)
        async for _ in run.signals():
            run.ensure_held()
            if len(runs) == 2:
                try:
                    runs[0].ensure_held()
                    during.append("held")
                except LeaseLost as exc:
                    during.append(exc.reason)
            return

    rt = ThreadRuntime(backend, handler, idle_timeout=0.05, sweep_interval=60)
    async with rt:
        await rt.send_signal("t", 1)
        await rt.send_signal("t", 2)
        await eventually(lambda: len(runs) == 2 and not rt.owned_threads())
    first, second = runs
    assert second.run_id == f"{session_of(first.run_id)}.2"  # a hand-over
    assert during == [f"it was handed over to run {second.run_id}"]
    for run, reason in [
        (first, f"it was handed over to run {second.run_id}"),
        (second, "it was released"),
    ]:
        with pytest.raises(LeaseLost) as caught:
            run.ensure_held()
        error = caught.value
        assert (error.key, error.owner, error.reason) == (
            rt.lease_key("t"),
            f"{rt.process_id}/{run.run_id}",
            reason,
        )


# -- the close handshake ----------------------------------------------------------


class MarkerLog:
    """The memory backend as a runtime's log, with its close markers held back on demand.

    ``markers``: ``"deliver"`` (as the memory backend does), ``"hang"`` (the
    marker's publish never returns: a log that stopped answering), ``"drop"``
    (published, never read back: a subscription that stopped delivering) or
    ``"hold"`` (the publish waits for ``release``: a slow log) or ``"fail"`` (the
    publish raises: a log that is unavailable). Everything else,
    the leases included, is the memory backend's. No real fault of the memory
    backend reaches a session's close marker, and on a server none can be timed
    to land on it. ``publishing`` is set when a marker's publish starts;
    ``backlogs`` counts the runtime's sweeps (``backlog`` calls).
    """

    capabilities = Capability.EVENTS | Capability.RECLAIM | Capability.BACKLOG | Capability.DEDUPE

    def __init__(self, inner: MemoryPubSub, markers: str = "deliver") -> None:
        self.inner = inner
        self.markers = markers
        self.publishing = asyncio.Event()
        self.release = asyncio.Event()
        self.backlogs = 0
        self.markers_published = 0
        # Subscriptions made minus those ended, by topic and callback.
        self.subscriptions: Counter[tuple[str, Any]] = Counter()
        # The next subscribe to this topic fails (no real fault reaches it on memory).
        self.fail_subscribe: str | None = None
        # Unsubscribes hang (a log that stopped answering): those still hanging.
        self.hang_unsubscribes = False
        self.hanging: list[tuple[str, Any]] = []

    def get_lease_provider(self) -> MemoryPubSub:
        return self.inner

    async def publish(self, topic: str, event: Event) -> Event:
        if event.type == CLOSE_MARKER:
            self.publishing.set()
            self.markers_published += 1
            if self.markers == "fail":
                raise BackendUnavailable("simulated network error")
            if self.markers == "hang":
                await asyncio.Event().wait()
            if self.markers == "drop":
                return event
            if self.markers == "hold":
                await self.release.wait()
        return await self.inner.publish(topic, event)

    async def subscribe(self, topic: str, callback: Any, *, group: str | None = None) -> None:
        if topic == self.fail_subscribe:
            self.fail_subscribe = None
            raise BackendUnavailable("simulated network error")
        await self.inner.subscribe(topic, callback, group=group)
        self.subscriptions[topic, callback] += 1

    async def unsubscribe(self, topic: str, callback: Any) -> None:
        self.subscriptions[topic, callback] -= 1
        if self.hang_unsubscribes:
            self.hanging.append((topic, callback))
            await asyncio.Event().wait()
        await self.inner.unsubscribe(topic, callback)

    async def reclaim(self, topic: str, group: str) -> int:
        return await self.inner.reclaim(topic, group)

    async def backlog(self, prefix: str, group: str, *, skip: Collection[str] = ()) -> list[str]:
        self.backlogs += 1
        return await self.inner.backlog(prefix, group, skip=skip)

    async def flush(self) -> None:
        await self.inner.flush()


def session_of(run_id: str | None) -> str:
    assert run_id is not None
    return run_id.rpartition(".")[0]


@pytest.mark.asyncio
async def test_an_idle_thread_closes_cleanly_after_reading_its_close_marker(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    events: list[RuntimeEvent] = []
    handled: list[Any] = []

    async def handler(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    log = MarkerLog(backend)
    rt = ThreadRuntime(
        log, handler, idle_timeout=0.05, sweep_interval=60, marker_timeout=5, on_event=events.append
    )
    async with rt:
        sent = await rt.send_signal("t", 1)
        await eventually(lambda: not rt.owned_threads())
        assert log.markers_published == 1
        # A clean close gives the sweep nothing to look for: it was not woken. The
        # marker was read back: nothing of the thread is left in the log.
        assert log.backlogs == 0
        status = await rt.thread_status("t")
        assert (status.owner, status.pending) == (None, False)
    assert handled == [1]
    assert [(e.kind, e.run_id) for e in events] == [
        ("wake", sent.run_id),
        ("signal", sent.run_id),
        ("run_end", sent.run_id),
        ("release", sent.run_id),
    ]
    token = events[0].token
    assert token is not None
    assert described(events, "release") == [("release", "t", sent.run_id, token, None, None)]
    assert messages(caplog, "tenure.runtime", logging.WARNING) == []
    assert messages(caplog, "tenure.memory", logging.WARNING) == []


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("fault", "warning"),
    [
        ("hang", "publishing the close marker of session {} on 't' took over 0.2 s; closing"),
        ("drop", "close marker of session {} on 't' not read back within 0.2 s; closing"),
    ],
    ids=["publish-hangs", "never-read-back"],
)
async def test_a_close_marker_that_fails_closes_the_session_after_marker_timeout(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture, fault: str, warning: str
) -> None:
    caplog.set_level(logging.WARNING, logger="tenure.runtime")
    events: list[RuntimeEvent] = []

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            pass

    log = MarkerLog(backend, fault)
    rt = ThreadRuntime(
        log,
        handler,
        idle_timeout=0.05,
        sweep_interval=60,
        marker_timeout=0.2,
        on_event=events.append,
    )
    async with rt:
        sent = await rt.send_signal("t", 1)
        await eventually(lambda: not rt.owned_threads())
        assert await backend.get_lease_owner(rt.lease_key("t")) is None
    assert [e.kind for e in events] == ["wake", "signal", "run_end", "release"]
    assert messages(caplog, "tenure.runtime", logging.WARNING) == [
        warning.format(session_of(sent.run_id))
    ]


@pytest.mark.asyncio
async def test_a_signal_sent_while_the_close_marker_hangs_is_run_at_once_by_a_new_session(
    backend: MemoryPubSub,
) -> None:
    # The session gives up on its marker and closes; the signal sent meanwhile
    # went back to the log. The runtime sweeps at once for it (its sweep
    # interval here is a minute).
    handled: list[tuple[str, Any]] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append((run.run_id, signal.payload))  # noqa: PERF401 - as each is handled

    log = MarkerLog(backend, "hang")
    rt = ThreadRuntime(log, handler, idle_timeout=0.05, sweep_interval=60, marker_timeout=0.2)
    async with rt:
        await rt.send_signal("t", 1)
        await asyncio.wait_for(log.publishing.wait(), 5)
        late = await rt.send_signal("t", 2)
        assert late.outcome == "deliver"
        await eventually(lambda: len(handled) == 2, timeout=5)
    assert [payload for _, payload in handled] == [1, 2]
    first_run, second_run = (run_id for run_id, _ in handled)
    assert session_of(first_run) != session_of(second_run)


@pytest.mark.asyncio
async def test_a_signal_that_comes_before_the_close_marker_is_run_by_the_same_session(
    backend: MemoryPubSub,
) -> None:
    events: list[RuntimeEvent] = []
    handled: list[tuple[str, Any]] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append((run.run_id, signal.payload))  # noqa: PERF401 - as each is handled

    log = MarkerLog(backend, "hold")
    rt = ThreadRuntime(
        log, handler, idle_timeout=0.05, sweep_interval=60, marker_timeout=5, on_event=events.append
    )
    async with rt:
        first = await rt.send_signal("t", 1)
        await asyncio.wait_for(log.publishing.wait(), 5)
        await rt.send_signal("t", 2)  # stored before the marker
        log.markers = "deliver"
        log.release.set()
        await eventually(lambda: len(handled) == 2)
        await eventually(lambda: not rt.owned_threads())
    session = session_of(first.run_id)
    assert handled == [(f"{session}.1", 1), (f"{session}.2", 2)]
    [handover] = of_kind(events, "handover")
    assert (handover.run_id, handover.detail) == (f"{session}.2", f"{session}.1")


# -- interrupts -------------------------------------------------------------------


class Interruptible:
    """A handler for the ``interrupt`` policy: "slow" blocks until the run is cancelled."""

    def __init__(self) -> None:
        self.runs: list[ThreadRun] = []
        self.handled: list[tuple[str, Any]] = []
        self.cancelled: list[tuple[str, bool, tuple[Any, ...]]] = []
        self.busy = asyncio.Event()

    async def __call__(self, run: ThreadRun) -> None:
        self.runs.append(run)
        try:
            async for signal in run.signals():
                self.handled.append((run.run_id, signal.payload))
                if signal.payload == "slow":
                    self.busy.set()
                    await asyncio.sleep(3600)
        except asyncio.CancelledError as exc:
            self.cancelled.append((run.run_id, run.interrupted, exc.args))
            raise

    def payloads(self) -> list[Any]:
        return [payload for _, payload in self.handled]


def described(events: list[RuntimeEvent], *kinds: str) -> list[tuple[Any, ...]]:
    """The events of ``kinds``, each as (kind, thread, run id, token, signal id, detail)."""
    return [
        (e.kind, e.thread_key, e.run_id, e.token, e.signal_id, e.detail)
        for e in events
        if e.kind in kinds
    ]


async def until_queued(rt: ThreadRuntime, thread_key: str, count: int) -> None:
    async def queued() -> int | None:
        return (await rt.thread_status(thread_key)).queued

    deadline = time.monotonic() + 10
    while await queued() != count:
        assert time.monotonic() < deadline, f"never {count} queued"
        await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_an_interrupt_skips_the_waiting_signals_sent_before_it(backend: MemoryPubSub) -> None:
    # a runs the thread; b (enqueue policy) queues two signals behind the busy run
    # without interrupting it; c's signal interrupts it: the two are acknowledged
    # unhandled, and the next run starts with c's.
    handler = Interruptible()
    events: list[RuntimeEvent] = []
    options: dict[str, Any] = {"idle_timeout": 0.05, "sweep_interval": 60}
    a = ThreadRuntime(backend, handler, policy="interrupt", on_event=events.append, **options)
    b = ThreadRuntime(backend, handler, policy="enqueue", **options)
    c = ThreadRuntime(backend, handler, policy="interrupt", **options)
    async with a, b, c:
        slow = await a.send_signal("t", "slow")
        await asyncio.wait_for(handler.busy.wait(), 5)
        for payload in ("w1", "w2"):
            assert (await b.send_signal("t", payload)).outcome == "deliver"
        await until_queued(a, "t", 2)
        new = await c.send_signal("t", "new")
        await eventually(lambda: "new" in handler.payloads())
        await eventually(lambda: not a.owned_threads())
        # The skipped signals were acknowledged: nothing is left for a later run.
        assert not (await a.thread_status("t")).pending
    assert handler.payloads() == ["slow", "new"]
    first, second = handler.runs
    assert (first.interrupted, second.interrupted) == (True, False)
    assert handler.cancelled == [(first.run_id, True, (f"interrupted by signal {new.signal_id}",))]
    assert first.token is not None and second.token is not None
    w1, w2 = (e.signal_id for e in events if e.kind == "interrupted" and e.detail == "skipped")
    assert described(events, "signal", "interrupted", "run_end") == [
        ("signal", "t", first.run_id, first.token, slow.signal_id, None),
        # Each settled signal is named, before the request's own event.
        ("interrupted", "t", first.run_id, None, w1, "skipped"),
        ("interrupted", "t", first.run_id, None, w2, "skipped"),
        (
            "interrupted",
            "t",
            first.run_id,
            first.token,
            new.signal_id,
            "2 waiting signal(s) skipped",
        ),
        ("interrupted", "t", first.run_id, first.token, slow.signal_id, "cancelled with its run"),
        ("run_end", "t", first.run_id, first.token, None, "interrupted"),
        ("signal", "t", second.run_id, second.token, new.signal_id, None),
        ("run_end", "t", second.run_id, second.token, None, "ok"),
    ]


@pytest.mark.asyncio
async def test_a_local_interrupt_skips_older_signals_that_arrive_after_it(
    backend: MemoryPubSub,
) -> None:
    # The owner's own send interrupts at once, before the log delivers b's older
    # signal: that one is skipped when it arrives.
    handler = Interruptible()
    events: list[RuntimeEvent] = []
    options: dict[str, Any] = {"idle_timeout": 0.05, "sweep_interval": 60}
    a = ThreadRuntime(backend, handler, policy="interrupt", on_event=events.append, **options)
    b = ThreadRuntime(backend, handler, policy="enqueue", **options)
    async with a, b:
        slow = await a.send_signal("t", "slow")
        await asyncio.wait_for(handler.busy.wait(), 5)
        older = await b.send_signal("t", "older")
        new = await a.send_signal("t", "new")
        await eventually(lambda: "new" in handler.payloads())
        await b.send_signal("t", "after")  # skipping has ended with the interrupting signal
        await eventually(lambda: "after" in handler.payloads())
        await eventually(lambda: not a.owned_threads())
        assert not (await a.thread_status("t")).pending
    assert handler.payloads() == ["slow", "new", "after"]
    first = handler.runs[0]
    assert described(events, "interrupted") == [
        (
            "interrupted",
            "t",
            first.run_id,
            first.token,
            new.signal_id,
            "0 waiting signal(s) skipped",
        ),
        ("interrupted", "t", first.run_id, None, older.signal_id, "skipped"),
        ("interrupted", "t", first.run_id, first.token, slow.signal_id, "cancelled with its run"),
    ]


@pytest.mark.asyncio
async def test_controls_that_are_malformed_or_name_the_signal_being_handled_interrupt_nothing(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    handler = Interruptible()
    events: list[RuntimeEvent] = []
    options: dict[str, Any] = {"idle_timeout": 0.05, "sweep_interval": 60}
    a = ThreadRuntime(backend, handler, policy="interrupt", on_event=events.append, **options)
    c = ThreadRuntime(backend, handler, policy="interrupt", **options)
    async with a, c:
        slow = await a.send_signal("t", "slow")
        await asyncio.wait_for(handler.busy.wait(), 5)
        control = a.names.control("t")
        for data in [
            ["not", "a", "mapping"],
            {"signal": 5, "sent_at": 1.0},
            {"signal": "x", "sent_at": "soon"},
            {"signal": "x"},
            {"signal": slow.signal_id, "sent_at": time.time()},  # the one being handled
        ]:
            await backend.publish(control, Event(type=INTERRUPT, data=data))
        # Controls are read in order: once c's interrupt is seen, all of the above were.
        new = await c.send_signal("t", "new")
        await eventually(lambda: "new" in handler.payloads())
    assert handler.payloads() == ["slow", "new"]
    assert [(e.signal_id, e.detail) for e in of_kind(events, "interrupted")] == [
        (new.signal_id, "0 waiting signal(s) skipped"),
        (slow.signal_id, "cancelled with its run"),
    ]
    assert messages(caplog, "tenure.memory", logging.WARNING) == []


@pytest.mark.asyncio
async def test_a_signal_sent_as_the_run_returns_interrupts_nothing(backend: MemoryPubSub) -> None:
    events: list[RuntimeEvent] = []
    handled: list[Any] = []
    returning = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append(signal.payload)
            if signal.payload == "quick":
                returning.set()
                return

    rt = ThreadRuntime(
        backend, handler, policy="interrupt", idle_timeout=0.05, on_event=events.append
    )
    async with rt:
        await rt.send_signal("t", "quick")
        await returning.wait()  # woken before the session learns that the run returned
        await rt.send_signal("t", "next")
        await eventually(lambda: handled == ["quick", "next"])
    assert not of_kind(events, "interrupted")
    assert [e.detail for e in of_kind(events, "run_end")][:1] == ["ok"]


@pytest.mark.asyncio
async def test_a_run_is_interrupted_once_later_signals_run_in_order(backend: MemoryPubSub) -> None:
    handler = Interruptible()
    events: list[RuntimeEvent] = []
    rt = ThreadRuntime(
        backend,
        handler,
        policy="interrupt",
        idle_timeout=0.05,
        sweep_interval=60,
        on_event=events.append,
    )
    async with rt:
        await rt.send_signal("t", "slow")
        await asyncio.wait_for(handler.busy.wait(), 5)
        first = await rt.send_signal("t", "first")
        await rt.send_signal("t", "second")  # the interrupted run has not ended yet
        await eventually(lambda: handler.payloads() == ["slow", "first", "second"])
    requests = [e for e in of_kind(events, "interrupted") if "waiting" in (e.detail or "")]
    assert [e.signal_id for e in requests] == [first.signal_id]


# -- what a run reads -------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_signal_reads_as_sent(backend: MemoryPubSub) -> None:
    got: list[Signal] = []

    async def handler(run: ThreadRun) -> None:
        got.extend([signal async for signal in run.signals()])

    async with ThreadRuntime(backend, handler, idle_timeout=0.05) as rt:
        before = time.time()
        sent = await rt.send_signal("t", {"n": 1})
        await eventually(lambda: bool(got))
        after = time.time()
    [signal] = got
    assert (signal.id, signal.thread_key, signal.payload, signal.attempt) == (
        sent.signal_id,
        "t",
        {"n": 1},
        1,
    )
    assert before <= signal.sent_at <= after  # the sender's wall clock


@pytest.mark.asyncio
async def test_a_run_waits_idle_timeout_for_its_next_signal(backend: MemoryPubSub) -> None:
    handled: list[tuple[str, Any]] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append((run.run_id, signal.payload))  # noqa: PERF401 - as each is handled

    async with ThreadRuntime(backend, handler, idle_timeout=0.9) as rt:
        await rt.send_signal("t", 1)
        await eventually(lambda: len(handled) == 1)
        await rt.send_signal("t", 2)  # well within the idle timeout: the same run reads it
        await eventually(lambda: len(handled) == 2)
    assert [run_id for run_id, _ in handled] == [handled[0][0]] * 2


@pytest.mark.asyncio
async def test_a_run_s_idle_timeout_counts_from_its_latest_signal(backend: MemoryPubSub) -> None:
    """One timer serves a run's waits and moves only when it fires: signals that
    keep coming within the idle timeout keep one run going past its first
    deadline, and once they stop the run ends after the timeout."""
    handled: list[tuple[str, Any, float]] = []
    ended: list[float] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append((run.run_id, signal.payload, time.monotonic()))  # noqa: PERF401 - as each is handled
        ended.append(time.monotonic())

    def handled_count(n: int) -> Callable[[], bool]:
        return lambda: len(handled) == n

    async with ThreadRuntime(backend, handler, idle_timeout=0.5) as rt:
        for i in range(5):  # 1.2 s in all, more than twice the idle timeout
            await rt.send_signal("t", i)
            await eventually(handled_count(i + 1))
            if i < 4:
                await asyncio.sleep(0.3)
        await eventually(lambda: bool(ended), timeout=5)
    assert [payload for _, payload, _ in handled] == [0, 1, 2, 3, 4]
    assert {run_id for run_id, _, _ in handled} == {handled[0][0]}
    assert ended[0] - handled[-1][2] >= 0.5  # the run's clock is the loop's, time.monotonic()


@pytest.mark.asyncio
async def test_a_signal_delivered_again_while_its_run_holds_it_is_handled_once(
    backend: MemoryPubSub,
) -> None:
    # A backend may hand a signal out again while the run still holds it (Redis
    # claims entries idle for long); reclaim does that here.
    handled: list[Any] = []
    holding = asyncio.Event()
    go = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append(signal.payload)
            holding.set()
            await go.wait()

    async with ThreadRuntime(backend, handler, idle_timeout=0.05) as rt:
        await rt.send_signal("t", 1)
        await asyncio.wait_for(holding.wait(), 5)
        assert await backend.reclaim(rt.topic("t"), GROUP) == 1
        go.set()
        await eventually(lambda: not rt.owned_threads())
        assert not (await rt.thread_status("t")).pending
    assert handled == [1]


@pytest.mark.asyncio
async def test_close_markers_of_others_or_malformed_ones_are_ignored(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    events: list[RuntimeEvent] = []
    handled: list[Any] = []
    go = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append(signal.payload)
            await go.wait()

    rt = ThreadRuntime(backend, handler, idle_timeout=0.05, on_event=events.append)
    async with rt:
        await rt.send_signal("t", 1)
        await eventually(lambda: handled == [1])
        for data in ["junk", {"session": "someone-else", "seq": 1}]:
            await backend.publish(rt.topic("t"), Event(type=CLOSE_MARKER, data=data))
        await rt.send_signal("t", 2)
        go.set()
        await eventually(lambda: not rt.owned_threads())
    assert handled == [1, 2]
    assert [e.kind for e in events][-2:] == ["run_end", "release"]
    assert messages(caplog, "tenure.memory", logging.WARNING) == []
    assert messages(caplog, "tenure.runtime", logging.WARNING) == []


# -- sessions and runs: names, tokens, policies --------------------------------------


@pytest.mark.asyncio
async def test_run_ids_and_tokens_of_a_first_and_a_later_session(backend: MemoryPubSub) -> None:
    # A process id may hold a "/": the run id is what follows the last one. The
    # later session finds the thread's group known and skips the opening move.
    runs: list[ThreadRun] = []
    events: list[RuntimeEvent] = []

    async def handler(run: ThreadRun) -> None:
        runs.append(run)
        async for _ in run.signals():
            status = await rt.thread_status("t")
            assert (status.process_id, status.run_id) == ("host/7", run.run_id)
            assert status.local and status.held_ms is not None and status.held_ms >= 0

    rt = ThreadRuntime(
        backend, handler, process_id="host/7", idle_timeout=0.05, on_event=events.append
    )
    async with rt:
        first = await rt.send_signal("t", 1)
        await eventually(lambda: not rt.owned_threads() and len(runs) == 1)
        later = await rt.send_signal("t", 2)
        await eventually(lambda: not rt.owned_threads() and len(runs) == 2)
    assert [r.run_id for r in runs] == [first.run_id, later.run_id]
    for sent, run in zip([first, later], runs, strict=True):
        assert run.run_id == f"{session_of(run.run_id)}.1"
        assert "/" not in run.run_id
        assert run.token is not None
        [wake] = [e for e in of_kind(events, "wake") if e.signal_id == sent.signal_id]
        assert (wake.run_id, wake.token) == (run.run_id, run.token)
    assert runs[0].token is not None and runs[1].token is not None
    assert runs[0].token < runs[1].token
    assert [e.detail for e in of_kind(events, "run_end")] == ["ok", "ok"]


@pytest.mark.asyncio
async def test_under_reject_a_signal_sent_before_the_woken_run_started_is_delivered(
    backend: MemoryPubSub,
) -> None:
    handled: list[Any] = []

    async def handler(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    async with ThreadRuntime(backend, handler, policy="reject", idle_timeout=0.05) as rt:
        first = await rt.send_signal("t", 1)
        second = await rt.send_signal("t", 2)  # the run has not started yet
        await eventually(lambda: handled == [1, 2])
    assert (first.outcome, second.outcome) == ("wake", "deliver")


@pytest.mark.asyncio
async def test_a_run_longer_than_the_ttl_keeps_its_lease() -> None:
    outcome: list[str] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            if signal.payload == "long":
                await asyncio.sleep(0.8)  # work outlasting the 600 ms TTL: renewals keep the lease
                run.ensure_held()
            outcome.append(signal.payload)

    # The second session finds the thread's group known: it keeps the lease it
    # was granted, with no opening move (a session of each kind).
    async with (
        MemoryPubSub() as memory,
        ThreadRuntime(memory, handler, ttl_ms=600, idle_timeout=0.05) as rt,
    ):
        for payload in ("long", "long"):
            await rt.send_signal("t", payload)
            await eventually(lambda: not rt.owned_threads(), timeout=5)
    assert outcome == ["long", "long"]


# -- stopping -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_aclose_returns_once_its_sessions_ended(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tenure.runtime")
    events: list[RuntimeEvent] = []
    steps: list[str] = []
    busy = asyncio.Event()
    cancelled: list[str] = []

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            busy.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                for _ in range(3):  # a handler may take a few steps to clean up
                    await asyncio.sleep(0)
                cancelled.append(run.run_id)
                steps.append("handler done")
                raise

    def on_event(event: RuntimeEvent) -> None:
        events.append(event)
        steps.append(event.kind)

    a = ThreadRuntime(backend, handler, idle_timeout=0.05, on_event=on_event)
    async with a:
        await a.send_signal("t", 1)
        await asyncio.wait_for(busy.wait(), 5)
    # aclose() returned: the running handler was cancelled and finished before its
    # run was announced ended, the session has ended, its lease is released, and
    # its signal is left in the log for the next owner.
    assert cancelled == [events[0].run_id]
    assert steps[-3:] == ["handler done", "run_end", "release"]
    # Cancelled by aclose, not failed (as its span says too).
    assert described(events, "run_end") == [
        ("run_end", "t", events[0].run_id, events[0].token, None, "cancelled")
    ]
    assert messages(caplog, "tenure.runtime", logging.WARNING) == []
    assert not a.owned_threads()
    assert await backend.get_lease_owner(a.lease_key("t")) is None
    status = await ThreadRuntime(backend, handler).thread_status("t")
    assert (status.owner, status.run_id, status.pending) == (None, None, True)


@pytest.mark.asyncio
async def test_aclose_leaves_the_signal_being_handled_unspent(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture
) -> None:
    # The run being handled is cancelled and its signal stays in the log for the
    # next owner as it was: closing a runtime is no failed delivery (a signal
    # whose owner was closed max_attempts times would otherwise be dropped).
    caplog.set_level(logging.WARNING)
    got: list[tuple[str, Signal]] = []
    busy = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            got.append((run.process_id, signal))
            if run.process_id == "a":
                busy.set()
                await asyncio.sleep(3600)

    async with ThreadRuntime(backend, handler, process_id="a", idle_timeout=0.05) as a:
        sent = await a.send_signal("t", 1)
        await asyncio.wait_for(busy.wait(), 5)
        queued = await a.send_signal("t", 2)  # waits behind the busy run
        await until_queued(a, "t", 1)
    events: list[RuntimeEvent] = []
    async with ThreadRuntime(
        backend,
        handler,
        process_id="b",
        idle_timeout=0.05,
        sweep_interval=0.05,
        on_event=events.append,
    ):
        await eventually(lambda: len(got) == 3)
    # b's sweep took the thread over, and said so when its run started.
    [takeover] = of_kind(events, "takeover")
    assert (takeover.thread_key, takeover.process_id) == ("t", "b")
    assert takeover.token is not None and takeover.run_id is not None
    assert [e.kind for e in events if e.run_id == takeover.run_id][:2] == ["takeover", "signal"]
    assert [e.token for e in of_kind(events, "signal")][:1] == [takeover.token]
    assert [(process, s.id, s.attempt) for process, s in got] == [
        ("a", sent.signal_id, 1),
        ("b", sent.signal_id, 1),
        ("b", queued.signal_id, 1),
    ]
    assert messages(caplog, "tenure.memory", logging.WARNING) == []


# -- opening ----------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("failing", [None, "subscribe", "control", "transfer"])
async def test_a_session_ends_every_subscription_it_made_and_only_those(
    backend: MemoryPubSub, failing: str | None
) -> None:
    # Under the interrupt policy a session subscribes to its thread's topic and
    # to its control topic; its opening may fail at either subscribe or at the
    # opening move of its lease.
    handled: list[Any] = []

    async def handler(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    log = MarkerLog(backend)
    provider = FailingCalls(backend)
    rt = ThreadRuntime(
        log,
        handler,
        lease_provider=provider,
        policy="interrupt",
        idle_timeout=0.05,
        sweep_interval=60,
    )
    async with rt:
        if failing == "subscribe":
            log.fail_subscribe = rt.topic("t")
        elif failing == "control":
            log.fail_subscribe = rt.names.control("t")
        elif failing == "transfer":
            provider.transfer = "open"
        if failing is not None:
            with pytest.raises(BackendUnavailable):
                await rt.send_signal("t", 1)
            assert await backend.get_lease_owner(rt.lease_key("t")) is None
            assert log.subscriptions == Counter(dict.fromkeys(log.subscriptions, 0))
            if failing != "subscribe":
                # What it read went back to the log: the runtime sweeps for it at once.
                await eventually(lambda: log.backlogs >= 1)
        await rt.send_signal("t", 1)
        await eventually(lambda: handled == [1] and not rt.owned_threads())
    if failing in (None, "subscribe"):
        assert log.backlogs == 0  # nothing read went back: nothing to sweep for
    assert log.subscriptions, "the session subscribed"
    assert set(log.subscriptions.values()) == {0}
    assert {topic for topic, _ in log.subscriptions} == {rt.topic("t"), rt.names.control("t")}


class ExpiresWhileOpening(FiveMethodsOnly):
    """Lets the lease expire, and another owner take it, right before a session's
    opening move (the transfer from ``".0"``). The expiry and the take are the
    memory backend's own, on its ManualClock; the wrapper only picks the moment,
    which no real schedule can."""

    def __init__(self, inner: MemoryPubSub, clock: ManualClock) -> None:
        super().__init__(inner)
        self.clock = clock

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        if from_owner.endswith(".0"):
            self.clock.advance_ms(ttl_ms + 1)
            assert (await self.inner.acquire_lease(key, "other/x.1", ttl_ms)).acquired
        return await super().transfer_lease(key, from_owner, to_owner, ttl_ms)


@pytest.mark.asyncio
async def test_a_lease_that_expires_while_its_session_opens_fails_the_send() -> None:
    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            pass

    clock = ManualClock()
    async with MemoryPubSub(clock=clock) as memory:
        provider = ExpiresWhileOpening(memory, clock)
        async with ThreadRuntime(memory, handler, lease_provider=provider) as rt:
            with pytest.raises(LeaseLost) as caught:
                await rt.send_signal("t", 1)
            assert not rt.owned_threads()
            assert await memory.get_lease_owner(rt.lease_key("t")) == "other/x.1"
    error = caught.value
    key = rt.lease_key("t")
    assert error.key == key
    assert error.owner.startswith(f"{rt.process_id}/") and error.owner.endswith(".0")
    assert error.reason == "expired while opening"
    assert str(error) == f"lease {key!r} held by {error.owner!r} was lost: expired while opening"


@pytest.mark.asyncio
async def test_a_failed_opening_whose_release_fails_too_raises_the_opening_s_error(
    backend: MemoryPubSub,
) -> None:
    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            pass

    provider = FailingCalls(backend)
    async with ThreadRuntime(backend, handler, lease_provider=provider, ttl_ms=600) as rt:
        provider.transfer, provider.release = "open", True
        with pytest.raises(BackendUnavailable, match="simulated network error"):
            await rt.send_signal("t", 1)
        # The transfer's outcome is unknown (its reply may be what was lost): the
        # lease is released under both names, each release failing here.
        assert provider.failed == ["transfer:open", "release", "release"]
        assert not rt.owned_threads()
        provider.release = False


@pytest.mark.asyncio
async def test_a_failed_signal_goes_back_to_the_log_saying_why(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    events: list[RuntimeEvent] = []
    attempts: list[tuple[str, int]] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            attempts.append((run.run_id, signal.attempt))
            if signal.attempt == 1:
                raise RuntimeError("boom")

    rt = ThreadRuntime(backend, handler, idle_timeout=0.05, on_event=events.append)
    async with rt:
        sent = await rt.send_signal("t", 1)
        await eventually(lambda: len(attempts) == 2)
        await eventually(lambda: not rt.owned_threads())
    (failed_run, _), (next_run, _) = attempts
    assert [attempt for _, attempt in attempts] == [1, 2]
    [record] = [r for r in caplog.records if r.name == "tenure.memory"]
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == f"the handler of thread 't' failed on signal {sent.signal_id}"
    [raised] = [r for r in caplog.records if r.name == "tenure.runtime"]
    assert raised.getMessage() == f"handler of run {failed_run} (thread 't') raised"
    assert raised.exc_info is not None and str(raised.exc_info[1]) == "boom"
    assert [(e.run_id, e.detail) for e in of_kind(events, "run_end")] == [
        (failed_run, "failed"),
        (next_run, "ok"),
    ]


@pytest.mark.asyncio
async def test_a_session_that_fails_says_so_and_still_lets_the_thread_go(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="tenure.runtime")
    events: list[RuntimeEvent] = []

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            pass

    log = MarkerLog(backend, "fail")
    rt = ThreadRuntime(log, handler, idle_timeout=0.05, sweep_interval=60, on_event=events.append)
    async with rt:
        sent = await rt.send_signal("t", 1)
        await eventually(lambda: not rt.owned_threads())
        assert await backend.get_lease_owner(rt.lease_key("t")) is None
    [record] = [r for r in caplog.records if r.name == "tenure.runtime"]
    assert record.getMessage() == f"session {session_of(sent.run_id)} of thread 't' failed"
    assert record.exc_info is not None and isinstance(record.exc_info[1], BackendUnavailable)
    assert [e.kind for e in events] == ["wake", "signal", "run_end", "release"]


@pytest.mark.asyncio
async def test_a_session_and_its_runs_are_named_tasks(backend: MemoryPubSub) -> None:
    names: list[set[str]] = []
    runs: list[ThreadRun] = []

    async def handler(run: ThreadRun) -> None:
        runs.append(run)
        async for _ in run.signals():
            names.append({task.get_name() for task in asyncio.all_tasks()})  # noqa: PERF401

    async with ThreadRuntime(backend, handler, idle_timeout=0.05) as rt:
        await rt.send_signal("t", 1)
        await eventually(lambda: bool(names))
    [run] = runs
    assert {f"tenure-session-{session_of(run.run_id)}", f"tenure-run-{run.run_id}"} <= names[0]


@pytest.mark.asyncio
async def test_a_thread_runs_on_sqlite_its_session_reading_under_its_lease_fence(
    tmp_path: Path,
) -> None:
    # SQLite takes a subscription's events only while the thread's lease is held
    # by the session (Capability.FENCED_TAKES); the memory backend has no fence.
    handled: list[Any] = []

    async def handler(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    async with from_url(f"sqlite:///{tmp_path / 'tenure.db'}") as sqlite:
        assert Capability.FENCED_TAKES in capabilities_of(sqlite)
        async with ThreadRuntime(sqlite, handler, idle_timeout=0.05) as rt:
            await rt.send_signal("t", 1)
            await rt.send_signal("t", 2)
            await eventually(lambda: handled == [1, 2] and not rt.owned_threads())


class SlowOpening(FiveMethodsOnly):
    """Holds a session's opening move (the transfer from ``".0"``) until ``go`` is set:
    a slow lease server at that moment, which no real schedule lands on."""

    def __init__(self, inner: MemoryPubSub) -> None:
        super().__init__(inner)
        self.opening = asyncio.Event()
        self.go = asyncio.Event()

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        if from_owner.endswith(".0"):
            self.opening.set()
            await self.go.wait()
        return await super().transfer_lease(key, from_owner, to_owner, ttl_ms)


@pytest.mark.asyncio
async def test_a_session_still_opening_at_aclose_never_runs_and_aclose_waits_for_it(
    backend: MemoryPubSub,
) -> None:
    ran: list[str] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            ran.append(signal.id)  # noqa: PERF401 (seen as it runs, not at its end)

    provider = SlowOpening(backend)
    rt = ThreadRuntime(backend, handler, lease_provider=provider, idle_timeout=0.05)
    await rt.start()
    sending = asyncio.ensure_future(rt.send_signal("t", 1))
    await asyncio.wait_for(provider.opening.wait(), 5)
    closing = asyncio.ensure_future(rt.aclose())  # the opening session has no task yet
    await asyncio.sleep(0.05)
    provider.go.set()
    await asyncio.wait_for(closing, 10)
    # aclose waited for the opening session, which ended without a run: nothing
    # owned, the lease free, the send told.
    assert rt.owned_threads() == [] and ran == []
    assert await backend.get_lease_owner(rt.names.name("t")) is None
    with pytest.raises(BackendClosed, match="ThreadRuntime is closed"):
        await sending
    await asyncio.sleep(0.2)  # a run started late would show up here
    assert ran == []


@pytest.mark.asyncio
async def test_the_signal_of_a_run_that_lost_its_lease_goes_to_the_next_owner() -> None:
    # Without cancel_on_loss the run returns normally after its loss: its signal
    # is still not acknowledged, and a new session runs it.
    clock = ManualClock()
    got: list[tuple[str, str, int]] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            got.append((run.run_id, signal.id, signal.attempt))
            if len(got) == 1:
                await run.lost.wait()
            return

    async with MemoryPubSub(clock=clock) as backend:
        rt = ThreadRuntime(
            backend,
            handler,
            ttl_ms=1000,
            renew_every_ms=50,
            idle_timeout=0.05,
            cancel_on_loss=False,
        )
        async with rt:
            sent = await rt.send_signal("t", 1)
            await eventually(lambda: len(got) == 1)
            clock.advance_ms(1500)  # the lease expires: the next renewal is refused
            await eventually(lambda: len(got) == 2)
    (lost_run, first_id, _), (next_run, again_id, attempt) = got
    assert first_id == again_id == sent.signal_id
    assert attempt == 1  # a loss spends none of the signal's attempts
    assert session_of(lost_run) != session_of(next_run)


@pytest.mark.asyncio
async def test_a_new_owner_takes_back_what_a_gone_owner_had_read(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture
) -> None:
    # a's log stops answering as a closes: its unsubscribe never completes, so its
    # subscription still holds the two signals it had read (as a crashed
    # process's reads stay pending on Redis). b's session takes them back when it
    # opens, and runs them once a's subscription is finally gone.
    caplog.set_level(logging.INFO, logger="tenure.runtime")
    got: list[tuple[str, Any]] = []
    busy = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            got.append((run.process_id, signal.payload))
            if run.process_id == "a":
                busy.set()
                await asyncio.sleep(3600)

    log = MarkerLog(backend)
    a = ThreadRuntime(log, handler, process_id="a", unsubscribe_timeout=0.05, sweep_interval=60)
    async with a:
        await a.send_signal("t", 1)
        await asyncio.wait_for(busy.wait(), 5)
        await a.send_signal("t", 2)
        await until_queued(a, "t", 1)
        log.hang_unsubscribes = True
    # (the session's control subscription hangs too)
    [(topic, stale)] = [(t, cb) for t, cb in log.hanging if t == a.topic("t")]
    events: list[RuntimeEvent] = []
    b = ThreadRuntime(
        backend,
        handler,
        process_id="b",
        idle_timeout=0.05,
        sweep_interval=0.05,
        on_event=events.append,
    )
    async with b:
        await eventually(lambda: bool(of_kind(events, "takeover")) or bool(b.owned_threads()))
        await backend.unsubscribe(topic, stale)  # a's subscription is gone at last
        await eventually(lambda: [p for w, p in got if w == "b"] == [1, 2])
    took_back = [r.getMessage() for r in caplog.records if "took back" in r.getMessage()]
    assert took_back, "b's session took back nothing"
    # b's sweep took the thread over, and said so when its run started.
    takeover = of_kind(events, "takeover")[0]
    signal = of_kind(events, "signal")[0]
    assert (takeover.thread_key, takeover.process_id) == ("t", "b")
    assert takeover.token is not None
    assert (takeover.run_id, takeover.token) == (signal.run_id, signal.token)
    assert re.fullmatch(
        r"session [0-9a-f]{12} of 't' took back 2 unfinished signal\(s\) of a previous owner",
        took_back[0],
    ), took_back


@pytest.mark.asyncio
async def test_a_takeover_names_the_run_whose_lease_expired() -> None:
    # a's run blocks on its signal, which stays unacknowledged: b's sweeps find
    # the thread and are refused its lease, held by a's run. Then a's lease
    # expires (the clock moves past the TTL) and a is gone before it could renew
    # (closed at once, so neither its renewal nor its sweep comes first, as
    # with a killed process): b takes the thread over and names a's run.
    clock = ManualClock()
    busy = asyncio.Event()
    events: list[RuntimeEvent] = []

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            if run.process_id == "a":
                busy.set()
                await asyncio.sleep(3600)

    async with MemoryPubSub(clock=clock) as backend:
        log = MarkerLog(backend)
        a = ThreadRuntime(
            backend, handler, process_id="a", ttl_ms=1000, renew_every_ms=50, sweep_interval=60
        )
        b = ThreadRuntime(
            log,
            handler,
            process_id="b",
            ttl_ms=1000,
            idle_timeout=0.05,
            sweep_interval=0.02,
            on_event=events.append,
        )
        async with a, b:
            sent = await a.send_signal("t", 1)
            await asyncio.wait_for(busy.wait(), 5)
            swept = log.backlogs
            await eventually(lambda: log.backlogs >= swept + 2)  # one whole sweep refused
            assert not of_kind(events, "takeover")
            clock.advance_ms(1500)  # a's lease expires
            await a.aclose()
            await eventually(lambda: bool(of_kind(events, "takeover")))
    [takeover] = of_kind(events, "takeover")
    assert (takeover.process_id, takeover.detail) == ("b", sent.run_id)
    assert takeover.run_id != sent.run_id


@pytest.mark.asyncio
async def test_a_run_interrupted_before_it_read_anything_spends_no_attempt(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture
) -> None:
    # The first run is interrupted while it prepares, before reading a signal:
    # that is no handler returning without reading, and the interrupting signal
    # runs next on its first attempt.
    caplog.set_level(logging.WARNING)
    got: list[tuple[Any, int]] = []
    runs: list[ThreadRun] = []
    preparing = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        runs.append(run)
        if len(runs) == 1:
            preparing.set()
            await asyncio.sleep(3600)
        async for signal in run.signals():
            got.append((signal.payload, signal.attempt))  # noqa: PERF401 - as each is handled

    options: dict[str, Any] = {"idle_timeout": 0.05, "sweep_interval": 60}
    a = ThreadRuntime(backend, handler, policy="interrupt", **options)
    c = ThreadRuntime(backend, handler, policy="interrupt", **options)
    async with a, c:
        await a.send_signal("t", "first")
        await asyncio.wait_for(preparing.wait(), 5)
        await c.send_signal("t", "new")
        await eventually(lambda: bool(got))
    assert got == [("new", 1)]
    assert messages(caplog, "tenure.runtime", logging.WARNING) == []
