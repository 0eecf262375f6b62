"""Configuration, the extension methods and wake-ups, on the shared server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
import pytest_asyncio
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from tenure import BackendClosed, ConfigurationError, InvalidArgument, from_url
from tenure.backends.postgres import PostgresLeaseProvider
from tests.postgres.helpers import drop_schema, new_schema
from tests.support.waiting import asleep, until_parked


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = new_schema()
    yield name
    drop_schema(postgres_url, name)


@pytest_asyncio.fixture
async def provider(postgres_url: str, schema: str) -> AsyncIterator[PostgresLeaseProvider]:
    async with PostgresLeaseProvider.from_url(postgres_url, schema=schema) as backend:
        yield backend


# -- configuration -------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("?bogus=1", "bogus"),
        ("?schema=a&schema=b", "given twice"),
        ("?pool_max_size=lots", "pool_max_size"),
        ("?prepare=maybe", "prepare"),
        ("?pool_min_size=5&pool_max_size=2", "max_size"),
        ("?schema=" + "s" * 64, "at most 63 bytes"),
        ("?table=", "table must be a non-empty"),
        ("?call_timeout=0", "call_timeout"),
        ("?call_timeout=soon", "call_timeout"),
    ],
)
def test_bad_url_options_are_configuration_errors(query: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        from_url(f"postgresql://postgres:pw-not-shown@127.0.0.1:5432/postgres{query}")
    assert why in str(info.value)
    assert "pw-not-shown" not in str(info.value)


def test_unknown_keyword_option_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="colour"):
        from_url("postgresql://127.0.0.1/postgres", colour="blue")


def test_schema_with_nul_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="NUL"):
        PostgresLeaseProvider("postgresql://127.0.0.1/postgres", schema="a\0b")


@pytest.mark.asyncio
async def test_repr_hides_the_password() -> None:
    backend = from_url("postgres://me:s3cr3t-pw@127.0.0.1:5432/db?schema=s&sslmode=disable")
    assert isinstance(backend, PostgresLeaseProvider)
    assert "s3cr3t-pw" not in repr(backend)
    assert "me@127.0.0.1:5432/db" in repr(backend)
    await backend.aclose()


@pytest.mark.asyncio
async def test_url_options_reach_the_right_place(postgres_url: str, schema: str) -> None:
    url = (
        f"{postgres_url}?schema={schema}&table=my_leases&prepare=false"
        "&sslmode=disable&application_name=tenure-url-test&pool_max_size=3"
    )
    async with from_url(url) as backend:
        assert isinstance(backend, PostgresLeaseProvider)
        assert (backend.schema, backend.table) == (schema, "my_leases")
        for _ in range(10):  # past psycopg's prepare threshold
            assert (await backend.acquire_lease("k", "alice", 30_000)).acquired
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = %s",
            (schema, "my_leases"),
        ).fetchone()
    assert row == (1,)


@pytest.mark.asyncio
async def test_an_injected_pool_is_used_and_left_open(postgres_url: str, schema: str) -> None:
    async with AsyncConnectionPool(
        postgres_url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
    ) as pool:
        async with PostgresLeaseProvider(pool=pool, schema=schema) as backend:
            assert (await backend.acquire_lease("k", "alice", 30_000)).acquired
            assert await backend.wait_lease_released("free", 0) is True
        assert not pool.closed
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")


@pytest.mark.asyncio
async def test_an_injected_pool_without_autocommit_still_commits(
    postgres_url: str, schema: str
) -> None:
    async with (
        AsyncConnectionPool(postgres_url, min_size=1, max_size=2, open=False) as pool,
        PostgresLeaseProvider(pool=pool, schema=schema) as backend,
    ):
        assert (await backend.acquire_lease("k", "alice", 30_000)).acquired
    async with PostgresLeaseProvider.from_url(postgres_url, schema=schema) as other:
        assert await other.get_lease_owner("k") == "alice"


@pytest.mark.asyncio
async def test_closed_provider_raises_backend_closed(provider: PostgresLeaseProvider) -> None:
    await provider.acquire_lease("k", "alice", 30_000)
    await provider.aclose()
    with pytest.raises(BackendClosed):
        await provider.renew_leases(["k"], "alice", 1000)
    with pytest.raises(BackendClosed):
        await provider.wait_lease_released("k", 1)
    assert "closed" in repr(provider)


@pytest.mark.asyncio
async def test_query_values_reach_libpq_unchanged(
    postgres_url: str, schema: str, unique: str
) -> None:
    # A space is %20 in a URL; re-encoding the query once turned it into "+",
    # which libpq does not decode: "-c+search_path=…" made every connection fail.
    url = (
        f"{postgres_url}?schema={schema}&application_name=tenure%20{unique}"
        f"&options=-c%20search_path%3D{schema}&pool_timeout=2"
    )
    async with from_url(url) as backend:
        assert (await backend.acquire_lease("k", "alice", 30_000)).acquired
        with psycopg.connect(postgres_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE application_name = %s",
                (f"tenure {unique}",),
            ).fetchone()
        assert row is not None and row[0] >= 1


# -- isolation -----------------------------------------------------------------------

_CONTENDERS = 16


async def _contend(backend: PostgresLeaseProvider, key: str, round_: int) -> None:
    owners = [f"o{i}-r{round_}" for i in range(_CONTENDERS)]
    results = await asyncio.gather(
        *(backend.acquire_lease(key, owner, 30_000) for owner in owners), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    winners = [r.owner for r in results if not isinstance(r, BaseException) and r.acquired]
    assert len(winners) == 1, results
    assert all(not isinstance(r, BaseException) and r.owner == winners[0] for r in results), results
    assert winners[0] is not None
    await backend.release_lease(key, winners[0])


@pytest.mark.parametrize("level", ["serializable", "repeatable read"])
@pytest.mark.asyncio
async def test_contended_acquires_under_a_stricter_server_default_answer_with_the_holder(
    postgres_url: str, schema: str, level: str
) -> None:
    # The server (a role, a database or the URL) may default to a stricter
    # isolation level; the lease statements must still run at READ COMMITTED,
    # where a conflicting update waits and then decides on the new row.
    escaped = level.replace(" ", "%5C%20")  # libpq splits options on unescaped spaces
    sep = "&" if "?" in postgres_url else "?"
    conninfo = f"{postgres_url}{sep}options=-c%20default_transaction_isolation%3D{escaped}"
    async with PostgresLeaseProvider(
        conninfo, schema=schema, min_size=_CONTENDERS, max_size=_CONTENDERS
    ) as backend:
        for round_ in range(6):
            # Rounds on a new key (concurrent inserts) and on a freed row (updates).
            await _contend(backend, f"k{round_ // 2}", round_)


@pytest.mark.asyncio
async def test_contended_acquires_with_a_serializable_url_option(
    postgres_url: str, schema: str
) -> None:
    url = (
        f"{postgres_url}?schema={schema}&pool_min_size={_CONTENDERS}"
        f"&pool_max_size={_CONTENDERS}&pool_timeout=2"
        "&options=-c%20default_transaction_isolation%3Dserializable"
    )
    async with from_url(url) as backend:
        assert isinstance(backend, PostgresLeaseProvider)
        for round_ in range(4):
            await _contend(backend, "k", round_)


# -- renew_leases ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_renew_leases_answers_per_key_in_order(provider: PostgresLeaseProvider) -> None:
    await provider.acquire_lease("a", "alice", 30_000)
    await provider.acquire_lease("b", "bob", 30_000)
    await provider.acquire_lease("c\0", "alice", 30_000)
    result = await provider.renew_leases(["c\0", "b", "missing", "a", "c\0"], "alice", 60_000)
    assert result == [True, False, False, True, True]
    record = await provider.get_lease("a")
    assert record is not None and record.ttl_ms > 30_000
    assert await provider.renew_leases([], "alice", 1000) == []


@pytest.mark.asyncio
async def test_renew_leases_validates_before_io(provider: PostgresLeaseProvider) -> None:
    with pytest.raises(InvalidArgument, match="keys"):
        await provider.renew_leases("abc", "alice", 1000)
    with pytest.raises(InvalidArgument, match="key"):
        await provider.renew_leases(["ok", ""], "alice", 1000)
    with pytest.raises(InvalidArgument, match="ttl_ms"):
        await provider.renew_leases(["ok"], "alice", 0)


@pytest.mark.asyncio
async def test_renew_leases_keeps_ten_thousand_keys_alive(
    postgres_url: str, schema: str, provider: PostgresLeaseProvider
) -> None:
    keys = [f"many-{i}" for i in range(10_000)]
    await provider.acquire_lease(keys[0], "alice", 30_000)
    # 10,000 single acquires would each wait for a commit flush: seed the
    # rest in one statement, in the layout acquire_lease writes.
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (key, owner, token, deadline)"
                " SELECT k, 'alice'::bytea, 1, clock_timestamp() + interval '30 seconds'"
                " FROM unnest(%s::bytea[]) AS k"
            ).format(sql.Identifier(schema, "leases")),
            ([k.encode() for k in keys[1:]],),
        )
    record = await provider.get_lease(keys[9_999])
    assert record is not None and record.owner == "alice"
    await provider.release_lease(keys[17], "alice")
    result = await provider.renew_leases(keys, "alice", 60_000)
    assert result == [i != 17 for i in range(10_000)]


# -- wait_lease_released ---------------------------------------------------------


@pytest.mark.asyncio
async def test_wait_returns_at_once_for_a_free_key(provider: PostgresLeaseProvider) -> None:
    assert await provider.wait_lease_released("free", 5) is True


@pytest.mark.asyncio
async def test_wait_times_out_while_held(provider: PostgresLeaseProvider) -> None:
    await provider.acquire_lease("k", "alice", 30_000)
    assert await provider.wait_lease_released("k", 0.2) is False


@pytest.mark.asyncio
async def test_release_in_another_provider_wakes_one_waiter(
    postgres_url: str, schema: str, provider: PostgresLeaseProvider
) -> None:
    await provider.acquire_lease("k\0thread", "alice", 30_000)
    waiters = [asyncio.create_task(provider.wait_lease_released("k\0thread", 30)) for _ in range(2)]
    await until_parked(provider, "k\0thread", 2)  # listening, looked, asleep
    async with PostgresLeaseProvider.from_url(postgres_url, schema=schema) as elsewhere:
        await elsewhere.release_lease("k\0thread", "alice")
        done, pending = await asyncio.wait(waiters, timeout=10, return_when="FIRST_COMPLETED")
        assert len(done) == 1 and done.pop().result() is True
        assert asleep(provider) == 1  # one waiter per release: the other was not woken
        assert len(pending) == 1 and not pending.pop().done()
        await elsewhere.acquire_lease("k\0thread", "bob", 30_000)
        assert await elsewhere.transfer_lease("k\0thread", "bob", "carol", 30_000)
    assert await asyncio.wait_for(asyncio.gather(*waiters), 10) == [True, True]


@pytest.mark.asyncio
async def test_release_by_a_non_owner_wakes_nobody(provider: PostgresLeaseProvider) -> None:
    await provider.acquire_lease("k", "alice", 30_000)
    waiter = asyncio.create_task(provider.wait_lease_released("k", 1.0))
    await until_parked(provider, "k")
    await provider.release_lease("k", "mallory")
    assert await waiter is False
