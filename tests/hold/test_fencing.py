"""The fenced stores and the SQL fence: a write with a token lower than the highest seen is rejected."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiosqlite
import psycopg
import pytest
import pytest_asyncio

import tenure
from tenure import BackendClosed, BackendUnavailable, InvalidArgument, MemoryPubSub
from tenure.fencing import (
    FencedStore,
    FencedValue,
    FenceRefused,
    MemoryFencedStore,
    PostgresFencedStore,
    SqlFence,
)

from ..conftest import POSTGRES_URL, drop_postgres_schema


@pytest.fixture
def schema(unique: str) -> Iterator[str]:
    name = f"tenure_fence_{unique}"
    yield name
    drop_postgres_schema(name)


@pytest_asyncio.fixture(params=["memory", "postgres"])
async def store(request: pytest.FixtureRequest, schema: str) -> AsyncIterator[FencedStore]:
    if request.param == "memory":
        async with MemoryFencedStore() as s:
            yield s
    else:
        request.getfixturevalue("postgres_url")  # fails loudly if PostgreSQL is down
        async with PostgresFencedStore(POSTGRES_URL, schema=schema) as s:
            yield s


@pytest.mark.asyncio
async def test_lower_tokens_are_rejected_equal_and_higher_accepted(store: FencedStore) -> None:
    assert await store.read("k") is None
    assert await store.write("k", 5, {"v": 1})
    assert await store.write("k", 5, {"v": 2})  # the same holder writes again
    assert not await store.write("k", 4, {"v": "stale"})
    assert await store.read("k") == FencedValue(5, {"v": 2})
    assert await store.write("k", 9, [1, 2])
    assert not await store.write("k", 5, "stale")
    assert await store.read("k") == FencedValue(9, [1, 2])


@pytest.mark.asyncio
async def test_keys_are_independent_and_round_trip(store: FencedStore) -> None:
    keys = ["thread\0a", "thread\0b", "ключ 🔑"]
    for i, key in enumerate(keys):
        assert await store.write(key, 10 - i, key)
    for i, key in enumerate(keys):
        assert await store.read(key) == FencedValue(10 - i, key)


@pytest.mark.asyncio
async def test_concurrent_writers_keep_the_highest_token(store: FencedStore) -> None:
    tokens = list(range(1, 41))
    results = await asyncio.gather(*(store.write("k", t, t) for t in reversed(tokens)))
    assert results[0]  # the highest token went first: everything after is stale
    assert not any(results[1:])
    assert await store.read("k") == FencedValue(40, 40)


@pytest.mark.asyncio
async def test_bad_arguments_are_rejected(store: FencedStore) -> None:
    for key, token, value, message in [
        ("", 1, None, "key"),
        ("k", -1, None, "token"),
        ("k", True, None, "token"),
        ("k", 2**63, None, "token"),
        ("k", 1.0, None, "token"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            await store.write(key, token, value)  # type: ignore[arg-type]  # deliberately bad
    assert await store.read("k") is None


@pytest.mark.asyncio
async def test_the_token_of_a_held_lease_fences_a_stale_holder(store: FencedStore) -> None:
    async with MemoryPubSub() as backend:
        async with tenure.hold(backend, "k", "a", 10_000) as old:
            assert old.token is not None
            assert old.token is not None
            assert await store.write("k", old.token, "a")
            assert await old.transfer_to("b")
        async with tenure.hold(backend, "k", "b", 10_000) as new:
            assert new.token is not None and await store.write("k", new.token, "b")
        assert not await store.write("k", old.token, "a, late")
    assert new.token is not None
    assert await store.read("k") == FencedValue(new.token, "b")


@pytest.mark.asyncio
async def test_postgres_store_errors_are_translated_without_the_password(schema: str) -> None:
    url = "postgresql://postgres:s3cret-pw@127.0.0.1:1/postgres?connect_timeout=2"
    async with PostgresFencedStore(url, schema=schema) as store:
        assert "s3cret-pw" not in repr(store)
        with pytest.raises(BackendUnavailable) as info:
            await store.write("k", 1, "v")
        assert "s3cret-pw" not in str(info.value)
    with pytest.raises(BackendClosed):
        await store.read("k")
    with pytest.raises(InvalidArgument, match="table"):
        PostgresFencedStore(POSTGRES_URL, table="x; drop table y")


@pytest.mark.parametrize(
    "conninfo",
    [
        "host=127.0.0.1 port=1 user=postgres password=s3cret-dsn dbname=postgres connect_timeout=2",
        "host=127.0.0.1 port=1 password='s3cret-dsn' connect_timeout=2",
        "postgresql://postgres:s3cret-dsn@127.0.0.1:1/postgres?connect_timeout=2",
        "postgresql://postgres@127.0.0.1:1/postgres?password=s3cret-dsn&connect_timeout=2",
    ],
)
@pytest.mark.asyncio
async def test_postgres_store_never_shows_a_password(conninfo: str, schema: str) -> None:
    async with PostgresFencedStore(conninfo, schema=schema) as store:
        assert "s3cret-dsn" not in repr(store)
        with pytest.raises(BackendUnavailable) as info:
            await store.write("k", 1, "v")
        assert "s3cret-dsn" not in str(info.value)
        assert "127.0.0.1" in str(info.value)


# -- SqlFence: the check in the caller's own transaction, on each driver ----------------


class Driver:
    """One of the four drivers SqlFence takes, with a table of the caller's own."""

    def __init__(self, name: str, conn: Any) -> None:
        self.name = name
        self.conn = conn
        self.sqlite = name in ("sqlite3", "aiosqlite")

    async def run(self, statement: str, params: tuple[Any, ...] = ()) -> list[Any]:
        if not self.sqlite:
            statement = statement.replace("?", "%s")
        if self.name == "aiosqlite":
            return list(await self.conn.execute_fetchall(statement, params))
        if self.name == "psycopg-async":
            cur = await self.conn.execute(statement, params)
            return list(await cur.fetchall()) if cur.description else []
        cur = self.conn.execute(statement, params)
        return list(cur.fetchall()) if cur.description else []

    async def setup(self, fence: SqlFence) -> None:
        if self.name in ("aiosqlite", "psycopg-async"):
            await fence.asetup(self.conn)
        else:
            fence.setup(self.conn)

    async def check(self, fence: SqlFence, key: str, token: Any) -> None:
        if self.name in ("aiosqlite", "psycopg-async"):
            await fence.acheck(self.conn, key, token)
        else:
            fence.check(self.conn, key, token)

    async def end(self, commit: bool) -> None:
        if self.name in ("aiosqlite", "psycopg-async"):
            await (self.conn.commit() if commit else self.conn.rollback())
        else:
            self.conn.commit() if commit else self.conn.rollback()

    async def write(self, fence: SqlFence, key: str, token: Any, value: str) -> None:
        """The caller's write: its statement and the check, one transaction."""
        try:
            await self.run("INSERT INTO notes (value) VALUES (?)", (value,))
            await self.check(fence, key, token)
        except BaseException:
            await self.end(commit=False)
            raise
        await self.end(commit=True)


@pytest_asyncio.fixture(params=["sqlite3", "aiosqlite", "psycopg", "psycopg-async"])
async def driver(
    request: pytest.FixtureRequest, tmp_path: Path, schema: str
) -> AsyncIterator[Driver]:
    name = request.param
    if name == "sqlite3":
        conn: Any = sqlite3.connect(tmp_path / "fence.db")
        d = Driver(name, conn)
        await d.run("CREATE TABLE notes (value TEXT)")
        yield d
        conn.close()
    elif name == "aiosqlite":
        async with aiosqlite.connect(tmp_path / "fence.db") as conn:
            d = Driver(name, conn)
            await d.run("CREATE TABLE notes (value TEXT)")
            yield d
    else:
        request.getfixturevalue("postgres_url")
        url = f"{POSTGRES_URL}?options=-c%20search_path%3D{schema}"
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f'CREATE SCHEMA "{schema}"')
            admin.execute(f'CREATE TABLE "{schema}".notes (value text)')
        if name == "psycopg":
            with psycopg.connect(url) as sync_conn:
                yield Driver(name, sync_conn)
        else:
            async with await psycopg.AsyncConnection.connect(url) as async_conn:
                yield Driver(name, async_conn)


@pytest.mark.asyncio
async def test_sql_fence_refuses_lower_tokens_in_the_writers_transaction(driver: Driver) -> None:
    fence = SqlFence("fence_tokens")
    await driver.setup(fence)
    await driver.setup(fence)  # idempotent
    await driver.write(fence, "k", 5, "a")
    await driver.write(fence, "k", 5, "b")  # the same owner writes again
    with pytest.raises(FenceRefused) as refused:
        await driver.write(fence, "k", 4, "stale")
    assert (refused.value.key, refused.value.token, refused.value.highest) == ("k", 4, 5)
    assert isinstance(refused.value, tenure.TenureError)
    with pytest.raises(FenceRefused, match="no fencing token"):
        await driver.write(fence, "k", None, "token-less")
    await driver.write(fence, "k\0other", 1, "c")  # keys are independent and round-trip
    await driver.write(fence, "k", 9, "d")
    with pytest.raises(FenceRefused):
        await driver.write(fence, "k", 5, "stale again")
    for bad, message in [(-1, "token"), (True, "token"), (2**63, "token"), (1.0, "token")]:
        with pytest.raises(InvalidArgument, match=message):
            await driver.write(fence, "k", bad, "bad")
    with pytest.raises(InvalidArgument, match="key"):
        await driver.write(fence, "", 9, "bad")
    rows = await driver.run("SELECT value FROM notes")
    assert sorted(r[0] for r in rows) == ["a", "b", "c", "d"]
    await driver.end(commit=True)


def test_sql_fence_rejects_bad_names_and_connections() -> None:
    for bad in ["x; drop table y", "", "a" * 57, "1abc"]:
        with pytest.raises(InvalidArgument, match="table"):
            SqlFence(bad)
    with pytest.raises(InvalidArgument, match="schema"):
        SqlFence("t", schema='s"')
    with pytest.raises(InvalidArgument, match="psycopg 3 connection"):
        SqlFence().check(object(), "k", 1)
