"""The PostgreSQL event half beyond the shared suite: schema, retention, options, wake-up cost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
import pytest_asyncio
from psycopg import sql

from tenure import ConfigurationError, Event, from_url
from tenure.backends.postgres import PostgresPubSub
from tenure.testing import eventually
from tests.postgres.helpers import drop_schema, new_schema


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = new_schema()
    yield name
    drop_schema(postgres_url, name)


@pytest_asyncio.fixture
async def backend(postgres_url: str, schema: str) -> AsyncIterator[PostgresPubSub]:
    async with PostgresPubSub.from_url(postgres_url, schema=schema) as pubsub:
        yield pubsub


async def _count(url: str, schema: str, table: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, table))
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("?visibility_timeout=0", "visibility_timeout"),
        ("?max_attempts=0", "max_attempts"),
        ("?poll_interval=never", "poll_interval"),
        ("?retention=10&dedupe_window=20", "dedupe_window"),
    ],
)
def test_bad_event_options_are_configuration_errors(query: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=why):
        from_url(f"postgresql://127.0.0.1/postgres{query}")


@pytest.mark.asyncio
async def test_a_release_nobody_waits_for_sends_no_notification(
    postgres_url: str, backend: PostgresPubSub
) -> None:
    # Notifications arrive in commit order: had the first release notified,
    # its notification would come before the second one's.
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as listener:
        await listener.execute(
            sql.SQL("LISTEN {}").format(sql.Identifier(backend._conn.names.channel))
        )
        await backend.acquire_lease("unwatched", "alice", 30_000)
        await backend.acquire_lease("watched", "alice", 30_000)
        await backend.release_lease("unwatched", "alice")
        waiter = asyncio.create_task(backend.wait_lease_released("watched", 30))
        for _ in range(400):  # the waiter's registration is committed
            if await _count(postgres_url, backend.schema, "leases_waiters"):
                break
            await asyncio.sleep(0.025)
        await backend.release_lease("watched", "alice")
        assert await asyncio.wait_for(waiter, 10) is True
        async for note in listener.notifies(timeout=10):
            assert bytes.fromhex(note.payload) == b"watched"
            break
        else:
            raise AssertionError("the watched release sent no notification")


@pytest.mark.asyncio
async def test_concurrent_first_users_create_the_event_tables_once(
    postgres_url: str, schema: str
) -> None:
    backends = [PostgresPubSub.from_url(postgres_url, schema=schema) for _ in range(6)]
    got: list[Event] = []

    async def handle(event: Event) -> None:
        got.append(event)

    try:
        await asyncio.gather(
            *(b.subscribe("t", handle, group=f"g{i}") for i, b in enumerate(backends))
        )
        await backends[0].publish("t", Event(type="t"))
        await eventually(lambda: len(got) == 6)
    finally:
        for b in backends:
            await b.aclose()


@pytest.mark.asyncio
async def test_acknowledged_events_and_their_claims_go(postgres_url: str, schema: str) -> None:
    got: list[Event] = []

    async def handle(event: Event) -> None:
        got.append(event)

    async def fan_out(event: Event) -> None:
        got.append(event)

    url = f"{postgres_url}?schema={schema}&dedupe_window=0.5&prune_interval=0.2"
    async with PostgresPubSub.from_url(url) as backend:
        await backend.subscribe("t", handle, group="g")
        await backend.subscribe("t", fan_out)
        for i in range(10):
            await backend.publish("t", Event(type="t", data=i))
        for i in range(10):
            await backend.publish("t", Event(type="t", data=i, id=f"kept-{i}"))
        await eventually(lambda: len(got) == 40)
        # Acknowledged, kept only for deduplication, then pruned.
        for _ in range(200):
            if await _count(postgres_url, schema, "leases_events") == 0:
                break
            await asyncio.sleep(0.05)
        assert await _count(postgres_url, schema, "leases_events") == 0
        assert await _count(postgres_url, schema, "leases_claims") == 0
        await backend.unsubscribe("t", handle)
        await backend.unsubscribe("t", fan_out)
    # The fan-out group went with its subscriber; the named group stays.
    assert await _count(postgres_url, schema, "leases_groups") == 1
