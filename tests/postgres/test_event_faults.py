"""The event half under real faults, on a private PostgreSQL server.

The LISTEN connection and the claiming connections are terminated with
``pg_terminate_backend``, the whole server is paused (SIGSTOP), restarted and
crashed, a subscriber process is SIGKILLed. In every case nothing
acknowledged is lost (acknowledged events stay acknowledged: no claim is left
and they are not delivered again to a newcomer) and nothing unacknowledged is
lost (every event is delivered, eventually).

The visibility timeout is shortened to 2 s where a test waits for a dead
taker's claims to come back; everything else runs on the backend's defaults.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg import sql

from tenure import BackendUnavailable, Event
from tenure.backends.postgres import PostgresPubSub
from tenure.testing import eventually
from tests.support.pg_server import PgServer

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "orders"
GROUP = "workers"


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    with PgServer() as pg:
        yield pg


@pytest.fixture
def url(server: PgServer, unique: str) -> str:
    # Each test in a schema of its own on the module's server.
    return f"{server.url}?schema=events_{unique}"


def _with(url: str, **query: Any) -> str:
    return url + "".join(f"&{k}={v}" for k, v in query.items())


class Ledger:
    """A callback that acknowledges by returning; counts deliveries per event."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}

    async def __call__(self, event: Event) -> None:
        self.seen[event.data] = self.seen.get(event.data, 0) + 1

    def has(self, numbers: range) -> bool:
        return all(n in self.seen for n in numbers)


@pytest_asyncio.fixture
async def publisher(url: str) -> AsyncIterator[PostgresPubSub]:
    async with PostgresPubSub.from_url(_with(url, call_timeout=2)) as backend:
        yield backend


async def publish_all(backend: PostgresPubSub, numbers: range) -> None:
    """Publish each number once, retrying through outages: ids make retries safe."""
    for n in numbers:
        while True:
            try:
                await backend.publish(TOPIC, Event(type="n", data=n, id=f"n-{n}"))
                break
            except BackendUnavailable:
                await asyncio.sleep(0.2)


async def open_claims(url: str, schema: str) -> int:
    """Claims of the group not yet acknowledged, read directly."""
    query = sql.SQL(
        "SELECT count(*) FROM {} AS c JOIN {} AS g ON g.id = c.group_id WHERE g.name = %s"
    ).format(sql.Identifier(schema, "leases_claims"), sql.Identifier(schema, "leases_groups"))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await (await conn.execute(query, (GROUP.encode(),))).fetchone()
    assert row is not None
    return int(row[0])


async def assert_nothing_lost(url: str, schema: str, ledger: Ledger, numbers: range) -> None:
    """Every event delivered, every acknowledgement kept (no claim left, a newcomer gets nothing)."""
    await eventually(lambda: ledger.has(numbers), timeout=60)
    admin = url.split("?")[0]
    for _ in range(600):
        if await open_claims(admin, schema) == 0:
            break
        await asyncio.sleep(0.05)
    assert await open_claims(admin, schema) == 0
    late = Ledger()
    async with PostgresPubSub.from_url(url) as newcomer:
        await newcomer.subscribe(TOPIC, late, group=GROUP)
        await newcomer.flush()
        await asyncio.sleep(0.5)
        await newcomer.flush()
        await newcomer.unsubscribe(TOPIC, late)
    assert late.seen == {}


async def _pids(server: PgServer, app: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(server.url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)
        )
        return [int(pid) for (pid,) in await cur.fetchall()]


async def _terminate(server: PgServer, app: str) -> int:
    pids = await _pids(server, app)
    async with await psycopg.AsyncConnection.connect(server.url, autocommit=True) as conn:
        for pid in pids:
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return len(pids)


async def _one_listener(server: PgServer, app: str) -> None:
    for _ in range(400):
        if len(await _pids(server, app)) == 1:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no LISTEN connection {app!r}: {await _pids(server, app)}")


@pytest.mark.asyncio
async def test_terminated_listener_loses_no_event(
    server: PgServer, url: str, unique: str, publisher: PostgresPubSub
) -> None:
    listener_app = f"listener-{unique}"
    listen = f"{server.url}?application_name={listener_app}"
    ledger = Ledger()
    async with PostgresPubSub.from_url(url, listen_conninfo=listen) as consumer:
        await consumer.subscribe(TOPIC, ledger, group=GROUP)
        for round_ in range(4):
            numbers = range(round_ * 20, round_ * 20 + 20)
            await _one_listener(server, listener_app)
            assert await _terminate(server, listener_app) == 1
            # Published while the listener is gone or coming back.
            await publish_all(publisher, numbers)
            await eventually(lambda: ledger.has(numbers), timeout=30)  # noqa: B023
        await _one_listener(server, listener_app)
        await assert_nothing_lost(url, f"events_{unique}", ledger, range(80))
        await consumer.unsubscribe(TOPIC, ledger)


@pytest.mark.asyncio
async def test_terminated_claimer_loses_no_event(
    server: PgServer, url: str, unique: str, publisher: PostgresPubSub
) -> None:
    # The consumer's pooled connections (taking and acknowledging) are
    # terminated again and again while events flow; a take whose reply is
    # lost leaves claims that come back after the visibility timeout.
    app = f"claimer-{unique}"
    ledger = Ledger()
    consumer_url = _with(url, application_name=app, visibility_timeout=2, pool_min_size=2)
    async with PostgresPubSub.from_url(consumer_url) as consumer:
        await consumer.subscribe(TOPIC, ledger, group=GROUP)
        sending = asyncio.ensure_future(publish_all(publisher, range(200)))
        terminated = 0
        while not sending.done():
            terminated += await _terminate(server, app)
            await asyncio.sleep(0.02)
        await sending
        assert terminated > 0
        await assert_nothing_lost(url, f"events_{unique}", ledger, range(200))
        await consumer.unsubscribe(TOPIC, ledger)


def _server_pids(server: PgServer) -> list[int]:
    """The postmaster and its client backends."""
    postmaster = server.postmaster_pid()
    assert postmaster is not None
    return [postmaster, *server.backend_pids()]


@pytest.mark.asyncio
async def test_paused_server_loses_no_event(
    server: PgServer, url: str, unique: str, publisher: PostgresPubSub
) -> None:
    ledger = Ledger()
    async with PostgresPubSub.from_url(_with(url, call_timeout=1)) as consumer:
        await consumer.subscribe(TOPIC, ledger, group=GROUP)
        await publish_all(publisher, range(20))
        await eventually(lambda: ledger.has(range(20)), timeout=30)
        sending = asyncio.ensure_future(publish_all(publisher, range(20, 60)))
        await asyncio.sleep(0.05)
        paused = _server_pids(server)
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(4)  # longer than every call_timeout and the ping interval
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        await asyncio.wait_for(sending, 60)
        await assert_nothing_lost(url, f"events_{unique}", ledger, range(60))
        await consumer.unsubscribe(TOPIC, ledger)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["restart", "crash"])
async def test_server_restart_loses_no_event(
    server: PgServer, url: str, unique: str, publisher: PostgresPubSub, how: str
) -> None:
    ledger = Ledger()
    async with PostgresPubSub.from_url(url) as consumer:
        await consumer.subscribe(TOPIC, ledger, group=GROUP)
        await publish_all(publisher, range(20))
        sending = asyncio.ensure_future(publish_all(publisher, range(20, 60)))
        await asyncio.sleep(0.05)
        if how == "restart":
            await asyncio.to_thread(server.restart)
        else:
            await asyncio.to_thread(server.kill)
            await asyncio.to_thread(server.start)
        await asyncio.wait_for(sending, 60)
        await assert_nothing_lost(url, f"events_{unique}", ledger, range(60))
        await consumer.unsubscribe(TOPIC, ledger)


@pytest.mark.asyncio
async def test_killed_subscriber_process_loses_no_event(
    url: str, unique: str, publisher: PostgresPubSub, tmp_path: Path
) -> None:
    # The process acknowledges 0..9 and hangs on 10 holding 10..19 (taken in
    # one batch), then is SIGKILLed. What it acknowledged never comes back;
    # what it held is delivered to the survivor after the visibility timeout.
    schema = f"events_{unique}"
    child_url = _with(url, visibility_timeout=2)
    ledger = Ledger()
    async with PostgresPubSub.from_url(url) as survivor:
        # The group exists before anything is published.
        await survivor.subscribe(TOPIC, ledger, group=GROUP)
        await survivor.unsubscribe(TOPIC, ledger)
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.postgres._subscriber",
            child_url,
            TOPIC,
            GROUP,
            "10",
            str(tmp_path),
            cwd=ROOT,
        )
        try:
            await eventually(lambda: (tmp_path / "ready").exists(), timeout=30)
            await publish_all(publisher, range(20))
            await eventually(lambda: (tmp_path / "got").exists(), timeout=30)
            # Its acknowledgements are written (batched, at once): 10 claims left.
            admin = url.split("?")[0]
            for _ in range(400):
                if await open_claims(admin, schema) == 10:
                    break
                await asyncio.sleep(0.05)
            assert await open_claims(admin, schema) == 10
        finally:
            child.send_signal(signal.SIGKILL)
            await child.wait()
        acked = sorted(int(line) for line in (tmp_path / "acked").read_text().split())
        assert acked == list(range(10))
        await survivor.subscribe(TOPIC, ledger, group=GROUP)
        await publish_all(publisher, range(20, 30))
        await eventually(lambda: ledger.has(range(10, 30)), timeout=30)
        assert not set(ledger.seen) & set(range(10)), "acknowledged events came back"
        await survivor.unsubscribe(TOPIC, ledger)
    await assert_nothing_lost(url, schema, ledger, range(10, 30))


@pytest.mark.asyncio
async def test_claims_of_a_take_whose_answer_was_lost_come_back_at_once(
    server: PgServer, url: str, unique: str, publisher: PostgresPubSub
) -> None:
    """A take reaches the server and commits, but its answer is dropped (the
    call times out, outcome unknown). The member must take those claims back
    itself with its next take, not leave them invisible for the visibility
    timeout (60 s here) behind newer events."""
    from safety.proxy import Proxy

    schema = f"events_{unique}"
    ledger = Ledger()
    async with Proxy("127.0.0.1", server.port) as proxy:
        via = _with(
            url.replace(f":{server.port}/", f":{proxy.port}/"),
            call_timeout=0.5,
            visibility_timeout=60,
        )
        async with PostgresPubSub.from_url(via) as member:
            await member.subscribe(TOPIC, ledger, group=GROUP)
            await publish_all(publisher, range(1))
            await eventually(lambda: ledger.has(range(1)), timeout=30)
            admin = url.split("?")[0]
            # Its acknowledgement written first: retried through the dropped
            # answers, it would use up the connections the take needs.
            for _ in range(200):
                if await open_claims(admin, schema) == 0:
                    break
                await asyncio.sleep(0.05)
            proxy.set_mode("drop-reply")  # requests go through, answers do not
            await publish_all(publisher, range(1, 3))

            async def taken_unseen() -> bool:
                query = sql.SQL("SELECT count(*) FROM {} WHERE attempt > 0").format(
                    sql.Identifier(schema, "leases_claims")
                )
                async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as c:
                    row = await (await c.execute(query)).fetchone()
                return row is not None and row[0] >= 2

            for _ in range(200):  # the fallback poll takes them, its answer is dropped
                if await taken_unseen():
                    break
                await asyncio.sleep(0.05)
            assert await taken_unseen()
            assert not ledger.has(range(1, 3))
            proxy.set_mode("pass")
            await eventually(lambda: ledger.has(range(1, 3)), timeout=20)


@pytest.mark.asyncio
async def test_an_acknowledgement_that_cannot_be_written_is_written_when_the_server_answers(
    server: PgServer, url: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server stops answering right after a callback returns, so its
    acknowledgement fails (twice: the call and its retry). It must be written
    once the server answers again, not dropped: a dropped one leaves the
    claim taken, and the handled event comes back at the next reclaim (or
    after the visibility timeout, 60 s here) behind newer events."""
    from safety.proxy import Proxy

    schema = f"events_{unique}"
    admin = url.split("?")[0]
    caplog.set_level(logging.INFO, logger="tenure.postgres")
    async with Proxy("127.0.0.1", server.port) as proxy:
        via = _with(
            url.replace(f":{server.port}/", f":{proxy.port}/"),
            call_timeout=0.5,
            visibility_timeout=60,
        )
        seen: list[int] = []

        async def cut_off_after(event: Event) -> None:
            seen.append(event.data)
            proxy.set_mode("blackhole")

        async with PostgresPubSub.from_url(via) as member:
            await member.subscribe(TOPIC, cut_off_after, group=GROUP)
            async with PostgresPubSub.from_url(url) as publisher:
                await publish_all(publisher, range(1))

            def ack_failed() -> bool:
                return any("acknowledgements" in r.getMessage() for r in caplog.records)

            await eventually(ack_failed, timeout=30)
            proxy.set_mode("pass")
            for _ in range(300):
                if await open_claims(admin, schema) == 0:
                    break
                await asyncio.sleep(0.05)
            assert await open_claims(admin, schema) == 0
            assert await member.reclaim(TOPIC, GROUP) == 0
            await member.unsubscribe(TOPIC, cut_off_after)
    assert seen == [0]
