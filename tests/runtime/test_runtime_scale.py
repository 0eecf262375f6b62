"""What a live, idle thread costs its backend: counted on a private Redis (``INFO commandstats``),
so that no other client's commands are counted."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import redis
import tenure
from tenure import Event, InvalidArgument, RuntimeEvent, ThreadRun, ThreadRuntime
from tenure.backends.redis import RedisStreamsPubSub
from tenure.testing import eventually

from ..redis.helpers import delete_prefix, wait_out_quarantine
from ..support.redis_server import RedisServer
from ..support.servers import POSTGRES_URL, drop_postgres_schema, require_tcp

TTL_MS = 3000


def calls(client: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.asyncio
async def test_the_sweep_does_not_look_at_the_threads_this_process_runs() -> None:
    """Threads in a run (each holding its signal, unacknowledged, so each topic is in
    the backlog index) cost the sweeps nothing: the sweep asks the backend about
    every thread with unfinished signals but this process's own."""
    live = 0
    finish = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        nonlocal live
        async for _ in run.signals():
            live += 1
            await finish.wait()
            return

    with RedisServer() as server:
        wait_out_quarantine(server.url, max_ttl_ms=TTL_MS)
        stats = redis.Redis.from_url(server.url)
        backend = RedisStreamsPubSub.from_url(server.url, max_ttl_ms=TTL_MS)
        try:
            async with ThreadRuntime(
                backend, handler, ttl_ms=TTL_MS, idle_timeout=60, sweep_interval=0.02
            ) as rt:
                for i in range(5):
                    await rt.send_signal(f"t{i}", i)
                await eventually(lambda: live == 5)
                looked = calls(stats, "xinfo|groups") + calls(stats, "exists")
                sweeps = calls(stats, "smembers")
                # Each sweep reads the backlog index once.
                await eventually(lambda: calls(stats, "smembers") >= sweeps + 10)
                assert calls(stats, "xinfo|groups") + calls(stats, "exists") == looked
                finish.set()
        finally:
            await backend.aclose()
            stats.close()


@pytest.mark.asyncio
async def test_finished_threads_leave_no_keys_after_the_retention() -> None:
    """Threads that ran and finished: with ``retention_ms``, their streams, fencing
    counters and id guards are gone once it has passed (here: every one of them)."""
    handled: list[Any] = []
    released: list[str] = []

    async def handler(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    def on_event(event: RuntimeEvent) -> None:
        if event.kind == "release":
            released.append(event.thread_key)

    with RedisServer() as server:
        wait_out_quarantine(server.url, max_ttl_ms=TTL_MS)
        keys = redis.Redis.from_url(server.url)
        backend = RedisStreamsPubSub.from_url(
            server.url, max_ttl_ms=TTL_MS, retention_ms=500, dedupe_window_ms=500
        )
        try:
            async with ThreadRuntime(
                backend, handler, ttl_ms=TTL_MS, idle_timeout=0.05, on_event=on_event
            ) as rt:
                for i in range(50):
                    await rt.send_signal(f"t{i}", i)
                await eventually(lambda: len(handled) == 50)
                await eventually(lambda: len(released) == 50, timeout=30)

                def per_thread_keys() -> list[bytes]:
                    return [k for k in keys.scan_iter(count=1000) if b"{" in k]

                assert per_thread_keys()
                await eventually(lambda: not per_thread_keys(), timeout=30)
        finally:
            await backend.aclose()
            keys.close()


async def three_rounds(
    rt: ThreadRuntime, handled: list[Any], forgotten: Callable[[], bool], timeout: float
) -> None:
    """Ten threads get a signal each, three times; every round runs, then the
    backend forgets every thread's group (``forgotten``) before the next round."""
    for round in range(3):
        for i in range(10):
            await rt.send_signal(f"t{i}", (round, i))
        expected = [(r, i) for r in range(round + 1) for i in range(10)]

        def all_run(want: list[tuple[int, int]] = expected) -> bool:
            return sorted(tuple(p) for p in handled) == want

        await eventually(all_run, timeout=timeout)
        await eventually(forgotten, timeout=timeout, interval=0.1)
        assert len(handled) == len(expected)


@pytest.mark.asyncio
async def test_a_thread_whose_group_retention_removed_runs_its_next_signals() -> None:
    """Retention forgets a finished thread's stream with its consumer group; the
    next signal to that thread must still run. A runtime that remembered the group
    published the signal before the next session made the group anew (at the
    stream's end, after the signal): it was skipped, then expired with the stream."""
    handled: list[Any] = []

    async def handler(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    with RedisServer() as server:
        wait_out_quarantine(server.url, max_ttl_ms=TTL_MS)
        keys = redis.Redis.from_url(server.url)
        backend = RedisStreamsPubSub.from_url(
            server.url, max_ttl_ms=TTL_MS, retention_ms=300, dedupe_window_ms=300
        )

        def streams() -> list[bytes]:
            return [k for k in keys.scan_iter(match="*:stream", count=1000) if b"#" not in k]

        try:
            async with ThreadRuntime(backend, handler, ttl_ms=TTL_MS, idle_timeout=0.05) as rt:
                # Every thread's session ends and its stream, group and all, expires.
                await three_rounds(rt, handled, lambda: not streams(), timeout=30)
        finally:
            await backend.aclose()
            keys.close()


@pytest.mark.asyncio
async def test_a_stream_left_to_expire_is_kept_by_a_publish_or_a_subscribe(
    redis_url: str, unique: str
) -> None:
    """Retention never drops an event: the expiry a drained stream gets when its last
    member leaves is removed by the next publish (an unread event) or subscribe."""
    prefix = f"tenure-test-{unique}:"
    backend = RedisStreamsPubSub.from_url(redis_url, prefix=prefix, retention_ms=600_000)
    client = redis.Redis.from_url(redis_url)
    stream = f"{prefix}{{topic}}:stream".encode()

    async def handle(event: Event) -> None:
        pass

    try:
        for keep in ("publish", "subscribe"):
            await backend.subscribe("topic", handle, group="g")
            assert client.pttl(stream) == -1
            await backend.unsubscribe("topic", handle)
            assert client.pttl(stream) > 0
            if keep == "publish":
                await backend.publish("topic", Event(type="t"))
            else:
                await backend.subscribe("topic", handle, group="g")
                await backend.unsubscribe("topic", handle)
                await backend.publish("topic", Event(type="t"))
            assert client.pttl(stream) == -1
            await backend.subscribe("topic", handle, group="g")
            await backend.flush()
            await backend.unsubscribe("topic", handle)
    finally:
        await backend.aclose()
        client.close()
        await delete_prefix(redis_url, prefix)


@pytest.mark.asyncio
async def test_retention_ms_is_checked_and_an_url_option(redis_url: str) -> None:
    for bad in (-1, 1.5, "1000", True):
        with pytest.raises(InvalidArgument, match="retention_ms"):
            RedisStreamsPubSub.from_url(redis_url, retention_ms=bad)
    backend = tenure.from_url(f"{redis_url}?retention_ms=1000")
    try:
        assert isinstance(backend, RedisStreamsPubSub)
        assert backend._retention_ms == 1000
    finally:
        await backend.aclose()


# Each round's groups (and, on PostgreSQL, lease rows) are forgotten within
# 5 * visibility_timeout + the retention of the thread's last heartbeat.
_RETAIN = "group_retention=0.3&prune_interval=0.1&visibility_timeout=0.12"


@pytest.fixture(params=["sqlite", "postgres"])
def retaining(
    request: pytest.FixtureRequest, short_tmp: Path, unique: str
) -> Iterator[tuple[str, Callable[[], dict[str, int]]]]:
    """A SQL backend URL with group (and lease) retention, and a count of what the
    runtime's threads leave: named group rows, and lease rows on PostgreSQL."""
    if request.param == "sqlite":
        path = short_tmp / "t.db"

        def left_sqlite() -> dict[str, int]:
            with sqlite3.connect(path) as conn:
                (groups,) = conn.execute(
                    "SELECT count(*) FROM tenure_groups WHERE private = 0"
                ).fetchone()
            return {"groups": groups}

        yield f"sqlite:///{path}?{_RETAIN}", left_sqlite
        return
    url = require_tcp(POSTGRES_URL, "PostgreSQL")
    schema = f"tenure_test_{unique}"

    def left_postgres() -> dict[str, int]:
        counts = {}
        with psycopg.connect(url, autocommit=True) as conn:
            for name, table, where in (
                ("groups", "leases_groups", "WHERE NOT private"),
                ("leases", "leases", ""),
            ):
                query = sql.SQL("SELECT count(*) FROM {} " + where)
                row = conn.execute(query.format(sql.Identifier(schema, table))).fetchone()
                counts[name] = row[0] if row else 0
        return counts

    yield f"{url}?schema={schema}&{_RETAIN}&lease_retention=0.3", left_postgres
    drop_postgres_schema(schema)


@pytest.mark.asyncio
async def test_finished_threads_leave_no_group_or_lease_rows_after_the_retention(
    retaining: tuple[str, Callable[[], dict[str, int]]],
) -> None:
    """SQLite and PostgreSQL with ``group_retention`` (and ``lease_retention``):
    threads that ran and finished leave no group row, nor a lease row, once it passed."""
    url, left = retaining
    handled: list[Any] = []
    released: list[str] = []

    async def handler(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    def on_event(event: RuntimeEvent) -> None:
        if event.kind == "release":
            released.append(event.thread_key)

    async with (
        tenure.events_of(tenure.from_url(url)) as backend,
        ThreadRuntime(backend, handler, ttl_ms=TTL_MS, idle_timeout=0.05, on_event=on_event) as rt,
    ):
        for i in range(20):
            await rt.send_signal(f"t{i}", i)
        await eventually(lambda: len(handled) == 20)
        await eventually(lambda: len(released) == 20, timeout=30)
        assert left()["groups"] > 0
        nothing = dict.fromkeys(left(), 0)
        await eventually(lambda: left() == nothing, timeout=30, interval=0.1)


@pytest.mark.asyncio
async def test_a_thread_whose_group_a_sql_backend_forgot_runs_its_next_signals(
    retaining: tuple[str, Callable[[], dict[str, int]]],
) -> None:
    """SQLite and PostgreSQL with ``group_retention``: a finished thread's group row
    is deleted, and the next signals to that thread must still run. A runtime that
    remembered the group published them to a topic without a group (not stored)."""
    url, left = retaining
    handled: list[Any] = []

    async def handler(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    async with tenure.events_of(tenure.from_url(url)) as backend:
        assert getattr(backend, "forgets_idle_groups", None) is True
        async with ThreadRuntime(backend, handler, ttl_ms=TTL_MS, idle_timeout=0.05) as rt:
            # Every thread's session ends and its group row is deleted.
            await three_rounds(rt, handled, lambda: left()["groups"] == 0, timeout=15)


@pytest.mark.asyncio
async def test_an_idle_live_thread_waits_for_its_next_signal_in_long_reads() -> None:
    """Threads in a run, each waiting for its next signal: each thread's fenced
    reader waits in an ``XREAD BLOCK``, and its control topic's fan-out reader in
    an ``XREADGROUP BLOCK``, of up to 10 s within half the client's socket timeout
    (5 s by default: 2.5 s), not of ``block_ms`` (1 s). The clock here is the
    renewal: the batch renews every lease once per TTL / 3 (1 s; one ``PEXPIRE``
    each)."""
    threads = 20
    rounds = 11
    got = 0

    async def handler(run: ThreadRun) -> None:
        nonlocal got
        async for _ in run.signals():
            got += 1

    with RedisServer() as server:
        wait_out_quarantine(server.url, max_ttl_ms=TTL_MS)
        stats = redis.Redis.from_url(server.url)
        backend = RedisStreamsPubSub.from_url(server.url, max_ttl_ms=TTL_MS)
        try:
            async with ThreadRuntime(backend, handler, ttl_ms=TTL_MS, idle_timeout=60) as rt:
                for i in range(threads):
                    await rt.send_signal(f"t{i}", i)
                await eventually(lambda: got == threads)
                waits, renewed = calls(stats, "xread"), calls(stats, "pexpire")
                reads = calls(stats, "xreadgroup")
                await eventually(
                    lambda: calls(stats, "pexpire") >= renewed + rounds * threads, timeout=60
                )
                # About ten seconds: four or five waits of 2.5 s a thread; of 1 s, ten.
                assert calls(stats, "xread") - waits <= 6 * threads
                # The control topic's fan-out reader waits as long (XREADGROUP), and
                # so does the take (inside the fenced script) after each wait.
                assert calls(stats, "xreadgroup") - reads <= 12 * threads
        finally:
            await backend.aclose()
            stats.close()
