"""Connections that die, servers that crash, wrong passwords.

``pg_terminate_backend`` only ever targets this test's own connections on the
shared server (found by a unique ``application_name``); tests that kill a
whole server start their own (``tests/support/pg_server.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import pytest_asyncio

from safety.proxy import Proxy
from tenure import BackendUnavailable, ConfigurationError
from tenure.backends.postgres import PostgresLeaseProvider
from tests.postgres.helpers import drop_schema, new_schema
from tests.support.pg_server import PgServer, free_port
from tests.support.waiting import until_parked

Admin = psycopg.AsyncConnection[tuple[Any, ...]]


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = new_schema()
    yield name
    drop_schema(postgres_url, name)


@pytest_asyncio.fixture
async def admin(postgres_url: str) -> AsyncIterator[Admin]:
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        yield conn


async def _pids(admin: Admin, app: str) -> list[int]:
    cur = await admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)
    )
    return [int(pid) for (pid,) in await cur.fetchall()]


async def _terminate_all(admin: Admin, app: str) -> int:
    pids = await _pids(admin, app)
    for pid in pids:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    # Wait until the backends are really gone, so the pool sees closed sockets.
    for _ in range(500):
        if not set(pids) & set(await _pids(admin, app)):
            return len(pids)
        await asyncio.sleep(0.01)
    raise AssertionError(f"backends {pids} did not exit")


@contextlib.asynccontextmanager
async def _row_locked(url: str, schema: str, key: bytes) -> AsyncIterator[Admin]:
    """A connection whose open transaction holds the lease row of ``key`` (FOR UPDATE)."""
    async with await psycopg.AsyncConnection.connect(url) as locker:
        await locker.execute(
            psycopg.sql.SQL("SELECT 1 FROM {} WHERE key = %s FOR UPDATE").format(
                psycopg.sql.Identifier(schema, "leases")
            ),
            (key,),
        )
        yield locker


async def _wait_blocked(admin: Admin, app: str) -> int:
    """The pid of ``app``'s backend once it waits for a row lock."""
    for _ in range(1000):
        cur = await admin.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE application_name = %s AND wait_event_type = 'Lock'",
            (app,),
        )
        row = await cur.fetchone()
        if row is not None:
            return int(row[0])
        await asyncio.sleep(0.01)
    raise AssertionError("the statement never waited for the lock")


@pytest.mark.asyncio
async def test_terminated_pooled_connections_are_replaced(
    postgres_url: str, schema: str, unique: str, admin: Admin
) -> None:
    app = f"tenure-test-{unique}"
    url = f"{postgres_url}?application_name={app}&pool_min_size=2"
    async with PostgresLeaseProvider.from_url(url, schema=schema) as provider:
        granted = await provider.acquire_lease("k", "alice", 30_000)
        assert await _terminate_all(admin, app) >= 1
        # transfer is never retried: it succeeds only because the pool
        # noticed the dead connection before using it.
        assert await provider.transfer_lease("k", "alice", "bob", 30_000)
        assert await _terminate_all(admin, app) >= 1
        record = await provider.get_lease("k")
        assert record is not None and record.owner == "bob"
        assert granted.token is not None and record.token > granted.token


@pytest.mark.asyncio
async def test_acquire_whose_connection_is_terminated_mid_statement_is_retried(
    postgres_url: str, schema: str, unique: str, admin: Admin
) -> None:
    app = f"tenure-test-{unique}"
    async with PostgresLeaseProvider.from_url(
        f"{postgres_url}?application_name={app}", schema=schema
    ) as provider:
        await provider.acquire_lease("k", "alice", 30_000)
        await provider.release_lease("k", "alice")
        async with _row_locked(postgres_url, schema, b"k") as locker:
            task = asyncio.create_task(provider.acquire_lease("k", "bob", 30_000))
            pid = await _wait_blocked(admin, app)
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            # The retry waits for the same lock on a fresh connection.
            await _wait_blocked(admin, app)
            await locker.commit()
        result = await asyncio.wait_for(task, 30)
        assert result.acquired and result.owner == "bob"
        assert await provider.get_lease_owner("k") == "bob"


@pytest.mark.asyncio
async def test_a_retried_acquire_that_is_refused_reports_an_unknown_outcome(
    postgres_url: str, schema: str, unique: str, admin: Admin
) -> None:
    # Found by the safety harness: the first attempt can be applied before the
    # connection breaks; if the lease then expires and goes to someone else,
    # the retry is refused, and reporting "refused" would hide that the caller
    # was granted the lease. The call must say "unknown" instead.
    app = f"tenure-test-{unique}"
    async with PostgresLeaseProvider.from_url(
        f"{postgres_url}?application_name={app}", schema=schema
    ) as provider:
        await provider.acquire_lease("k", "alice", 30_000)
        await provider.release_lease("k", "alice")
        table = psycopg.sql.Identifier(schema, "leases")
        async with _row_locked(postgres_url, schema, b"k") as locker:
            task = asyncio.create_task(provider.acquire_lease("k", "bob", 30_000))
            pid = await _wait_blocked(admin, app)
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await _wait_blocked(admin, app)
            # Meanwhile carol holds the key when the retry runs.
            await locker.execute(
                psycopg.sql.SQL(
                    "UPDATE {} SET owner = %s, token = token + 1,"
                    " deadline = clock_timestamp() + interval '30 seconds' WHERE key = %s"
                ).format(table),
                (b"carol", b"k"),
            )
            await locker.commit()
        with pytest.raises(BackendUnavailable, match="outcome unknown"):
            await asyncio.wait_for(task, 30)
        assert await provider.get_lease_owner("k") == "carol"


@pytest.mark.asyncio
async def test_transfer_whose_connection_is_terminated_raises_unavailable(
    postgres_url: str, schema: str, unique: str, admin: Admin
) -> None:
    app = f"tenure-test-{unique}"
    async with PostgresLeaseProvider.from_url(
        f"{postgres_url}?application_name={app}", schema=schema
    ) as provider:
        await provider.acquire_lease("k", "alice", 30_000)
        async with _row_locked(postgres_url, schema, b"k") as locker:
            task = asyncio.create_task(provider.transfer_lease("k", "alice", "bob", 30_000))
            pid = await _wait_blocked(admin, app)
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            with pytest.raises(BackendUnavailable) as info:
                await asyncio.wait_for(task, 30)
            assert isinstance(info.value.__cause__, psycopg.OperationalError)
            await locker.commit()
        # The statement never ran, the next call works on a fresh connection.
        assert await provider.get_lease_owner("k") == "alice"
        assert await provider.transfer_lease("k", "alice", "bob", 30_000)


@pytest.mark.asyncio
async def test_lost_listen_connection_wakes_every_waiter(
    postgres_url: str, schema: str, unique: str, admin: Admin
) -> None:
    app = f"tenure-test-{unique}"
    async with PostgresLeaseProvider.from_url(
        f"{postgres_url}?application_name={app}", schema=schema
    ) as provider:
        await provider.acquire_lease("a", "alice", 30_000)
        await provider.acquire_lease("b", "alice", 30_000)
        waiters = [asyncio.create_task(provider.wait_lease_released(k, 60)) for k in ("a", "b")]
        await until_parked(provider, "a")
        await until_parked(provider, "b")  # both listening, looked, asleep
        assert not any(w.done() for w in waiters)
        cur = await admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND query LIKE 'LISTEN%%'",
            (app,),
        )
        row = await cur.fetchone()
        assert row is not None
        await admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        # Releases may have been missed while it was down: everyone looks again.
        assert await asyncio.wait_for(asyncio.gather(*waiters), 30) == [True, True]
        # And the listener is back: a release wakes a new waiter.
        waiter = asyncio.create_task(provider.wait_lease_released("a", 60))
        await until_parked(provider, "a")
        await provider.release_lease("a", "alice")
        assert await asyncio.wait_for(waiter, 30) is True


@pytest.mark.asyncio
async def test_server_crash_is_unavailable_then_recovers_with_higher_tokens() -> None:
    with PgServer() as server:
        async with PostgresLeaseProvider.from_url(f"{server.url}?pool_timeout=2") as provider:
            first = await provider.acquire_lease("k", "alice", 60_000)
            server.kill()
            with pytest.raises(BackendUnavailable):
                await provider.get_lease_owner("k")
            server.start()
            # Committed grants survive the crash; the pool reconnects by itself.
            for _ in range(100):
                try:
                    owner = await provider.get_lease_owner("k")
                    break
                except BackendUnavailable:
                    await asyncio.sleep(0.1)
            assert owner == "alice"
            await provider.release_lease("k", "alice")
            second = await provider.acquire_lease("k", "bob", 60_000)
            assert first.token is not None and second.token is not None
            assert second.acquired and second.token > first.token


@pytest.mark.asyncio
async def test_a_release_lost_in_a_crash_only_lets_the_lease_expire() -> None:
    """A release commits without waiting for the WAL flush. Force its loss: the
    WAL writer flushes every 10 s only, and the server is SIGKILLed right after
    the release returned. After recovery the lease is still the releaser's,
    with its token, until its deadline; nobody else gets it before, and the
    next owner gets a higher token after (what the docstring promises)."""
    ttl_ms = 6000
    with PgServer(settings={"wal_writer_delay": "10000"}) as server:
        url = f"{server.url}?pool_timeout=2"
        async with PostgresLeaseProvider.from_url(url) as provider:
            first = await provider.acquire_lease("k", "alice", ttl_ms)
            granted_at = time.monotonic()
            assert first.acquired and first.token is not None
            await provider.release_lease("k", "alice")
            server.kill()
        server.start()
        async with PostgresLeaseProvider.from_url(url) as provider:
            record = await provider.get_lease("k")
            # Lost: without the asynchronous commit the lease would be free here.
            assert record is not None and record.owner == "alice"
            assert record.token == first.token
            refused = await provider.acquire_lease("k", "bob", ttl_ms)
            assert not refused.acquired and refused.owner == "alice"
            await asyncio.sleep(max(0.0, granted_at + ttl_ms / 1000 + 0.1 - time.monotonic()))
            second = await provider.acquire_lease("k", "bob", ttl_ms)
            assert second.acquired and second.token is not None
            assert second.token > first.token


@pytest.mark.asyncio
async def test_wrong_password_is_a_prompt_configuration_error_and_never_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "correct-horse-7Q"
    wrong = "wrong-battery-9Z"
    caplog.set_level(logging.DEBUG)
    with PgServer(password=secret) as server:
        good_url = server.url + "?sslmode=disable"
        bad_url = good_url.replace(secret, wrong)
        assert bad_url != good_url
        async with PostgresLeaseProvider.from_url(bad_url) as provider:
            assert wrong not in repr(provider)
            started = time.monotonic()
            with pytest.raises(ConfigurationError) as info:
                await provider.acquire_lease("k", "alice", 1000)
            assert time.monotonic() - started < 2
            with pytest.raises(ConfigurationError) as waiting:
                await provider.wait_lease_released("k", 1)
        assert "password authentication failed" in str(info.value)
        for error in (info.value, waiting.value):
            texts = [str(error), repr(error), str(error.__cause__), repr(error.__cause__)]
            assert all(wrong not in text for text in texts), texts
        assert wrong not in caplog.text
        # The right password (and sslmode passed through to libpq) works.
        async with PostgresLeaseProvider.from_url(good_url) as provider:
            assert secret not in repr(provider)
            assert (await provider.acquire_lease("k", "alice", 1000)).acquired


@pytest.mark.parametrize("wrong", ["database", "role"])
@pytest.mark.asyncio
async def test_wrong_database_or_role_is_a_prompt_configuration_error(
    postgres_url: str, unique: str, wrong: str
) -> None:
    parts = urlsplit(postgres_url)
    if wrong == "database":
        parts = parts._replace(path=f"/tenure_no_such_db_{unique}")
    else:
        parts = parts._replace(netloc=f"tenure_no_such_role_{unique}@{parts.netloc.split('@')[-1]}")
    async with PostgresLeaseProvider.from_url(urlunsplit(parts)) as provider:
        started = time.monotonic()
        with pytest.raises(
            ConfigurationError, match=f"tenure_no_such_{'db' if wrong == 'database' else 'role'}_"
        ):
            await provider.get_lease_owner("k")
        assert time.monotonic() - started < 2
        # Still an error on the next call, not a hang or a different answer.
        with pytest.raises(ConfigurationError):
            await provider.acquire_lease("k", "alice", 1000)


@contextlib.asynccontextmanager
async def _proxied(url: str) -> AsyncIterator[tuple[Proxy, str]]:
    """A proxy in front of ``url``'s server, and ``url`` through it."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    async with Proxy(parts.hostname, parts.port) as proxy:
        user = parts.netloc.rpartition("@")[0]
        yield proxy, urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{proxy.port}"))


@pytest.mark.asyncio
async def test_a_black_holed_connection_fails_a_bare_call_in_bounded_time(
    postgres_url: str, schema: str
) -> None:
    async with (
        _proxied(postgres_url) as (proxy, via_proxy),
        PostgresLeaseProvider.from_url(via_proxy, schema=schema) as provider,
    ):
        assert (await provider.acquire_lease("k", "alice", 30_000)).acquired
        proxy.set_mode("blackhole")
        # The default per-call time limit (a few seconds), no option given.
        started = time.monotonic()
        outcomes = await asyncio.wait_for(
            asyncio.gather(
                provider.acquire_lease("k", "bob", 30_000),
                provider.get_lease_owner("k"),
                provider.wait_lease_released("k", 30),
                return_exceptions=True,
            ),
            20,
        )
        elapsed = time.monotonic() - started
        # Healed before the proxy must close a connection the client gave up
        # on while black-holed (the proxy leaves those open).
        proxy.set_mode("pass")
        for outcome in outcomes:
            assert isinstance(outcome, BackendUnavailable), outcomes
            assert "within" in str(outcome)
        assert elapsed < 7
        # Healed: fresh connections answer again.
        for _ in range(50):
            try:
                owner = await provider.get_lease_owner("k")
                break
            except BackendUnavailable:
                await asyncio.sleep(0.2)
        assert owner == "alice"


@pytest.mark.asyncio
async def test_the_call_time_limit_is_an_option(postgres_url: str, schema: str) -> None:
    async with (
        _proxied(postgres_url) as (proxy, via_proxy),
        PostgresLeaseProvider.from_url(f"{via_proxy}?call_timeout=0.5", schema=schema) as provider,
    ):
        await provider.get_lease_owner("k")
        proxy.set_mode("blackhole")
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match=r"0\.5 s"):
            await asyncio.wait_for(provider.renew_lease("k", "alice", 1000), 20)
        assert time.monotonic() - started < 2
        proxy.set_mode("pass")


@pytest.mark.asyncio
async def test_unreachable_server_is_unavailable() -> None:
    url = f"postgresql://postgres:hunter2-secret@127.0.0.1:{free_port()}/postgres?pool_timeout=1"
    async with PostgresLeaseProvider.from_url(url) as provider:
        with pytest.raises(BackendUnavailable) as info:
            await provider.get_lease_owner("k")
        assert "hunter2-secret" not in str(info.value)
        assert "hunter2-secret" not in repr(provider)


@pytest.mark.asyncio
async def test_sslmode_require_against_a_server_without_ssl_is_unavailable(
    postgres_url: str,
) -> None:
    async with PostgresLeaseProvider.from_url(
        f"{postgres_url}?sslmode=require&pool_timeout=1"
    ) as provider:
        with pytest.raises(BackendUnavailable):
            await provider.get_lease_owner("k")


@pytest.mark.asyncio
async def test_a_statement_past_the_time_limit_is_cancelled_on_the_server(
    postgres_url: str, schema: str
) -> None:
    """A renew stuck behind another session's row lock answers on time, and
    its statement does not stay behind on the server, still waiting."""
    async with PostgresLeaseProvider.from_url(
        f"{postgres_url}?call_timeout=0.5", schema=schema
    ) as provider:
        assert (await provider.acquire_lease("k", "alice", 60_000)).acquired
        async with await psycopg.AsyncConnection.connect(postgres_url) as blocker:
            await blocker.execute(f'SELECT 1 FROM "{schema}".{provider.table} FOR UPDATE')
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match=r"0\.5 s"):
                await provider.renew_lease("k", "alice", 60_000)
            assert time.monotonic() - started < 2
            async with await psycopg.AsyncConnection.connect(postgres_url) as probe:
                waiting = await (
                    await probe.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()"
                    )
                ).fetchone()
            assert waiting == (0,)
            await blocker.rollback()
        assert await provider.renew_lease("k", "alice", 60_000)


@pytest.mark.asyncio
async def test_a_cancellation_from_outside_is_not_turned_into_an_error(
    postgres_url: str, schema: str
) -> None:
    """The caller's own timeout wins over the call time limit, and the backend
    stays usable after the abandoned statement."""
    async with (
        _proxied(postgres_url) as (proxy, via_proxy),
        PostgresLeaseProvider.from_url(f"{via_proxy}?call_timeout=5", schema=schema) as provider,
    ):
        assert (await provider.acquire_lease("k", "alice", 60_000)).acquired
        proxy.set_mode("blackhole")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(provider.renew_lease("k", "alice", 60_000), 0.3)
        proxy.set_mode("pass")
        assert await provider.renew_lease("k", "alice", 60_000)


@pytest.mark.asyncio
async def test_a_time_limit_swallowed_below_still_leaves_later_limits_working(
    postgres_url: str, schema: str
) -> None:
    """The call time limit cancels the caller's task; on Python 3.11,
    ``asyncio.wait_for`` (which psycopg_pool uses while waiting for a
    connection) can swallow a cancellation that races with its result, and the
    call then returns normally. The limit must withdraw its cancellation all
    the same: left counted, it made every later time-out of that task look like
    a cancellation from outside, and a bare ``CancelledError`` escaped
    ``send_signal`` (seen in a PostgreSQL thread soak: the worker's task died).

    The race itself cannot be forced on demand, so a stand-in coroutine
    swallows the cancellation the way ``wait_for`` does; the later call hangs
    for real, in front of a black hole."""

    async def swallowing() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # what 3.11's wait_for does when its inner future just finished
        return "done"

    async with (
        _proxied(postgres_url) as (proxy, via_proxy),
        PostgresLeaseProvider.from_url(f"{via_proxy}?call_timeout=0.2", schema=schema) as provider,
    ):
        assert (await provider.acquire_lease("k", "alice", 30_000)).acquired
        conn = provider._conn
        assert await conn.bounded("swallowed", swallowing()) == "done"
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        proxy.set_mode("blackhole")
        with pytest.raises(BackendUnavailable, match="no answer to renew_lease"):
            await provider.renew_lease("k", "alice", 30_000)
        proxy.set_mode("pass")
