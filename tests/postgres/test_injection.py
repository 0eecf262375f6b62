"""Hostile keys, owners and schema or table names are data, never SQL."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tenure.backends.postgres import PostgresLeaseProvider
from tests.postgres.helpers import drop_schema, new_schema

HOSTILE = [
    "'; DROP TABLE victim; --",
    "x'); DELETE FROM victim; --",
    '"; DROP SCHEMA public CASCADE; --',
    "$$; DROP TABLE victim; $$",
    "\\'; TRUNCATE victim; --",
    "%s %(key)s {table} {}",
    "k\0'; DROP TABLE victim; --",
]


@pytest.fixture
def victim(postgres_url: str) -> Iterator[str]:
    """A schema with a table ``victim`` holding one row, which nothing may touch."""
    name = new_schema()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE TABLE {} (n int)").format(sql.Identifier(name, "victim")))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (42)").format(sql.Identifier(name, "victim")))
    yield name
    drop_schema(postgres_url, name)


def _victim_rows(url: str, schema: str) -> list[tuple[int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        query = sql.SQL("SELECT n FROM {}").format(sql.Identifier(schema, "victim"))
        return [(int(n),) for (n,) in conn.execute(query).fetchall()]


@pytest.mark.asyncio
async def test_hostile_keys_and_owners_round_trip_and_change_nothing(
    postgres_url: str, victim: str
) -> None:
    # The lease table lives in the victim's schema, next to the victim table.
    async with PostgresLeaseProvider.from_url(postgres_url, schema=victim) as provider:
        for i, text in enumerate(HOSTILE):
            key, owner = f"{text}-key", f"{text}-owner"
            granted = await provider.acquire_lease(key, owner, 30_000)
            assert granted.acquired and granted.owner == owner
            assert (await provider.acquire_lease(key, "other", 30_000)).owner == owner
            assert await provider.renew_lease(key, owner, 30_000)
            assert await provider.renew_leases([key, text], owner, 30_000) == [True, False]
            assert await provider.transfer_lease(key, owner, text, 30_000)
            assert await provider.get_lease_owner(key) == text
            await provider.release_lease(key, text)
            assert await provider.get_lease(key) is None
            assert await provider.wait_lease_released(key, 0) is True
            assert (await provider.acquire_lease(f"after-{i}", "o", 30_000)).acquired
    assert _victim_rows(postgres_url, victim) == [(42,)]


@pytest.mark.parametrize(
    ("schema", "table"),
    [
        ('x"; DROP TABLE {victim}.victim; --', "leases"),
        ("tenure", 'l"; DROP TABLE {victim}.victim; --'),
        ("Mixed Case; DELETE", "t'; TRUNCATE {victim}.victim; --"),
    ],
)
@pytest.mark.asyncio
async def test_hostile_schema_and_table_names_are_identifiers(
    postgres_url: str, victim: str, schema: str, table: str
) -> None:
    schema = schema.format(victim=victim) if "{victim}" in schema else f"{schema} {victim[-12:]}"
    table = table.format(victim=victim)
    try:
        async with PostgresLeaseProvider.from_url(
            postgres_url, schema=schema, table=table
        ) as provider:
            assert (await provider.acquire_lease("k", "alice", 30_000)).acquired
            assert await provider.get_lease_owner("k") == "alice"
            waited = await provider.wait_lease_released("k", 0.05)
            assert waited is False
            await provider.release_lease("k", "alice")
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            found = conn.execute(
                "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = %s",
                (schema, table),
            ).fetchone()
        assert found == (1,)
        assert _victim_rows(postgres_url, victim) == [(42,)]
    finally:
        if schema != "tenure":
            drop_schema(postgres_url, schema)
        else:
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier("tenure", table))
                )
