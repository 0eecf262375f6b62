"""Behaviour of the in-memory backend beyond the shared contract suite."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys

import pytest

from tenure import BackendClosed, Event, InvalidArgument, MemoryPubSub
from tenure.testing import ManualClock, eventually


@pytest.mark.asyncio
async def test_a_million_expired_leases_leave_memory_bounded() -> None:
    clock = ManualClock()
    backend = MemoryPubSub(clock=clock)
    peak = 0
    for batch in range(1000):
        for i in range(1000):
            await backend.acquire_lease(f"key-{batch}-{i}", "owner", 5)
        clock.advance_ms(10)  # every lease of the batch has expired
        peak = max(peak, len(backend._leases))
    # Sweeps run whenever the table doubles: at most the last two batches remain.
    assert peak <= 2 * 1000 + 1024
    assert await backend.get_lease_owner("key-999-999") is None
    await backend.aclose()


@pytest.mark.asyncio
async def test_live_leases_survive_sweeps() -> None:
    clock = ManualClock()
    backend = MemoryPubSub(clock=clock)
    await backend.acquire_lease("long", "owner", 10_000_000)
    for i in range(50_000):
        await backend.acquire_lease(f"short-{i}", "owner", 1)
        clock.advance_ms(2)
    assert len(backend._leases) <= 2 * 1 + 1024
    assert await backend.get_lease_owner("long") == "owner"
    await backend.aclose()


@pytest.mark.asyncio
async def test_calls_after_aclose_raise_backend_closed() -> None:
    backend = MemoryPubSub()
    await backend.acquire_lease("k", "o", 1000)
    await backend.aclose()
    await backend.aclose()  # idempotent
    for call in (
        backend.acquire_lease("k", "o", 10),
        backend.get_lease_owner("k"),
        backend.get_lease("k"),
        backend.release_lease("k", "o"),
        backend.renew_lease("k", "o", 10),
        backend.transfer_lease("k", "o", "p", 10),
        backend.publish("t", Event(type="x")),
        backend.flush(),
    ):
        with pytest.raises(BackendClosed):
            await call


@pytest.mark.asyncio
async def test_aclose_stops_every_subscriber_task() -> None:
    backend = MemoryPubSub()

    async def callback(event: Event) -> None:
        await asyncio.sleep(10)

    await backend.subscribe("t", callback)
    await backend.subscribe("t2", callback, group="g")
    await backend.publish("t", Event(type="x"))
    await asyncio.sleep(0)
    before = {t for t in asyncio.all_tasks() if t.get_name().startswith("tenure-memory")}
    assert len(before) == 2
    await backend.aclose()
    assert all(t.done() for t in before)


@pytest.mark.asyncio
async def test_event_dropped_and_logged_after_max_attempts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[int] = []

    async def always_fails(event: Event) -> None:
        seen.append(event.attempt)
        raise RuntimeError("boom (expected by the test)")

    async with MemoryPubSub(max_attempts=3) as backend:
        await backend.subscribe("t", always_fails)
        with caplog.at_level(logging.WARNING, logger="tenure.memory"):
            await backend.publish("t", Event(type="x"))
            await backend.flush()
        assert seen == [1, 2, 3]
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1
        assert "dropping" in errors[0].getMessage()
        await backend.unsubscribe("t", always_fails)


@pytest.mark.asyncio
async def test_group_event_survives_a_member_leaving_mid_delivery() -> None:
    started = asyncio.Event()
    got: list[str] = []

    async def slow(event: Event) -> None:
        started.set()
        await asyncio.sleep(10)

    async def fast(event: Event) -> None:
        got.append(event.type)

    async with MemoryPubSub() as backend:
        await backend.subscribe("t", slow, group="g")
        await backend.publish("t", Event(type="only"))
        await started.wait()
        await backend.subscribe("t", fast, group="g")
        await backend.unsubscribe("t", slow)
        await eventually(lambda: got == ["only"])
        await backend.unsubscribe("t", fast)


@pytest.mark.asyncio
async def test_same_callback_twice_on_a_topic_is_rejected() -> None:
    async def callback(event: Event) -> None:
        pass

    async with MemoryPubSub() as backend:
        await backend.subscribe("t", callback)
        with pytest.raises(InvalidArgument, match="already subscribed"):
            await backend.subscribe("t", callback, group="g")
        await backend.unsubscribe("t", callback)


@pytest.mark.asyncio
async def test_publish_without_subscribers_is_dropped_not_queued() -> None:
    got: list[Event] = []

    async def callback(event: Event) -> None:
        got.append(event)

    async with MemoryPubSub() as backend:
        await backend.publish("t", Event(type="before"))
        await backend.subscribe("t", callback)
        await backend.publish("t", Event(type="after"))
        await backend.flush()
        assert [e.type for e in got] == ["after"]
        await backend.unsubscribe("t", callback)


@pytest.mark.asyncio
async def test_unclosed_backend_with_subscriptions_warns_when_collected() -> None:
    async def callback(event: Event) -> None:
        pass

    backend = MemoryPubSub()
    await backend.subscribe("t", callback)
    tasks = [t for g in backend._topics["t"].values() for t in g.workers.values()]
    with pytest.warns(ResourceWarning, match="unclosed"):
        backend.__del__()
    await backend.aclose()
    assert all(t.done() for t in tasks)
    del backend
    gc.collect()


@pytest.mark.asyncio
async def test_renew_leases_renews_only_the_owners_live_leases() -> None:
    clock = ManualClock()
    async with MemoryPubSub(clock=clock) as backend:
        await backend.acquire_lease("a", "me", 100)
        await backend.acquire_lease("b", "other", 100)
        await backend.acquire_lease("c", "me", 10)
        clock.advance_ms(50)
        assert await backend.renew_leases(["a", "b", "c", "missing"], "me", 100) == [
            True,
            False,
            False,
            False,
        ]
        clock.advance_ms(80)
        assert await backend.get_lease_owner("a") == "me"
        assert await backend.get_lease_owner("b") is None


@pytest.mark.asyncio
async def test_wait_lease_released_wakes_one_waiter_per_release() -> None:
    async with MemoryPubSub() as backend:
        await backend.acquire_lease("k", "holder", 60_000)
        waiters = [asyncio.create_task(backend.wait_lease_released("k", 5.0)) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiters)
        await backend.release_lease("k", "holder")
        await asyncio.sleep(0.01)
        assert [w.done() for w in waiters] == [True, False, False]
        assert waiters[0].result() is True
        # The woken waiter takes the lease; the others keep sleeping until it goes.
        await backend.acquire_lease("k", "w0", 60_000)
        await backend.transfer_lease("k", "w0", "w1", 60_000)
        await asyncio.sleep(0.01)
        assert [w.done() for w in waiters] == [True, True, False]
        assert await backend.wait_lease_released("free-key", 5.0) is True
        assert await backend.wait_lease_released("k", 0.01) is False
        waiters[2].cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


def test_a_refused_constructor_leaves_nothing_for_the_finaliser_to_trip_on() -> None:
    unraisable: list[object] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with pytest.raises(InvalidArgument, match="max_attempts"):
            MemoryPubSub(max_attempts=0)
        gc.collect()  # the half-made backend is finalised here
    finally:
        sys.unraisablehook = hook
    assert unraisable == []
