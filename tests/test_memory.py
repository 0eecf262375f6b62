"""Behaviour of the in-memory backend beyond the shared contract suite."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import warnings
from typing import Any

import pytest

from tenure import BackendClosed, ConfigurationError, Event, InvalidArgument, MemoryPubSub
from tenure.testing import ManualClock, eventually

from .support.waiting import until_parked


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


@pytest.mark.asyncio
async def test_the_table_is_swept_exactly_when_it_has_grown_by_its_live_size_plus_1024() -> None:
    clock = ManualClock()
    async with MemoryPubSub(clock=clock) as backend:
        for i in range(600):
            await backend.acquire_lease(f"live-{i}", "owner", 10_000_000)
        for i in range(424):
            await backend.acquire_lease(f"short-{i}", "owner", 1)
        assert len(backend._leases) == 1024
        clock.advance_ms(1)  # the short leases end exactly now: expired
        await backend.acquire_lease("live-600", "owner", 10_000_000)
        # The first sweep, at 1024 leases, dropped the 424 expired ones.
        assert len(backend._leases) == 601
        # The next one comes when the table holds twice the 600 live leases plus 1024,
        # not before, however many of them have expired meanwhile.
        i = 0
        while len(backend._leases) < 2 * 600 + 1024:
            await backend.acquire_lease(f"churn-{i}", "owner", 1)
            clock.advance_ms(1)
            i += 1
        assert i == 2 * 600 + 1024 - 601
        await backend.acquire_lease("live-601", "owner", 10_000_000)
        assert len(backend._leases) == 602
        assert await backend.get_lease_owner("live-0") == "owner"


@pytest.mark.asyncio
async def test_a_lease_is_over_at_its_deadline_for_every_operation() -> None:
    clock = ManualClock()
    async with MemoryPubSub(clock=clock) as backend:
        for key in ("revoked", "released", "renewed", "moved"):
            await backend.acquire_lease(key, "a", 100)
        clock.advance_ms(100)  # exactly the deadline
        assert await backend.get_lease("revoked") is None
        assert await backend.revoke_lease("revoked") is False
        assert await backend.renew_lease("renewed", "a", 100) is False
        assert await backend.transfer_lease("moved", "a", "b", 100) is False
        assert await backend.renew_leases(["renewed", "moved"], "a", 100) == [False, False]
        # A release at the deadline ends nothing: the lease ended by itself, and an
        # expiry wakes no waiter (the waiter below times out instead).
        waiter = asyncio.create_task(backend.wait_lease_released("released", 0.2))
        await backend.release_lease("released", "a")
        assert await waiter is True  # no live lease: "look again" at once
        await backend.acquire_lease("released", "b", 100)
        waiter = asyncio.create_task(backend.wait_lease_released("released", 0.2))
        await until_parked(backend, "released")
        clock.advance_ms(100)
        await backend.release_lease("released", "b")
        assert await waiter is False


@pytest.mark.asyncio
async def test_repr_shows_the_lease_count_or_closed() -> None:
    backend = MemoryPubSub()
    assert repr(backend) == "MemoryPubSub(0 leases)"
    await backend.acquire_lease("k", "o", 60_000)
    assert repr(backend) == "MemoryPubSub(1 leases)"
    await backend.aclose()
    assert repr(backend) == "MemoryPubSub(closed)"


def test_from_url_takes_memory_only_and_passes_options_on() -> None:
    for url in ("memory://", "memory:///", "MEMORY://"):
        assert isinstance(MemoryPubSub.from_url(url), MemoryPubSub)
    for url in ("memory://host", "memory://X", "memory://?x=1", "redis://"):
        with pytest.raises(ConfigurationError) as info:
            MemoryPubSub.from_url(url)
        assert str(info.value) == f"memory:// takes no host, path or query, got {url!r}"
    with pytest.raises(InvalidArgument, match="max_attempts"):
        MemoryPubSub.from_url("memory://", max_attempts=0)


@pytest.mark.asyncio
async def test_reclaimed_events_go_back_before_newer_ones_in_publish_order() -> None:
    release = asyncio.Event()
    taken: list[tuple[str, int]] = []

    async def stuck(event: Event) -> None:
        taken.append((event.type, event.attempt))
        await release.wait()

    got: list[tuple[str, int]] = []

    async def records(event: Event) -> None:
        got.append((event.type, event.attempt))

    async with MemoryPubSub() as backend:
        await backend.subscribe("t", stuck, group="g")
        # 64 callbacks of a member run at once: the last three events wait in the queue.
        for i in range(67):
            await backend.publish("t", Event(type=f"e{i}"))
        await eventually(lambda: len(taken) == 64)
        assert await backend.reclaim("t", "g") == 64
        await backend.unsubscribe("t", stuck)
        release.set()
        await backend.subscribe("t", records, group="g")
        await backend.flush()
        assert got == [(f"e{i}", 2) for i in range(64)] + [(f"e{i}", 1) for i in (64, 65, 66)]
        await backend.unsubscribe("t", records)


@pytest.mark.asyncio
async def test_a_delivery_from_before_the_latest_reclaim_settles_nothing() -> None:
    gates: list[asyncio.Event] = []
    attempts: list[int] = []
    returned: list[int] = []

    async def slow(event: Event) -> None:
        attempts.append(event.attempt)
        gate = asyncio.Event()
        gates.append(gate)
        await gate.wait()
        returned.append(event.attempt)

    async with MemoryPubSub() as backend:
        await backend.subscribe("t", slow, group="g")
        await backend.publish("t", Event(type="x"))
        await eventually(lambda: attempts == [1])
        assert await backend.reclaim("t", "g") == 1
        await eventually(lambda: attempts == [1, 2])  # taken again, attempt 2
        assert await backend.reclaim("t", "g") == 1
        await eventually(lambda: attempts == [1, 2, 3])
        # The second delivery returns: it was reclaimed, so the event stays in flight.
        gates[1].set()
        await eventually(lambda: returned == [2])
        assert await backend.backlog("t", "g") == ["t"]
        gates[2].set()
        await backend.flush()
        assert await backend.backlog("t", "g") == []
        gates[0].set()
        await backend.unsubscribe("t", slow)


@pytest.mark.asyncio
async def test_reclaim_and_unsubscribe_name_their_refused_argument() -> None:
    async def callback(event: Event) -> None:
        pass

    async with MemoryPubSub() as backend:
        with pytest.raises(InvalidArgument) as info:
            await backend.reclaim("", "g")
        assert str(info.value) == "topic must not be empty"
        with pytest.raises(InvalidArgument) as info:
            await backend.reclaim("t", "")
        assert str(info.value) == "group must not be empty"
        with pytest.raises(InvalidArgument) as info:
            await backend.unsubscribe("", callback)
        assert str(info.value) == "topic must not be empty"


@pytest.mark.asyncio
async def test_a_topic_remembers_exactly_its_last_100000_event_ids() -> None:
    got: list[str | None] = []

    async def callback(event: Event) -> None:
        got.append(event.id)

    async with MemoryPubSub() as backend:
        for i in range(100_001):  # no subscriber yet: stored nowhere, ids remembered
            await backend.publish("t", Event(type="x", id=f"id-{i}"))
        await backend.subscribe("t", callback)
        # id-1, the oldest of the last 100,000, is still known: not stored again.
        # id-0 was the oldest of 100,001: forgotten, so its retry is a new event.
        for i in (1, 100_000, 0):
            await backend.publish("t", Event(type="x", id=f"id-{i}"))
        await backend.flush()
        assert got == ["id-0"]
        await backend.unsubscribe("t", callback)


@pytest.mark.asyncio
async def test_raising_callbacks_are_logged_with_the_topic_event_and_attempts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def always_fails(event: Event) -> None:
        raise RuntimeError("boom (expected by the test)")

    async with MemoryPubSub(max_attempts=2) as backend:
        await backend.subscribe("t", always_fails)
        with caplog.at_level(logging.WARNING, logger="tenure.memory"):
            event = await backend.publish("t", Event(type="x"))
            await backend.flush()
        await backend.unsubscribe("t", always_fails)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.WARNING,
            f"callback for topic 't' raised on event {event.id} (attempt 1 of 2); redelivering",
        ),
        (logging.ERROR, f"callback for topic 't' raised on event {event.id} 2 times; dropping it"),
    ]
    assert all(r.exc_info and r.exc_info[0] is RuntimeError for r in caplog.records)


@pytest.mark.asyncio
async def test_max_attempts_of_one_delivers_once_and_refuses_less() -> None:
    seen: list[int] = []

    async def fails(event: Event) -> None:
        seen.append(event.attempt)
        raise RuntimeError("boom (expected by the test)")

    async with MemoryPubSub(max_attempts=1) as backend:
        await backend.subscribe("t", fails)
        await backend.publish("t", Event(type="x"))
        await backend.flush()
        await backend.unsubscribe("t", fails)
    assert seen == [1]
    bad: Any
    for bad in (0, -1, True, 1.0, "5"):
        with pytest.raises(InvalidArgument) as info:
            MemoryPubSub(max_attempts=bad)
        assert str(info.value) == f"max_attempts must be an int >= 1, got {bad!r}"


@pytest.mark.asyncio
async def test_event_ids_are_remembered_per_topic() -> None:
    got: list[str] = []

    async def callback(event: Event) -> None:
        got.append(event.type)

    async with MemoryPubSub() as backend:
        await backend.subscribe("a", callback)
        await backend.subscribe("b", callback, group="g")
        await backend.publish("a", Event(type="on a", id="same"))
        await backend.publish("b", Event(type="on b", id="same"))
        await backend.flush()
        assert sorted(got) == ["on a", "on b"]
        await backend.unsubscribe("a", callback)
        await backend.unsubscribe("b", callback)


@pytest.mark.asyncio
async def test_subscriptions_come_and_go_cleanly() -> None:
    async def callback(event: Event) -> None:
        pass

    backend = MemoryPubSub()
    with pytest.raises(InvalidArgument, match="group"):
        await backend.subscribe("t", callback, group="")
    await backend.unsubscribe("never-subscribed", callback)  # nothing to do
    await backend.subscribe("t", callback)
    await backend.unsubscribe("t", callback)
    # No subscription left: an unclosed backend has nothing to warn about.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.__del__()
    await backend.aclose()


@pytest.mark.asyncio
async def test_every_grant_and_renewal_lasts_its_whole_ttl() -> None:
    clock = ManualClock()
    async with MemoryPubSub(clock=clock) as backend:
        await backend.acquire_lease("old", "a", 1)
        clock.advance_ms(2)
        await backend.acquire_lease("granted", "a", 10_000)  # a new key
        await backend.acquire_lease("old", "b", 10_000)  # over an expired lease
        await backend.acquire_lease("extended", "a", 5)
        await backend.acquire_lease("extended", "a", 10_000)  # same owner: fresh TTL
        for key in ("renewed", "moved", "batch"):
            await backend.acquire_lease(key, "a", 5)
        assert await backend.renew_lease("renewed", "a", 10_000)
        assert await backend.transfer_lease("moved", "a", "b", 10_000)
        assert await backend.renew_leases(["batch"], "a", 10_000) == [True]
        clock.advance_ms(9_999.5)  # half a millisecond left of each
        keys = ("granted", "old", "extended", "renewed", "moved", "batch")
        for key in keys:
            record = await backend.get_lease(key)
            assert record is not None and record.ttl_ms == 1, key
        clock.advance_ms(0.5)
        assert [await backend.get_lease(key) for key in keys] == [None] * 6


@pytest.mark.asyncio
async def test_a_failing_callback_gets_five_attempts_by_default() -> None:
    seen: list[int] = []

    async def fails(event: Event) -> None:
        seen.append(event.attempt)
        raise RuntimeError("boom (expected by the test)")

    async with MemoryPubSub() as backend:
        await backend.subscribe("t", fails)
        await backend.publish("t", Event(type="x"))
        await backend.flush()
        await backend.unsubscribe("t", fails)
    assert seen == [1, 2, 3, 4, 5]
