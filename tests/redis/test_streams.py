"""Event delivery on Redis Streams across several clients and processes."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

import tenure
from tenure import Event
from tenure.backends.redis import RedisStreamsPubSub
from tenure.testing import eventually

from .helpers import delete_prefix

ROOT = Path(__file__).resolve().parents[2]
Factory = Callable[..., RedisStreamsPubSub]


@pytest_asyncio.fixture
async def clients(redis_url: str, unique: str) -> AsyncIterator[tuple[Factory, str]]:
    """Backends on the shared Redis under the test's own prefix; all closed and cleaned after."""
    prefix = f"tenure-test-{unique}:"
    made: list[RedisStreamsPubSub] = []

    def make(**options: object) -> RedisStreamsPubSub:
        backend = RedisStreamsPubSub.from_url(redis_url, prefix=prefix, quarantine=False, **options)
        made.append(backend)
        return backend

    try:
        yield make, prefix
    finally:
        for backend in made:
            await backend.aclose()
        await delete_prefix(redis_url, prefix)


def collector(into: list[Event]) -> Callable[[Event], Awaitable[None]]:
    async def callback(event: Event) -> None:
        into.append(event)

    return callback


async def groups_of(redis_url: str, stream: bytes) -> list[bytes]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return [g["name"] for g in await client.xinfo_groups(stream)]
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_fan_out_across_clients_and_private_groups_are_removed(
    clients: tuple[Factory, str], redis_url: str
) -> None:
    make, prefix = clients
    a, b, publisher = make(), make(), make()
    got_a: list[Event] = []
    got_b: list[Event] = []
    cb_a, cb_b = collector(got_a), collector(got_b)
    await a.subscribe("news", cb_a)
    await b.subscribe("news", cb_b)
    sent = [await publisher.publish("news", Event(type="t", data=i)) for i in range(20)]
    await eventually(lambda: len(got_a) == 20 and len(got_b) == 20)
    assert [e.id for e in got_a] == [e.id for e in sent]
    assert [e.id for e in got_b] == [e.id for e in sent]
    stream = f"{prefix}{{news}}:stream".encode()
    assert len(await groups_of(redis_url, stream)) == 2
    await a.unsubscribe("news", cb_a)
    await b.unsubscribe("news", cb_b)
    assert await groups_of(redis_url, stream) == []


@pytest.mark.asyncio
async def test_group_members_in_different_clients_share_the_work(
    clients: tuple[Factory, str],
) -> None:
    make, _ = clients
    a, b, publisher = make(), make(), make()
    got_a: list[Event] = []
    got_b: list[Event] = []

    def slow(into: list[Event]) -> Callable[[Event], Awaitable[None]]:
        async def callback(event: Event) -> None:
            into.append(event)
            await asyncio.sleep(0.01)

        return callback

    await a.subscribe("jobs", slow(got_a), group="workers")
    await b.subscribe("jobs", slow(got_b), group="workers")
    for i in range(60):
        await publisher.publish("jobs", Event(type="t", data=i))
    await eventually(lambda: len(got_a) + len(got_b) >= 60)
    await asyncio.sleep(0.3)
    assert sorted(e.data for e in got_a + got_b) == list(range(60))  # each exactly once


@pytest.mark.asyncio
async def test_raising_callback_is_retried_then_dropped_with_an_error(
    clients: tuple[Factory, str], redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    make, prefix = clients
    backend = make(max_attempts=3)
    attempts: list[tuple[object, int]] = []

    async def failing(event: Event) -> None:
        attempts.append((event.data, event.attempt))
        if event.data == "poison" or event.attempt < 2:
            raise RuntimeError("failure expected by the test")

    await backend.subscribe("t", failing, group="g")
    with caplog.at_level(logging.WARNING, logger="tenure.redis"):
        await backend.publish("t", Event(type="t", data="poison"))
        await backend.publish("t", Event(type="t", data="flaky"))
        await backend.flush()
    assert attempts == [("poison", 1), ("poison", 2), ("poison", 3), ("flaky", 1), ("flaky", 2)]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "dropping" in errors[0].getMessage()
    client = aioredis.Redis.from_url(redis_url)
    try:
        pending = await client.xpending(f"{prefix}{{t}}:stream".encode(), "g:g")
    finally:
        await client.aclose()
    assert pending["pending"] == 0  # both acknowledged: nothing redelivered later


@pytest.mark.asyncio
async def test_events_of_a_killed_subscriber_are_reclaimed_by_a_live_member(
    clients: tuple[Factory, str], redis_url: str, tmp_path: Path
) -> None:
    make, prefix = clients
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.redis._subscriber",
        redis_url,
        prefix,
        "work",
        "g",
        str(tmp_path),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert proc.returncode is None, "the subscriber process died"
            assert time.monotonic() < deadline, "the subscriber process never subscribed"
            await asyncio.sleep(0.05)
        publisher = make()
        sent = [await publisher.publish("work", Event(type="t", data=i)) for i in range(10)]
        while not (tmp_path / "got").exists():
            assert time.monotonic() < deadline, "the subscriber process never got an event"
            await asyncio.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    client = aioredis.Redis.from_url(redis_url)
    try:
        stuck = (await client.xpending(f"{prefix}{{work}}:stream".encode(), "g:g"))["pending"]
    finally:
        await client.aclose()
    assert stuck >= 1  # read by the dead process, never acknowledged
    got: list[Event] = []
    survivor = make(claim_idle_ms=300)
    await survivor.subscribe("work", collector(got), group="g")
    await eventually(lambda: len(got) >= 10, timeout=20)
    await asyncio.sleep(0.5)
    assert sorted(e.data for e in got) == list(range(10))  # nothing lost, nothing twice
    assert {e.id for e in got} == {e.id for e in sent}
    # Those the dead process had taken come with their second attempt.
    assert sum(e.attempt == 2 for e in got) == stuck
    assert all(e.attempt in (1, 2) for e in got)


@pytest.mark.asyncio
async def test_a_member_stuck_in_a_callback_has_acknowledged_what_it_finished_before(
    clients: tuple[Factory, str], redis_url: str, tmp_path: Path
) -> None:
    """A member acknowledges a read's entries together, or once they waited
    ``_ACK_AFTER`` while its callback is busy with a later one (an agent's slow
    step): killed in that callback, it leaves only the entries not finished to
    a live member (a second attempt), not the whole read. (Before, the three it
    had finished came back too.)"""
    make, prefix = clients
    creator = make()
    first = collector([])
    await creator.subscribe("work", first, group="g")  # the group, at the stream's end
    await creator.unsubscribe("work", first)
    publisher = make()
    sent = [await publisher.publish("work", Event(type="t", data=i)) for i in range(5)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.redis._subscriber",
        redis_url,
        prefix,
        "work",
        "g",
        str(tmp_path),
        "3",  # finishes 0, 1 and 2, hangs in 3: all five came in its first read
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
    )
    stream = f"{prefix}{{work}}:stream".encode()
    client = aioredis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "got").exists():
            assert proc.returncode is None, "the subscriber process died"
            assert time.monotonic() < deadline, "the subscriber process never got to event 3"
            await asyncio.sleep(0.02)
        # While it hangs in 3, what it finished is acknowledged: 3 and 4 stay pending.
        while (pending := (await client.xpending(stream, "g:g"))["pending"]) != 2:
            assert time.monotonic() < deadline, f"{pending} entries still pending"
            await asyncio.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await client.aclose()
    assert (tmp_path / "got").read_text() == "3"
    got: list[Event] = []
    survivor = make(claim_idle_ms=300)
    await survivor.subscribe("work", collector(got), group="g")
    await eventually(lambda: len(got) >= 2, timeout=20)
    await asyncio.sleep(0.5)
    assert sorted((e.data, e.attempt) for e in got) == [(3, 2), (4, 2)]
    assert {e.id for e in got} == {e.id for e in sent[3:]}


@pytest.mark.asyncio
async def test_flush_waits_for_local_handling(clients: tuple[Factory, str]) -> None:
    make, _ = clients
    backend = make()
    done: list[int] = []

    async def slow(event: Event) -> None:
        await asyncio.sleep(0.02)
        done.append(event.data)

    await backend.subscribe("t", slow)
    for i in range(10):
        await backend.publish("t", Event(type="t", data=i))
    await backend.flush()
    assert done == list(range(10))


async def consumers_of(redis_url: str, stream: bytes, group: str) -> list[bytes]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return [c["name"] for c in await client.xinfo_consumers(stream, group)]
    finally:
        await client.aclose()


def holder(into: list[Event]) -> Callable[[Event], Awaitable[None]]:
    """A member that takes an event and never finishes it (until unsubscribed)."""

    async def callback(event: Event) -> None:
        into.append(event)
        await asyncio.Event().wait()

    return callback


@pytest.mark.asyncio
async def test_a_leaving_member_hands_its_unfinished_events_to_a_live_member_at_once(
    clients: tuple[Factory, str], redis_url: str
) -> None:
    make, prefix = clients
    # claim_idle_ms far beyond the test's waits: only the hand-back can move the events.
    leaving, staying, publisher = make(), make(claim_idle_ms=600_000), make()
    held: list[Event] = []
    got: list[Event] = []
    cb = holder(held)
    await leaving.subscribe("jobs", cb, group="g")
    sent = [await publisher.publish("jobs", Event(type="t", data=i)) for i in range(5)]
    await eventually(lambda: len(held) == 1)
    await staying.subscribe("jobs", collector(got), group="g")
    await asyncio.sleep(0.5)
    assert held[0].id not in {e.id for e in got}  # still with the leaving member
    await leaving.unsubscribe("jobs", cb)
    await eventually(lambda: len(got) >= 5, timeout=15)
    await asyncio.sleep(0.3)
    assert sorted(e.data for e in got) == [0, 1, 2, 3, 4]  # nothing lost, nothing twice
    assert {e.id for e in got} == {e.id for e in sent}
    # The delivery that was never finished does not count as an attempt.
    assert all(e.attempt == 1 for e in got)
    stream = f"{prefix}{{jobs}}:stream".encode()
    names = await consumers_of(redis_url, stream, "g:g")
    assert len(names) == 2  # the member that stays, and the placeholder of handed-back events
    assert b"tenure.returned" in names


@pytest.mark.asyncio
async def test_a_member_that_joins_after_one_left_starts_with_its_unfinished_events(
    clients: tuple[Factory, str],
) -> None:
    make, _ = clients
    leaving, publisher = make(), make()
    held: list[Event] = []
    cb = holder(held)
    await leaving.subscribe("jobs", cb, group="g")
    sent = await publisher.publish("jobs", Event(type="t", data="unfinished"))
    await eventually(lambda: len(held) == 1)
    await leaving.unsubscribe("jobs", cb)
    got: list[Event] = []
    joining = make(claim_idle_ms=600_000)
    await joining.subscribe("jobs", collector(got), group="g")
    await eventually(lambda: len(got) == 1, timeout=10)
    assert (got[0].id, got[0].attempt) == (sent.id, 1)


@pytest.mark.asyncio
async def test_a_leaving_member_acknowledges_what_it_finished_in_the_read_it_was_in(
    clients: tuple[Factory, str],
) -> None:
    """Acknowledgements of one read's entries are written together, after the read:
    a member that leaves in the middle of a read still acknowledges the entries
    whose callback returned, and hands back only the one it was in."""
    make, _ = clients
    leaving, publisher = make(), make()
    first = collector([])
    await leaving.subscribe("jobs", first, group="g")  # the group, at the stream's end
    await leaving.unsubscribe("jobs", first)
    sent = [await publisher.publish("jobs", Event(type="t", data=i)) for i in range(5)]
    seen: list[int] = []
    inside = asyncio.Event()

    async def stops_at_the_last(event: Event) -> None:
        seen.append(event.data)
        if event.data == 4:
            inside.set()
            await asyncio.Event().wait()  # never finishes

    await leaving.subscribe("jobs", stops_at_the_last, group="g")  # one read gets all five
    await asyncio.wait_for(inside.wait(), 10)
    await leaving.unsubscribe("jobs", stops_at_the_last)
    got: list[Event] = []
    joining = make(claim_idle_ms=600_000)
    await joining.subscribe("jobs", collector(got), group="g")
    await eventually(lambda: len(got) == 1, timeout=10)
    await asyncio.sleep(0.3)
    assert seen == [0, 1, 2, 3, 4]
    assert [(e.id, e.attempt) for e in got] == [(sent[4].id, 1)]


@pytest.mark.asyncio
async def test_closing_the_backend_also_hands_unfinished_events_back(
    clients: tuple[Factory, str],
) -> None:
    make, _ = clients
    leaving, publisher = make(), make()
    held: list[Event] = []
    await leaving.subscribe("jobs", holder(held), group="g")
    sent = await publisher.publish("jobs", Event(type="t", data="unfinished"))
    await eventually(lambda: len(held) == 1)
    await leaving.aclose()
    got: list[Event] = []
    joining = make(claim_idle_ms=600_000)
    await joining.subscribe("jobs", collector(got), group="g")
    await eventually(lambda: len(got) == 1, timeout=10)
    assert got[0].id == sent.id


@pytest.mark.asyncio
async def test_a_cancelled_command_is_never_reported_as_completed(
    clients: tuple[Factory, str], unique: str
) -> None:
    """redis-py sends commands inside ``asyncio.wait_for``, which on Python 3.11 drops
    a cancellation arriving in the loop turn after the send. The backend must raise it
    anyway: a subscription reader that missed it went on reading (and taking events)
    for ever, and ``unsubscribe`` never returned. The command blocks for 2 s unless
    cancelled, and the cancel is tried at every loop turn of the send's window."""
    make, _ = clients
    backend = make()
    client = backend._client
    await backend._io(client.ping)  # warm: connect outside the swept turns
    key = f"tenure-test-{unique}:none"
    for turns in range(12):
        call = asyncio.ensure_future(
            backend._io(client.execute_command, "BLPOP", key, 2, blocking=True)
        )
        for _ in range(turns):
            await asyncio.sleep(0)
        call.cancel()
        outcome = (await asyncio.gather(call, return_exceptions=True))[0]
        assert isinstance(outcome, asyncio.CancelledError), (turns, outcome)


@pytest.mark.asyncio
async def test_unsubscribe_returns_whenever_it_interrupts_the_reader(
    clients: tuple[Factory, str],
) -> None:
    """Unsubscribe at every loop turn after an event reached the callback, so it
    catches the reader in each step (acknowledging, reading again)."""
    make, _ = clients
    backend, publisher = make(), make()
    for turns in range(15):
        got = asyncio.Event()

        async def callback(event: Event, got: asyncio.Event = got) -> None:
            got.set()

        await backend.subscribe("t", callback, group="g")
        await publisher.publish("t", Event(type="t", data=turns))
        await asyncio.wait_for(got.wait(), 10)
        for _ in range(turns):
            await asyncio.sleep(0)
        await asyncio.wait_for(backend.unsubscribe("t", callback), 10)


# -- DEDUPE, RECLAIM, BACKLOG ------------------------------------------------------


async def start_subscriber(
    redis_url: str, prefix: str, topic: str, where: Path
) -> asyncio.subprocess.Process:
    """``tests/redis/_subscriber.py`` in group ``g``, once it has subscribed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.redis._subscriber",
        redis_url,
        prefix,
        topic,
        "g",
        str(where),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not (where / "ready").exists():
        assert proc.returncode is None, "the subscriber process died"
        assert time.monotonic() < deadline, "the subscriber process never subscribed"
        await asyncio.sleep(0.05)
    return proc


@pytest.mark.asyncio
async def test_a_killed_members_events_come_back_at_once_with_reclaim_and_stay_in_the_backlog(
    clients: tuple[Factory, str], redis_url: str, tmp_path: Path
) -> None:
    """FAULT: a member process is SIGKILLed while handling; a new member reclaims."""
    make, prefix = clients
    proc = await start_subscriber(redis_url, prefix, "work/1", tmp_path)
    # Default claim_idle_ms (30 s): only reclaim can bring the events back in time.
    member = make()
    try:
        sent = [await member.publish("work/1", Event(type="t", data=i)) for i in range(3)]
        deadline = time.monotonic() + 30
        while not (tmp_path / "got").exists():
            assert time.monotonic() < deadline, "the subscriber process never got an event"
            await asyncio.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    client = aioredis.Redis.from_url(redis_url)
    try:
        stuck = (await client.xpending(f"{prefix}{{work/1}}:stream".encode(), "g:g"))["pending"]
    finally:
        await client.aclose()
    assert stuck >= 1  # taken by the dead process, never acknowledged
    assert await member.backlog("work/", "g") == ["work/1"]
    started = time.monotonic()
    assert await member.reclaim("work/1", "g") == stuck
    assert await member.backlog("work/", "g") == ["work/1"]  # back, not yet handled
    later = await member.publish("work/1", Event(type="t", data=3))
    got: list[Event] = []
    await member.subscribe("work/1", collector(got), group="g")
    await eventually(lambda: len(got) >= 4, timeout=10)
    assert time.monotonic() - started < 5  # not after the 30 s redelivery timeout
    await asyncio.sleep(0.3)
    assert [e.id for e in got] == [e.id for e in [*sent, later]]
    assert [e.attempt for e in got] == [2] * stuck + [1] * (4 - stuck)
    for _ in range(100):
        if await member.backlog("work/", "g") == []:
            break
        await asyncio.sleep(0.05)
    assert await member.backlog("work/", "g") == []


@pytest.mark.asyncio
async def test_a_member_blocked_reading_delivers_reclaimed_events_before_newer_ones(
    clients: tuple[Factory, str],
) -> None:
    make, _ = clients
    stuck, waiting = make(), make(claim_idle_ms=600_000)
    held: list[Event] = []
    got: list[Event] = []
    await stuck.subscribe("t", holder(held), group="g")
    first = await stuck.publish("t", Event(type="t", data=0))
    await eventually(lambda: len(held) == 1)
    await waiting.subscribe("t", collector(got), group="g")
    await asyncio.sleep(0.2)  # its first look is over: it blocks on new entries
    assert await waiting.reclaim("t", "g") == 1
    later = await stuck.publish("t", Event(type="t", data=1))
    await eventually(lambda: len(got) == 2, timeout=10)
    assert [(e.id, e.attempt) for e in got] == [(first.id, 2), (later.id, 1)]


@pytest.mark.asyncio
async def test_reclaim_of_a_missing_topic_or_group_is_zero(clients: tuple[Factory, str]) -> None:
    make, _ = clients
    backend = make()
    assert await backend.reclaim("nothing", "g") == 0
    await backend.publish("t", Event(type="t"))  # the stream exists, the group does not
    assert await backend.reclaim("t", "g") == 0


@pytest.mark.asyncio
async def test_a_late_raise_after_a_reclaim_retries_nothing_and_the_group_delivers_it(
    clients: tuple[Factory, str], caplog: pytest.LogCaptureFixture
) -> None:
    make, _ = clients
    old, new = make(), make(claim_idle_ms=600_000)
    seen: list[Event] = []
    release = asyncio.Event()

    async def failing(event: Event) -> None:
        seen.append(event)
        await release.wait()
        raise RuntimeError("failure expected by the test")

    await old.subscribe("t", failing, group="g")
    first = await old.publish("t", Event(type="t", data=0))
    await eventually(lambda: len(seen) == 1)
    assert await new.reclaim("t", "g") == 1
    with caplog.at_level(logging.INFO, logger="tenure.redis"):
        release.set()
        await eventually(lambda: any("given back" in r.getMessage() for r in caplog.records))
    await asyncio.sleep(0.3)
    assert len(seen) == 1  # the old member did not retry it
    got: list[Event] = []
    await new.subscribe("t", collector(got), group="g")
    await eventually(lambda: len(got) == 1, timeout=10)
    assert (got[0].id, got[0].attempt) == (first.id, 2)


@pytest.mark.asyncio
async def test_concurrent_publishes_of_one_id_store_one_event(
    clients: tuple[Factory, str], redis_url: str
) -> None:
    make, prefix = clients
    a, b = make(), make()
    results = await asyncio.gather(
        *(
            backend.publish("t", Event(type="t", data=i, id="once"))
            for i in range(10)
            for backend in (a, b)
        )
    )
    assert len({(e.id, e.created_at, e.data) for e in results}) == 1
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await client.xlen(f"{prefix}{{t}}:stream".encode()) == 1
        # Events without an id set no guard.
        await a.publish("t", Event(type="t"))
        guards = [k async for k in client.scan_iter(match=f"{prefix}{{t}}:id:*".encode())]
        assert guards == [f"{prefix}{{t}}:id:once".encode()]
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_an_id_is_stored_again_after_the_dedupe_window(clients: tuple[Factory, str]) -> None:
    make, _ = clients
    backend = make(dedupe_window_ms=200)
    got: list[Event] = []
    await backend.subscribe("t", collector(got), group="g")
    first = await backend.publish("t", Event(type="t", data=1, id="x"))
    assert (await backend.publish("t", Event(type="t", data=2, id="x"))).data == 1
    await asyncio.sleep(0.4)
    again = await backend.publish("t", Event(type="t", data=3, id="x"))
    assert again.data == 3 and again.created_at != first.created_at
    await eventually(lambda: len(got) == 2)
    assert [e.data for e in got] == [1, 3]


@pytest.mark.asyncio
async def test_backlog_drops_drained_topics_from_its_index_and_ignores_fan_out(
    clients: tuple[Factory, str], redis_url: str
) -> None:
    make, prefix = clients
    backend = make()
    got: list[Event] = []
    fan: list[Event] = []
    await backend.subscribe("a/1", collector(got), group="g")
    await backend.subscribe("a/2", collector(fan))  # fan-out only: no named group
    await backend.publish("a/1", Event(type="t"))
    await backend.publish("a/2", Event(type="t"))
    await backend.flush()
    index = f"{prefix}backlog:g:g".encode()
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await client.smembers(index) == {b"a/1"}
        assert await backend.backlog("a/", "g") == []
        assert await client.smembers(index) == set()  # drained: no longer looked at
        assert await backend.backlog("b/", "g") == []
    finally:
        await client.aclose()


def test_the_dedupe_window_is_an_url_option() -> None:
    backend = RedisStreamsPubSub.from_url("redis://localhost/0?dedupe_window_ms=5000")
    assert backend._dedupe_window_ms == 5000
    with pytest.raises(tenure.ConfigurationError):
        RedisStreamsPubSub.from_url("redis://localhost/0?dedupe_window_ms=0")


@pytest.mark.asyncio
async def test_a_consumer_group_destroyed_under_a_reading_member_is_recreated(
    clients: tuple[Factory, str], redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``XGROUP DESTROY`` (an operator, or a restart without persistence) under a
    member blocked in ``XREADGROUP``: the member recreates the group, says so in
    the log, and receives what is published after that."""
    make, prefix = clients
    backend = make()
    got: list[Event] = []
    stream = f"{prefix}{{t}}:stream".encode()
    await backend.subscribe("t", collector(got), group="g")
    await backend.publish("t", Event(type="t", data="before"))
    await eventually(lambda: [e.data for e in got] == ["before"])
    raw = aioredis.Redis.from_url(redis_url)
    try:
        with caplog.at_level(logging.WARNING, logger="tenure.redis"):
            assert await raw.xgroup_destroy(stream, "g:g") == 1

            for _ in range(1000):  # the reader recreates it on its next read
                if b"g:g" in await groups_of(redis_url, stream):
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the consumer group was not recreated within 10 s")
            await backend.publish("t", Event(type="t", data="after"))
            await eventually(lambda: [e.data for e in got] == ["before", "after"])
    finally:
        await raw.aclose()
    assert any("disappeared; recreating" in r.getMessage() for r in caplog.records)


@pytest.mark.asyncio
async def test_a_client_remembers_a_bounded_number_of_topics_it_published_to(
    clients: tuple[Factory, str],
) -> None:
    # flush needs the newest entry published per topic; a topic per conversation
    # must not make that memory grow for as long as the process lives.
    make, _ = clients
    backend = make()
    got: list[Event] = []
    release = asyncio.Event()

    async def slow(event: Event) -> None:
        await release.wait()
        got.append(event)

    await backend.subscribe("kept", slow, group="g")
    await backend.publish("kept", Event(type="t", data="first"))
    for i in range(3000):
        await backend.publish(f"once-{i}", Event(type="t"))
    remembered = backend._published
    assert len(remembered) <= 1024 + 1
    assert "kept" in remembered and "once-2999" in remembered and "once-0" not in remembered
    # The subscribed topic published to 3,000 topics ago is still flushed.
    flushing = asyncio.ensure_future(backend.flush())
    await asyncio.sleep(0.2)
    assert not flushing.done()
    release.set()
    await asyncio.wait_for(flushing, 10)
    assert [e.data for e in got] == ["first"]
    await backend.unsubscribe("kept", slow)
