"""PostgreSQL ``group_retention`` and ``lease_retention``, on the controlled SQL clock:
idle named groups and old lease rows go, a held lease and a group with work never do,
and a key's tokens keep increasing across a deleted row."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg import sql

from tenure import ConfigurationError, Event, from_url
from tenure.backends.postgres import PostgresPubSub
from tenure.testing import eventually
from tests.postgres.helpers import SqlClock, drop_schema, new_schema

_ALIVE_S = 5 * 30  # a member keeps its group alive for 5 * visibility_timeout (default 30 s)
_NAMED = "WHERE NOT private"


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = new_schema()
    yield name
    drop_schema(postgres_url, name)


async def _rows(url: str, schema: str, table: str, where: str = "") -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        query = sql.SQL("SELECT * FROM {} " + where).format(sql.Identifier(schema, table))
        cur = await conn.execute(query)
        return list(await cur.fetchall())


async def _nothing(event: Event) -> None:
    pass


@pytest_asyncio.fixture
async def pruning(postgres_url: str, schema: str) -> AsyncIterator[tuple[PostgresPubSub, SqlClock]]:
    """A backend with both retentions (10 s) pruning every 0.02 s (its upkeep ticks
    every poll_interval; a fan-out subscriber keeps it going), on a frozen SQL clock."""
    backend = PostgresPubSub.from_url(
        postgres_url,
        schema=schema,
        group_retention=10,
        lease_retention=10,
        prune_interval=0.02,
        poll_interval=0.02,
    )
    async with backend:
        await backend.subscribe("upkeep", _nothing)
        clock = SqlClock(postgres_url, schema)
        await clock.set(0)
        yield backend, clock


async def _pruned() -> None:
    """Wait for a few prunes to have run after this call."""
    await asyncio.sleep(0.2)


@pytest.mark.parametrize(
    "query",
    [
        "group_retention=-1",
        "group_retention=soon",
        "lease_retention=-0.5",
        "lease_retention=inf",
    ],
)
def test_bad_retentions_are_configuration_errors(query: str) -> None:
    name = query.partition("=")[0]
    with pytest.raises(ConfigurationError, match=name):
        from_url(f"postgresql://127.0.0.1/postgres?{query}")


@pytest.mark.parametrize("bad", [True, "10", -1, float("nan")])
@pytest.mark.parametrize("name", ["group_retention", "lease_retention"])
def test_bad_retention_keywords_are_configuration_errors(name: str, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=name):
        PostgresPubSub("postgresql://127.0.0.1/postgres", **{name: bad})


def test_forgets_idle_groups_only_with_group_retention() -> None:
    url = "postgresql://127.0.0.1/postgres"
    assert PostgresPubSub(url).forgets_idle_groups is False
    assert PostgresPubSub(url, lease_retention=5).forgets_idle_groups is False
    assert PostgresPubSub(url, group_retention=0).forgets_idle_groups is False
    forgetting = from_url(f"{url}?group_retention=0.5")
    assert isinstance(forgetting, PostgresPubSub)
    assert forgetting.forgets_idle_groups is True


@pytest.mark.asyncio
async def test_an_idle_named_group_goes_once_every_event_was_acknowledged(
    postgres_url: str, schema: str, pruning: tuple[PostgresPubSub, SqlClock]
) -> None:
    backend, clock = pruning
    got: list[str] = []

    async def record(event: Event) -> None:
        got.append(event.type)

    await backend.subscribe("t", record, group="g")
    await backend.unsubscribe("t", record)
    await backend.publish("t", Event(type="unread"))  # a claim of the memberless group
    await clock.advance((_ALIVE_S + 11) * 1000)
    await _pruned()
    assert len(await _rows(postgres_url, schema, "leases_groups", _NAMED)) == 1
    await backend.subscribe("t", record, group="g")
    await eventually(lambda: got == ["unread"])
    await backend.unsubscribe("t", record)  # acknowledged before it returns
    await clock.advance((_ALIVE_S + 11) * 1000)

    async def gone() -> bool:
        return not await _rows(postgres_url, schema, "leases_groups", _NAMED)

    for _ in range(100):
        if await gone():
            break
        await asyncio.sleep(0.05)
    assert await gone()


@pytest.mark.asyncio
async def test_a_held_lease_is_never_pruned_and_tokens_grow_past_a_pruned_row(
    postgres_url: str, schema: str, pruning: tuple[PostgresPubSub, SqlClock]
) -> None:
    backend, clock = pruning
    # Held for an hour on the server clock.
    held = await backend.acquire_lease("held", "a", 3_600_000)
    # Released at once: its deadline (60 s ahead) stays on the row.
    released = await backend.acquire_lease("released", "a", 60_000)
    await backend.release_lease("released", "a")
    # Expired (after 60 s), never released.
    expired = await backend.acquire_lease("expired", "a", 60_000)
    # Expired long ago, but its token is ahead of the clock (as after more
    # grants than microseconds): its successor's seed could not exceed it.
    ahead = await backend.acquire_lease("ahead", "a", 60_000)
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("UPDATE {} SET token = token + 10000000000 WHERE key = 'ahead'").format(
                sql.Identifier(schema, "leases")
            )
        )

    async def keys() -> list[str]:
        return sorted(bytes(k).decode() for k, *_ in await _rows(postgres_url, schema, "leases"))

    await clock.advance(60_000 + 10_000 - 1)  # the 60 s deadlines passed, under 10 s ago
    await _pruned()
    assert await keys() == ["ahead", "expired", "held", "released"]
    await clock.advance(2)  # more than 10 s after those deadlines
    for _ in range(100):
        if await keys() == ["ahead", "held"]:
            break
        await asyncio.sleep(0.05)
    assert await keys() == ["ahead", "held"]
    record = await backend.get_lease("held")
    assert record is not None and record.owner == "a" and record.token == held.token
    # The next tokens of the deleted keys are higher than any they had.
    for key, before in (("released", released.token), ("expired", expired.token)):
        again = await backend.acquire_lease(key, "b", 1_000)
        assert again.acquired and again.token is not None and before is not None
        assert again.token > before
    again = await backend.acquire_lease("ahead", "b", 1_000)
    assert again.token == (ahead.token or 0) + 10_000_000_000 + 1
