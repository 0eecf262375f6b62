"""Fenced takes (``Capability.FENCED_TAKES``, PostgreSQL, SQLite and Redis): a
subscriber takes events only while its lease is held, judged in the
transaction that takes them.

The thread runtime relies on it: a session whose lease expired while its
reads were still going (a pause, a cut connection, a process slow to learn of
the loss) must not take the signals that the thread's next owner reclaimed or
is about to read; taking them would run them after newer ones.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Protocol, cast

import pytest
import pytest_asyncio

import redis
from tenure import (
    Capability,
    Event,
    EventBackend,
    InvalidArgument,
    LeaseFence,
    capabilities_of,
    events_of,
    from_url,
)
from tenure._pubsub import Callback
from tenure.backends.memory import MemoryPubSub
from tenure.backends.sqlite import SqlitePubSub
from tenure.testing import eventually
from tests.postgres.helpers import drop_schema, new_schema
from tests.support.servers import REDIS_URL, require_tcp

TOPIC = "thread-7"
GROUP = "owner"


class Fenced(EventBackend, Protocol):
    """What Capability.FENCED_TAKES (and RECLAIM) add to the typed event backend."""

    async def subscribe(
        self,
        topic: str,
        callback: Callback,
        *,
        group: str | None = None,
        fence: LeaseFence | None = None,
    ) -> None: ...

    async def reclaim(self, topic: str, group: str) -> int: ...


@pytest.fixture(params=["postgres", "sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Two instances of one store each test: the stale subscriber and the next holder."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fence.db'}"
        return
    if request.param == "redis":
        prefix = f"tenure-test-{uuid.uuid4().hex}:"
        redis_url = require_tcp(REDIS_URL, "Redis")
        # Short blocking reads (block_ms = socket_timeout / 2): a member looks
        # for given-back entries every 0.2 s.
        yield f"{redis_url}?prefix={prefix}&quarantine=off&socket_timeout=0.4"
        client = redis.Redis.from_url(redis_url)
        try:
            keys = list(client.scan_iter(match=prefix.encode() + b"*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()
        return
    postgres_url: str = request.getfixturevalue("postgres_url")
    schema = new_schema()
    yield f"{postgres_url}?schema={schema}"
    drop_schema(postgres_url, schema)


@pytest_asyncio.fixture
async def stale(url: str) -> AsyncIterator[Fenced]:
    async with events_of(from_url(url)) as backend:
        yield cast(Fenced, backend)


@pytest_asyncio.fixture
async def fresh(url: str) -> AsyncIterator[Fenced]:
    async with events_of(from_url(url)) as backend:
        yield cast(Fenced, backend)


def test_the_sql_backends_and_redis_declare_fenced_takes() -> None:
    from tenure.backends.postgres import PostgresPubSub
    from tenure.backends.redis import RedisClusterPubSub, RedisStreamsPubSub

    assert Capability.FENCED_TAKES in capabilities_of(PostgresPubSub)
    assert Capability.FENCED_TAKES in capabilities_of(SqlitePubSub)
    assert Capability.FENCED_TAKES in capabilities_of(RedisStreamsPubSub)
    # A lease and a stream live in different slots of a cluster: no script sees both.
    assert Capability.FENCED_TAKES not in capabilities_of(RedisClusterPubSub)


@pytest.mark.asyncio
async def test_a_subscriber_whose_lease_is_gone_takes_nothing(stale: Fenced, fresh: Fenced) -> None:
    """The stale subscriber is the only one subscribed and is woken by every
    publish: without the fence it would take every event at once (and the next
    holder would get them as second attempts, after the stale one gave them back)."""
    got_stale: list[object] = []
    got_fresh: list[tuple[object, int]] = []

    async def on_stale(event: Event) -> None:
        got_stale.append(event.data)

    async def on_fresh(event: Event) -> None:
        got_fresh.append((event.data, event.attempt))

    assert (await stale.acquire_lease(TOPIC, "p1/s1.1", 60_000)).acquired
    await stale.subscribe(TOPIC, on_stale, group=GROUP, fence=LeaseFence(TOPIC, "p1/s1."))
    await fresh.publish(TOPIC, Event(type="n", data=1))
    await eventually(lambda: got_stale == [1], timeout=10)

    # The lease moves between owners of the same prefix: still taking.
    assert await stale.transfer_lease(TOPIC, "p1/s1.1", "p1/s1.2", 60_000)
    await fresh.publish(TOPIC, Event(type="n", data=2))
    await eventually(lambda: got_stale == [1, 2], timeout=10)

    # Gone (revoked by an operator here; expiry is the same to the statement).
    assert await fresh.revoke_lease(TOPIC)
    await fresh.publish(TOPIC, Event(type="n", data=3))
    await fresh.publish(TOPIC, Event(type="n", data=4))
    for _ in range(3):  # several takes, woken each time; none takes anything
        await stale.flush()
        await asyncio.sleep(0.2)
    assert got_stale == [1, 2]

    # The next holder, fenced on its own lease, reads them in order, first attempts.
    assert (await fresh.acquire_lease(TOPIC, "p2/s9.1", 60_000)).acquired
    await fresh.subscribe(TOPIC, on_fresh, group=GROUP, fence=LeaseFence(TOPIC, "p2/s9."))
    await eventually(lambda: len(got_fresh) == 2, timeout=10)
    assert got_fresh == [(3, 1), (4, 1)]
    assert got_stale == [1, 2]
    await stale.unsubscribe(TOPIC, on_stale)
    await fresh.unsubscribe(TOPIC, on_fresh)


@pytest.mark.asyncio
async def test_a_subscriber_whose_lease_is_gone_takes_nothing_given_back(
    url: str, stale: Fenced, fresh: Fenced
) -> None:
    """What a reclaim gives back to the group (on Redis: claimable at once by
    any member's next look) is not taken by a member whose lease is gone."""
    got_stale: list[object] = []
    got_fresh: list[tuple[object, int]] = []
    stuck = asyncio.Event()
    release = asyncio.Event()

    async def dead(event: Event) -> None:
        stuck.set()
        await release.wait()  # stands for a member that died holding event 1

    async def on_stale(event: Event) -> None:
        got_stale.append(event.data)

    async def on_fresh(event: Event) -> None:
        got_fresh.append((event.data, event.attempt))

    async with events_of(from_url(url)) as other:
        holder = cast(Fenced, other)
        assert (await holder.acquire_lease("k0", "p0/s0.1", 60_000)).acquired
        await holder.subscribe(TOPIC, dead, group=GROUP, fence=LeaseFence("k0", "p0/"))
        await fresh.publish(TOPIC, Event(type="n", data=1))
        await eventually(stuck.is_set, timeout=10)
        assert (await stale.acquire_lease(TOPIC, "p1/s1.1", 60_000)).acquired
        await stale.subscribe(TOPIC, on_stale, group=GROUP, fence=LeaseFence(TOPIC, "p1/s1."))
        assert await fresh.revoke_lease("k0")
        assert await fresh.revoke_lease(TOPIC)
        assert await fresh.reclaim(TOPIC, GROUP) == 1
        await asyncio.sleep(1.0)  # the stale member looks several times meanwhile
        assert got_stale == []
        assert (await fresh.acquire_lease(TOPIC, "p2/s9.1", 60_000)).acquired
        await fresh.subscribe(TOPIC, on_fresh, group=GROUP, fence=LeaseFence(TOPIC, "p2/s9."))
        await eventually(lambda: len(got_fresh) == 1, timeout=10)
        assert got_fresh[0][0] == 1 and got_stale == []
        release.set()
        await holder.unsubscribe(TOPIC, dead)
    await stale.unsubscribe(TOPIC, on_stale)
    await fresh.unsubscribe(TOPIC, on_fresh)


@pytest.mark.asyncio
async def test_an_unsubscribing_member_stays_fenced_until_its_delivery_stopped(
    stale: Fenced, fresh: Fenced
) -> None:
    """Unsubscribing stops the member's delivery task first; a callback may take
    a while to give up its event (here it waits to be let go). Meanwhile the
    view still fetches: it must stay fenced, or it takes, unfenced, what the
    lease's next holder should read (and keeps it until the unsubscribe ends)."""
    got_fresh: list[tuple[object, int]] = []
    holding = asyncio.Event()
    cancelled = asyncio.Event()
    let_go = asyncio.Event()

    async def slow_to_leave(event: Event) -> None:
        holding.set()
        try:
            await asyncio.Event().wait()  # holds event 1 until unsubscribed
        except asyncio.CancelledError:
            cancelled.set()
            await let_go.wait()
            raise

    async def on_fresh(event: Event) -> None:
        got_fresh.append((event.data, event.attempt))

    assert (await stale.acquire_lease(TOPIC, "p1/s1.1", 60_000)).acquired
    await stale.subscribe(TOPIC, slow_to_leave, group=GROUP, fence=LeaseFence(TOPIC, "p1/s1."))
    await fresh.publish(TOPIC, Event(type="n", data=1))
    await eventually(holding.is_set, timeout=10)
    assert await fresh.revoke_lease(TOPIC)
    leaving = asyncio.ensure_future(stale.unsubscribe(TOPIC, slow_to_leave))
    try:
        await eventually(cancelled.is_set, timeout=10)
        # The window: a publish wakes the leaving member's fetch loop.
        await fresh.publish(TOPIC, Event(type="n", data=2))
        await asyncio.sleep(0.3)
        assert (await fresh.acquire_lease(TOPIC, "p2/s9.1", 60_000)).acquired
        await fresh.subscribe(TOPIC, on_fresh, group=GROUP, fence=LeaseFence(TOPIC, "p2/s9."))
        await eventually(lambda: (2, 1) in got_fresh, timeout=5)
    finally:
        let_go.set()
        await leaving
    await eventually(lambda: len(got_fresh) == 2, timeout=10)  # event 1, handed back
    await fresh.unsubscribe(TOPIC, on_fresh)


@pytest.mark.asyncio
async def test_an_expired_lease_fences_like_a_lost_one(stale: Fenced) -> None:
    got: list[tuple[object, int]] = []

    async def on_event(event: Event) -> None:
        got.append((event.data, event.attempt))

    assert (await stale.acquire_lease(TOPIC, "p1/s1.1", 200)).acquired
    await stale.subscribe(TOPIC, on_event, group=GROUP, fence=LeaseFence(TOPIC, "p1/s1."))
    await asyncio.sleep(0.3)  # past the TTL, never renewed
    await stale.publish(TOPIC, Event(type="n", data=1))
    await stale.flush()
    await asyncio.sleep(0.3)
    assert got == []
    # Acquired again under the same prefix: the subscriber reads on, a first attempt.
    assert (await stale.acquire_lease(TOPIC, "p1/s1.2", 60_000)).acquired
    await eventually(lambda: got == [(1, 1)], timeout=10)
    await stale.unsubscribe(TOPIC, on_event)


@pytest.mark.asyncio
async def test_an_unfenced_member_of_the_same_view_lifts_the_fence(
    stale: Fenced, fresh: Fenced
) -> None:
    """The fence belongs to the subscription: a second, unfenced callback of the
    same group in the same process reads as any member does."""
    got: list[object] = []

    async def fenced(event: Event) -> None:
        got.append(("fenced", event.data))

    async def plain(event: Event) -> None:
        got.append(("plain", event.data))

    await stale.subscribe(TOPIC, fenced, group=GROUP, fence=LeaseFence(TOPIC, "nobody/"))
    await stale.subscribe(TOPIC, plain, group=GROUP)
    await fresh.publish(TOPIC, Event(type="n", data=1))
    await eventually(lambda: len(got) == 1, timeout=10)
    await stale.unsubscribe(TOPIC, plain)
    await stale.unsubscribe(TOPIC, fenced)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("fence", "match"),
    [
        ("thread-7", "fence must be a tenure.LeaseFence"),
        (("thread-7", "p1/"), "fence must be a tenure.LeaseFence"),
    ],
)
async def test_a_fence_that_is_not_a_lease_fence_is_refused(
    stale: Fenced, fence: object, match: str
) -> None:
    async def on_event(event: Event) -> None:
        pass

    with pytest.raises(InvalidArgument, match=match):
        await stale.subscribe(TOPIC, on_event, group=GROUP, fence=fence)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "prefix", "match"),
    [
        ("", "p1/", "fence.key"),
        (7, "p1/", "fence.key"),
        ("k", "", "owner_prefix"),
        ("k", None, "owner_prefix"),
        ("k", "\ud800", "owner_prefix"),
    ],
)
def test_a_bad_lease_fence_is_refused(key: object, prefix: object, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        LeaseFence(key, prefix)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_backend_without_fenced_takes_refuses_a_fence() -> None:
    async with MemoryPubSub() as memory:
        assert Capability.FENCED_TAKES not in capabilities_of(memory)

        async def on_event(event: Event) -> None:
            pass

        with pytest.raises(TypeError, match="fence"):
            await memory.subscribe(TOPIC, on_event, fence=LeaseFence(TOPIC, "p/"))  # type: ignore[call-arg]
