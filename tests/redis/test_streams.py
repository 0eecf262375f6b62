"""Event delivery on Redis Streams across several clients and processes."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from tenure import Event
from tenure.backends.redis import RedisStreamsPubSub
from tenure.testing import eventually

from .helpers import delete_prefix

ROOT = Path(__file__).resolve().parents[2]
Factory = Callable[..., RedisStreamsPubSub]


@pytest_asyncio.fixture
async def clients(redis_url: str, unique: str) -> AsyncIterator[tuple[Factory, str]]:
    """Backends on the shared Redis under the test's own prefix; all closed and cleaned after."""
    prefix = f"tenure-test-{unique}:"
    made: list[RedisStreamsPubSub] = []

    def make(**options: object) -> RedisStreamsPubSub:
        backend = RedisStreamsPubSub.from_url(redis_url, prefix=prefix, quarantine=False, **options)
        made.append(backend)
        return backend

    try:
        yield make, prefix
    finally:
        for backend in made:
            await backend.aclose()
        await delete_prefix(redis_url, prefix)


def collector(into: list[Event]) -> Callable[[Event], Awaitable[None]]:
    async def callback(event: Event) -> None:
        into.append(event)

    return callback


async def groups_of(redis_url: str, stream: bytes) -> list[bytes]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return [g["name"] for g in await client.xinfo_groups(stream)]
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_fan_out_across_clients_and_private_groups_are_removed(
    clients: tuple[Factory, str], redis_url: str
) -> None:
    make, prefix = clients
    a, b, publisher = make(), make(), make()
    got_a: list[Event] = []
    got_b: list[Event] = []
    cb_a, cb_b = collector(got_a), collector(got_b)
    await a.subscribe("news", cb_a)
    await b.subscribe("news", cb_b)
    sent = [await publisher.publish("news", Event(type="t", data=i)) for i in range(20)]
    await eventually(lambda: len(got_a) == 20 and len(got_b) == 20)
    assert [e.id for e in got_a] == [e.id for e in sent]
    assert [e.id for e in got_b] == [e.id for e in sent]
    stream = f"{prefix}{{news}}:stream".encode()
    assert len(await groups_of(redis_url, stream)) == 2
    await a.unsubscribe("news", cb_a)
    await b.unsubscribe("news", cb_b)
    assert await groups_of(redis_url, stream) == []


@pytest.mark.asyncio
async def test_group_members_in_different_clients_share_the_work(
    clients: tuple[Factory, str],
) -> None:
    make, _ = clients
    a, b, publisher = make(), make(), make()
    got_a: list[Event] = []
    got_b: list[Event] = []

    def slow(into: list[Event]) -> Callable[[Event], Awaitable[None]]:
        async def callback(event: Event) -> None:
            into.append(event)
            await asyncio.sleep(0.01)

        return callback

    await a.subscribe("jobs", slow(got_a), group="workers")
    await b.subscribe("jobs", slow(got_b), group="workers")
    for i in range(60):
        await publisher.publish("jobs", Event(type="t", data=i))
    await eventually(lambda: len(got_a) + len(got_b) >= 60)
    await asyncio.sleep(0.3)
    assert sorted(e.data for e in got_a + got_b) == list(range(60))  # each exactly once


@pytest.mark.asyncio
async def test_raising_callback_is_retried_then_dropped_with_an_error(
    clients: tuple[Factory, str], redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    make, prefix = clients
    backend = make(max_attempts=3)
    attempts: list[tuple[object, int]] = []

    async def failing(event: Event) -> None:
        attempts.append((event.data, event.attempt))
        if event.data == "poison" or event.attempt < 2:
            raise RuntimeError("failure expected by the test")

    await backend.subscribe("t", failing, group="g")
    with caplog.at_level(logging.WARNING, logger="tenure.redis"):
        await backend.publish("t", Event(type="t", data="poison"))
        await backend.publish("t", Event(type="t", data="flaky"))
        await backend.flush()
    assert attempts == [("poison", 1), ("poison", 2), ("poison", 3), ("flaky", 1), ("flaky", 2)]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "dropping" in errors[0].getMessage()
    client = aioredis.Redis.from_url(redis_url)
    try:
        pending = await client.xpending(f"{prefix}{{t}}:stream".encode(), "g:g")
    finally:
        await client.aclose()
    assert pending["pending"] == 0  # both acknowledged: nothing redelivered later


@pytest.mark.asyncio
async def test_events_of_a_killed_subscriber_are_reclaimed_by_a_live_member(
    clients: tuple[Factory, str], redis_url: str, tmp_path: Path
) -> None:
    make, prefix = clients
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.redis._subscriber",
        redis_url,
        prefix,
        "work",
        "g",
        str(tmp_path),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert proc.returncode is None, "the subscriber process died"
            assert time.monotonic() < deadline, "the subscriber process never subscribed"
            await asyncio.sleep(0.05)
        publisher = make()
        sent = [await publisher.publish("work", Event(type="t", data=i)) for i in range(10)]
        while not (tmp_path / "got").exists():
            assert time.monotonic() < deadline, "the subscriber process never got an event"
            await asyncio.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    client = aioredis.Redis.from_url(redis_url)
    try:
        stuck = (await client.xpending(f"{prefix}{{work}}:stream".encode(), "g:g"))["pending"]
    finally:
        await client.aclose()
    assert stuck >= 1  # read by the dead process, never acknowledged
    got: list[Event] = []
    survivor = make(claim_idle_ms=300)
    await survivor.subscribe("work", collector(got), group="g")
    await eventually(lambda: len(got) >= 10, timeout=20)
    await asyncio.sleep(0.5)
    assert sorted(e.data for e in got) == list(range(10))  # nothing lost, nothing twice
    assert {e.id for e in got} == {e.id for e in sent}
    # Those the dead process had taken come with their second attempt.
    assert sum(e.attempt == 2 for e in got) == stuck
    assert all(e.attempt in (1, 2) for e in got)


@pytest.mark.asyncio
async def test_flush_waits_for_local_handling(clients: tuple[Factory, str]) -> None:
    make, _ = clients
    backend = make()
    done: list[int] = []

    async def slow(event: Event) -> None:
        await asyncio.sleep(0.02)
        done.append(event.data)

    await backend.subscribe("t", slow)
    for i in range(10):
        await backend.publish("t", Event(type="t", data=i))
    await backend.flush()
    assert done == list(range(10))
