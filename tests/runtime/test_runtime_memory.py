"""The thread runtime in one process, on the memory backend.

Several runtimes built on one ``MemoryPubSub`` stand for several processes: they
share its leases and the process-local signal log, so routing, hand-over and
exclusivity are exercised here quickly; ``test_runtime_processes.py`` does the
same with real processes on SQLite and Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio

from tenure import (
    BackendClosed,
    Event,
    InvalidArgument,
    MemoryPubSub,
    PubSub,
    ThreadRun,
    ThreadRuntime,
)
from tenure.runtime import RuntimeEvent, Signal, _sending
from tenure.testing import ManualClock, eventually

Handler = Callable[[ThreadRun], Awaitable[None]]


@pytest_asyncio.fixture
async def backend() -> AsyncIterator[MemoryPubSub]:
    async with MemoryPubSub() as b:
        yield b


class Recorder:
    """A handler that records what each run read, and checks runs never overlap."""

    def __init__(self, *, one_per_run: bool = False, work: float = 0.0) -> None:
        self.one_per_run = one_per_run
        self.work = work
        self.handled: list[tuple[str, Any, str, int]] = []  # thread, payload, run id, attempt
        self.active: dict[str, int] = {}
        self.max_active = 0
        self.runs: list[ThreadRun] = []

    async def __call__(self, run: ThreadRun) -> None:
        self.runs.append(run)
        self.active[run.thread_key] = self.active.get(run.thread_key, 0) + 1
        self.max_active = max(self.max_active, self.active[run.thread_key])
        try:
            async for signal in run.signals():
                if self.work:
                    await asyncio.sleep(self.work)
                self.handled.append((signal.thread_key, signal.payload, run.run_id, signal.attempt))
                if self.one_per_run:
                    return
        finally:
            self.active[run.thread_key] -= 1

    def payloads(self, thread: str) -> list[Any]:
        return [p for t, p, _, _ in self.handled if t == thread]


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    await eventually(predicate, timeout=timeout, interval=0.005)


def runtime(backend: Any, handler: Handler, **options: Any) -> ThreadRuntime:
    options.setdefault("ttl_ms", 3000)
    options.setdefault("idle_timeout", 0.1)
    return ThreadRuntime(backend, handler, **options)


@pytest.mark.asyncio
async def test_first_signal_wakes_and_later_ones_are_delivered_to_that_run(
    backend: MemoryPubSub,
) -> None:
    rec = Recorder()
    events: list[RuntimeEvent] = []
    async with (
        runtime(backend, rec, process_id="a", on_event=events.append) as a,
        runtime(backend, rec, process_id="b", on_event=events.append) as b,
    ):
        first = await a.send_signal("thread", 1)
        second = await b.send_signal("thread", 2)
        third = await a.send_signal("thread", 3)
        assert first.outcome == "wake"
        assert (second.outcome, second.run_id) == ("deliver", first.run_id)
        assert (third.outcome, third.run_id) == ("deliver", first.run_id)
        assert len({first.signal_id, second.signal_id, third.signal_id}) == 3
        await wait_until(lambda: len(rec.handled) == 3)
        assert rec.payloads("thread") == [1, 2, 3]
        assert {run_id for _, _, run_id, _ in rec.handled} == {first.run_id}
        assert len(rec.runs) == 1
        assert rec.runs[0].process_id == "a"
    kinds = [(e.kind, e.process_id) for e in events]
    assert ("wake", "a") in kinds
    assert ("deliver", "b") in kinds
    assert [e.signal_id for e in events if e.kind == "signal"] == [
        first.signal_id,
        second.signal_id,
        third.signal_id,
    ]


@pytest.mark.asyncio
async def test_concurrent_senders_never_run_a_thread_twice_and_keep_send_order(
    backend: MemoryPubSub,
) -> None:
    rec = Recorder(work=0.001)
    runtimes = [runtime(backend, rec, process_id=f"p{i}") for i in range(4)]
    threads = [f"t{i}" for i in range(3)]

    async def sender(rt: ThreadRuntime, n: int) -> None:
        for i in range(n):
            for t in threads:
                await rt.send_signal(t, [rt.process_id, i])
            if i % 5 == 0:
                await asyncio.sleep(0.02)

    try:
        await asyncio.gather(*(sender(rt, 20) for rt in runtimes))
        await wait_until(lambda: len(rec.handled) == 4 * 20 * 3)
    finally:
        for rt in runtimes:
            await rt.aclose()
    assert rec.max_active == 1
    for t in threads:
        got = rec.payloads(t)
        assert len(got) == 80
        for rt in runtimes:
            mine = [i for pid, i in got if pid == rt.process_id]
            assert mine == list(range(20)), (t, rt.process_id, mine)


@pytest.mark.asyncio
async def test_waiting_signals_hand_the_lease_over_without_a_gap(backend: MemoryPubSub) -> None:
    rec = Recorder(one_per_run=True, work=0.01)
    events: list[RuntimeEvent] = []
    rt = runtime(backend, rec, process_id="a", on_event=events.append)
    key = rt.lease_key("thread")
    samples: list[tuple[float, str | None]] = []
    stop = asyncio.Event()

    async def poll() -> None:
        while not stop.is_set():
            lease = await backend.get_lease(key)
            samples.append((time.monotonic(), None if lease is None else lease.owner))
            await asyncio.sleep(0)

    async with rt:
        for i in range(5):
            await rt.send_signal("thread", i)
        poller = asyncio.ensure_future(poll())
        await wait_until(lambda: len(rec.handled) == 5)
        stop.set()
        await poller
    assert rec.payloads("thread") == [0, 1, 2, 3, 4]
    run_ids = [run_id for _, _, run_id, _ in rec.handled]
    assert len(set(run_ids)) == 5
    # One session, its runs numbered in order: "<session>.1", "<session>.2", ...
    session = run_ids[0].rpartition(".")[0]
    assert run_ids == [f"{session}.{n}" for n in range(1, 6)]
    handovers = [e for e in events if e.kind == "handover"]
    assert [e.run_id for e in handovers] == run_ids[1:]
    tokens = [r.token for r in rec.runs if r.token is not None]
    assert len(tokens) == 5
    assert tokens == sorted(set(tokens)), tokens
    # Each hand-over names the thread, the new run's token and the run before it.
    assert [(e.thread_key, e.token, e.detail) for e in handovers] == [
        ("thread", token, previous) for token, previous in zip(tokens[1:], run_ids, strict=False)
    ]
    # Sampled from before the first hand-over until the last run took its
    # signal, the lease always has an owner, and it is one of the runs.
    last_taken = max(e.at for e in events if e.kind == "signal")
    during = [owner for at, owner in samples if at < last_taken]
    assert len(during) > 10
    assert None not in during
    assert set(during) <= {f"a/{r}" for r in run_ids}
    assert not [e for e in events if e.kind == "release" and e.at < handovers[-1].at]


@pytest.mark.asyncio
async def test_a_signal_the_handler_failed_on_is_delivered_again(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[str, int, str]] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            seen.append((signal.id, signal.attempt, run.run_id))
            if signal.attempt == 1:
                raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="tenure.runtime"):
        async with runtime(backend, handler) as rt:
            sent = await rt.send_signal("thread", "x")
            await wait_until(lambda: len(seen) == 2)
    assert [(sid, attempt) for sid, attempt, _ in seen] == [
        (sent.signal_id, 1),
        (sent.signal_id, 2),
    ]
    assert seen[0][2] != seen[1][2]  # the second delivery went to a new run
    assert "raised" in caplog.text


@pytest.mark.asyncio
async def test_a_run_whose_lease_is_lost_is_told_and_cancelled() -> None:
    clock = ManualClock()
    cancelled = asyncio.Event()
    started = asyncio.Event()
    lost_seen: list[bool] = []
    events: list[RuntimeEvent] = []

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                lost_seen.append(run.lost.is_set())
                cancelled.set()
                raise

    async with MemoryPubSub(clock=clock) as backend:
        rt = runtime(backend, handler, ttl_ms=1000, renew_every_ms=50, on_event=events.append)
        async with rt:
            await rt.send_signal("thread", "x")
            await asyncio.wait_for(started.wait(), 5)
            clock.advance_ms(1500)  # the lease expires between two renewals
            await asyncio.wait_for(cancelled.wait(), 5)
    assert lost_seen == [True]
    lost = [e for e in events if e.kind == "lost"]
    assert len(lost) == 1 and lost[0].detail and "refused" in lost[0].detail


@pytest.mark.asyncio
async def test_without_cancel_on_loss_the_run_sees_lost_and_ensure_held_raises() -> None:
    clock = ManualClock()
    outcome: list[str] = []
    started = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            started.set()
            await asyncio.wait_for(run.lost.wait(), 5)
            try:
                run.ensure_held()
            except Exception as exc:
                outcome.append(type(exc).__name__)

    async with MemoryPubSub(clock=clock) as backend:
        rt = runtime(backend, handler, ttl_ms=1000, renew_every_ms=50, cancel_on_loss=False)
        async with rt:
            await rt.send_signal("thread", "x")
            await asyncio.wait_for(started.wait(), 5)
            clock.advance_ms(1500)
            await wait_until(lambda: bool(outcome))
    assert outcome == ["LeaseLost"]


class NoLeases(PubSub):
    """A pub/sub backend that says it has no leases (a wrapper around memory)."""

    def __init__(self) -> None:
        self.inner = MemoryPubSub()

    def get_lease_provider(self) -> None:
        return None

    async def publish(self, topic: str, event: Event) -> Event:
        return await self.inner.publish(topic, event)

    async def subscribe(self, topic: str, callback: Any, *, group: str | None = None) -> None:
        await self.inner.subscribe(topic, callback, group=group)

    async def unsubscribe(self, topic: str, callback: Any) -> None:
        await self.inner.unsubscribe(topic, callback)

    async def flush(self) -> None:
        await self.inner.flush()

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.asyncio
async def test_without_leases_it_says_so_and_works_in_one_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec = Recorder(work=0.001)
    async with NoLeases() as backend:
        with caplog.at_level(logging.WARNING, logger="tenure.runtime"):
            rt = runtime(backend, rec)
        assert "single-process" in caplog.text
        async with rt:
            results = [await rt.send_signal("thread", i) for i in range(10)]
            await wait_until(lambda: len(rec.handled) == 10)
    assert [r.outcome for r in results] == ["wake"] + ["deliver"] * 9
    assert rec.payloads("thread") == list(range(10))
    assert rec.max_active == 1


@pytest.mark.asyncio
async def test_signals_sent_around_the_idle_deadline_are_never_lost(backend: MemoryPubSub) -> None:
    # Sends land just before, at and after the moment the owner decides the
    # thread is idle, from the owning runtime and from another one.
    rec = Recorder()
    idle = 0.05
    a = runtime(backend, rec, process_id="a", idle_timeout=idle, sweep_interval=0.02)
    b = runtime(backend, rec, process_id="b", idle_timeout=idle, sweep_interval=0.02)
    sent = 0
    async with a, b:
        for i in range(40):
            await (a if i % 3 else b).send_signal("thread", i)
            sent += 1
            await asyncio.sleep(idle * (0.5 + (i % 7) / 4))
        await wait_until(lambda: len(rec.handled) == sent)
    assert rec.payloads("thread") == list(range(sent))
    assert rec.max_active == 1


@pytest.mark.asyncio
async def test_arguments_are_checked_before_anything_is_sent(backend: MemoryPubSub) -> None:
    rec = Recorder()
    rt = runtime(backend, rec)
    async with rt:
        with pytest.raises(InvalidArgument, match="thread_key"):
            await rt.send_signal("", 1)
        with pytest.raises(InvalidArgument, match="thread_key"):
            await rt.send_signal(b"x", 1)  # type: ignore[arg-type]  # a bad argument on purpose
        with pytest.raises(InvalidArgument, match="payload"):
            await rt.send_signal("thread", object())
        assert rt.owned_threads() == []
    with pytest.raises(BackendClosed):
        await rt.send_signal("thread", 1)
    with pytest.raises(InvalidArgument, match="renew_every_ms"):
        ThreadRuntime(backend, rec, ttl_ms=1000, renew_every_ms=1000)
    with pytest.raises(InvalidArgument, match="handler"):
        ThreadRuntime(backend, "nope")  # type: ignore[arg-type]  # a bad argument on purpose


@pytest.mark.asyncio
async def test_keys_with_nul_and_long_keys_are_distinct_threads(backend: MemoryPubSub) -> None:
    rec = Recorder()
    # Topics are "tenure.thread:" (or "tenure.thread#i:") + the key, at most 1024 bytes.
    long_a, long_b = "x" * 1007 + "a", "x" * 1007 + "b"
    async with runtime(backend, rec) as rt:
        for key in ["res\0t1", "res\0t2", long_a, long_b]:
            await rt.send_signal(key, key[-2:])
        await wait_until(lambda: len(rec.handled) == 4)
        assert rt.lease_key(long_a) != rt.lease_key(long_b)
        with pytest.raises(InvalidArgument, match="at most 1008 bytes"):
            await rt.send_signal("x" * 1009, "too long")
    assert sorted(t for t, _, _, _ in rec.handled) == sorted(["res\0t1", "res\0t2", long_a, long_b])


def test_signal_is_a_frozen_value() -> None:
    s = Signal("id", "t", {"a": 1}, 1.0)
    with pytest.raises(AttributeError):
        s.id = "other"  # type: ignore[misc]  # frozen on purpose
    assert s.attempt == 1


class SlowRelease:
    """The memory backend's leases, with a pause inside ``release_lease``.

    It holds a session in its last step (lease still held, subscription gone)
    long enough for a test to send into that window.
    """

    def __init__(self, inner: MemoryPubSub) -> None:
        self.inner = inner
        self.releasing = asyncio.Event()

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> Any:
        return await self.inner.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self.inner.get_lease_owner(key)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)

    async def release_lease(self, key: str, owner: str) -> None:
        self.releasing.set()
        await asyncio.sleep(0.1)
        await self.inner.release_lease(key, owner)


@pytest.mark.parametrize("sender", ["owner", "other"])
@pytest.mark.asyncio
async def test_a_signal_sent_while_the_owner_releases_is_run_afterwards(
    backend: MemoryPubSub, sender: str
) -> None:
    rec = Recorder()
    leases = SlowRelease(backend)
    a = runtime(backend, rec, process_id="a", lease_provider=leases, sweep_interval=0.05)
    b = runtime(backend, rec, process_id="b", lease_provider=leases, sweep_interval=0.05)
    async with a, b:
        await a.send_signal("thread", 0)
        await asyncio.wait_for(leases.releasing.wait(), 5)
        late = await (a if sender == "owner" else b).send_signal("thread", 1)
        assert late.outcome == "deliver"
        await wait_until(lambda: len(rec.handled) == 2)
    assert rec.payloads("thread") == [0, 1]


@pytest.mark.asyncio
async def test_a_handler_that_never_reads_does_not_spin(
    backend: MemoryPubSub, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[str] = []

    async def lazy(run: ThreadRun) -> None:
        runs.append(run.run_id)

    with caplog.at_level(logging.WARNING, logger="tenure.runtime"):
        async with runtime(backend, lazy) as rt:
            await rt.send_signal("thread", "ignored")
            await wait_until(lambda: "dropping it" in caplog.text)
            await asyncio.sleep(0.3)
    # One run per delivery attempt of the local log (5), then the signal is dropped.
    assert len(runs) == 5
    assert f"run {runs[0]} of thread 'thread' returned without reading its signals" in [
        r.getMessage() for r in caplog.records if r.name == "tenure.runtime"
    ]


@pytest.mark.asyncio
async def test_a_signal_sent_on_a_recent_refusal_after_its_owner_closed_is_run_by_the_sweep(
    backend: MemoryPubSub, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sender whose lease attempt was refused moments ago publishes the thread's
    # next signals without trying the lease again. Here "moments" lasts the whole
    # test, so the owner closes inside the window: the signal it no longer reads
    # must still run, started by the sweep.
    monkeypatch.setattr(_sending, "HELD_ELSEWHERE_FOR", 60.0)
    rec = Recorder()
    async with runtime(backend, rec, process_id="b", sweep_interval=0.05) as b:
        async with runtime(backend, rec, process_id="a", idle_timeout=30) as a:
            first = await a.send_signal("thread", 1)
            sent = [await b.send_signal("thread", n) for n in (2, 3, 4)]
            assert first.outcome == "wake"
            assert [(s.outcome, s.run_id) for s in sent] == [("deliver", first.run_id)] * 3
            await wait_until(lambda: rec.payloads("thread") == [1, 2, 3, 4])
        late = await b.send_signal("thread", 5)
        # Trusted refusal: no lease attempt, although the thread is free now.
        assert (late.outcome, late.run_id) == ("deliver", first.run_id)
        await wait_until(lambda: rec.payloads("thread") == [1, 2, 3, 4, 5])
    assert [run.process_id for run in rec.runs] == ["a", "b"]
