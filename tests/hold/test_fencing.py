"""The fenced stores: a write with a token lower than the highest seen is rejected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

import tenure
from tenure import BackendClosed, BackendUnavailable, InvalidArgument, MemoryPubSub
from tenure.fencing import FencedStore, FencedValue, MemoryFencedStore, PostgresFencedStore

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
