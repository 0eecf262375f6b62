"""Live leases readable with plain SQL: the ``<table>_live`` view."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tenure.backends.postgres import PostgresLeaseProvider

from .helpers import drop_schema, new_schema


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = new_schema()
    yield name
    drop_schema(postgres_url, name)


async def _view(url: str, schema: str) -> dict[str, tuple[str, int, int]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(f'SELECT key, owner, token, ttl_ms FROM "{schema}".leases_live')
        return {key: (owner, token, ttl) for key, owner, token, ttl in await cur.fetchall()}


@pytest.mark.asyncio
async def test_live_leases_read_as_text(postgres_url: str, schema: str) -> None:
    async with PostgresLeaseProvider.from_url(postgres_url, schema=schema) as provider:
        granted = await provider.acquire_lease("thread/é-1", "worker a", 60_000)
        await provider.acquire_lease("k\0nul", "b", 60_000)
        await provider.acquire_lease("released", "c", 60_000)
        await provider.release_lease("released", "c")
        rows = await _view(postgres_url, schema)
    assert set(rows) == {"thread/é-1", "k\\000nul"}  # a NUL is escaped, not lost
    owner, token, ttl = rows["thread/é-1"]
    assert (owner, token) == ("worker a", granted.token)
    assert 0 < ttl <= 60_000


@pytest.mark.asyncio
async def test_a_schema_made_before_the_view_gets_it(postgres_url: str, schema: str) -> None:
    async with PostgresLeaseProvider.from_url(postgres_url, schema=schema) as provider:
        await provider.acquire_lease("k", "a", 60_000)
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute(f'DROP VIEW "{schema}".leases_live')
    async with PostgresLeaseProvider.from_url(postgres_url, schema=schema) as provider:
        assert await provider.get_lease_owner("k") == "a"
    assert (await _view(postgres_url, schema))["k"][0] == "a"
