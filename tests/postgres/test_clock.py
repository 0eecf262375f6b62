"""Expiry is judged on the server clock at the moment of the decision.

A statement that waited for a row lock held by a long-open transaction must
judge the lease on ``clock_timestamp()`` after the wait, not on the time its
statement or transaction started (``now()``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tenure.backends.postgres import PostgresLeaseProvider
from tests.postgres.helpers import drop_schema, new_schema

TTL_MS = 1000


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = new_schema()
    yield name
    drop_schema(postgres_url, name)


async def _hold_row_lock(url: str, schema: str, key: bytes) -> psycopg.AsyncConnection[object]:
    conn = await psycopg.AsyncConnection.connect(url)
    await conn.execute(
        sql.SQL("SELECT 1 FROM {} WHERE key = %s FOR UPDATE").format(
            sql.Identifier(schema, "leases")
        ),
        (key,),
    )
    return conn


@pytest.mark.asyncio
async def test_acquire_blocked_past_the_expiry_by_a_long_transaction_gets_the_lease(
    postgres_url: str, schema: str
) -> None:
    async with PostgresLeaseProvider.from_url(postgres_url, schema=schema) as provider:
        first = await provider.acquire_lease("k", "alice", TTL_MS)
        locker = await _hold_row_lock(postgres_url, schema, b"k")
        try:
            # bob's statement starts while alice's lease is live...
            task = asyncio.create_task(provider.acquire_lease("k", "bob", TTL_MS))
            await asyncio.sleep(TTL_MS * 2.5 / 1000)
            assert not task.done()
            # ...and is decided after it expired.
            await locker.commit()
        finally:
            await locker.close()
        result = await asyncio.wait_for(task, 30)
        assert result.acquired and result.owner == "bob"
        assert first.token is not None and result.token is not None
        assert result.token > first.token
        record = await provider.get_lease("k")
        # A fresh TTL from the grant, not from when the statement started.
        assert record is not None and record.ttl_ms > TTL_MS // 2


@pytest.mark.parametrize("operation", ["renew_lease", "renew_leases", "transfer_lease"])
@pytest.mark.asyncio
async def test_renew_or_transfer_blocked_past_the_expiry_does_not_resurrect(
    postgres_url: str, schema: str, operation: str
) -> None:
    async with PostgresLeaseProvider.from_url(postgres_url, schema=schema) as provider:
        calls: dict[str, Callable[[], Coroutine[Any, Any, object]]] = {
            "renew_lease": lambda: provider.renew_lease("k", "alice", TTL_MS),
            "renew_leases": lambda: provider.renew_leases(["k"], "alice", TTL_MS),
            "transfer_lease": lambda: provider.transfer_lease("k", "alice", "bob", TTL_MS),
        }
        await provider.acquire_lease("k", "alice", TTL_MS)
        locker = await _hold_row_lock(postgres_url, schema, b"k")
        try:
            task = asyncio.create_task(calls[operation]())
            await asyncio.sleep(TTL_MS * 2.5 / 1000)
            await locker.commit()
        finally:
            await locker.close()
        assert await asyncio.wait_for(task, 30) in (False, [False])
        assert await provider.get_lease_owner("k") is None


@pytest.mark.asyncio
async def test_an_old_open_transaction_elsewhere_does_not_freeze_the_clock(
    postgres_url: str, schema: str
) -> None:
    async with (
        PostgresLeaseProvider.from_url(postgres_url, schema=schema) as provider,
        await psycopg.AsyncConnection.connect(postgres_url) as idle,
    ):
        await idle.execute("SELECT now()")  # a transaction left open
        await provider.acquire_lease("k", "alice", 300)
        await asyncio.sleep(0.8)
        assert await provider.get_lease_owner("k") is None
        assert (await provider.acquire_lease("k", "bob", 300)).acquired
