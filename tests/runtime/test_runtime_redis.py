"""The thread runtime on Redis, in one process: a session that closes while a signal arrives.

Two runtimes on two backends (two Redis clients, one key prefix) stand for two
processes. The backends' ``claim_idle_ms`` is far beyond the test's waits, so a
signal can only reach the next owner if the closing session hands it back when it
unsubscribes (not through Redis's idle-entry reclaim).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Collection
from typing import Any

import pytest
import pytest_asyncio

from tenure import BackendUnavailable, Capability, Event, ThreadRun, ThreadRuntime
from tenure.backends.redis import RedisStreamsPubSub
from tenure.testing import eventually

from ..redis.helpers import delete_prefix
from ..support.redis_server import RedisServer

NEVER_MS = 600_000


class SlowUnsubscribe:
    """A Redis backend whose ``unsubscribe`` starts ``delay`` seconds late (a loaded server).

    Meanwhile the subscription goes on reading, so a signal published then is
    delivered to a session that has already decided to close.
    """

    # The runtime reads the declaration: it forwards pub/sub with durable groups,
    # reclaim, backlog and dedupe (the runtime needs all of them across processes).
    capabilities = (
        Capability.EVENTS
        | Capability.DURABLE_GROUPS
        | Capability.RECLAIM
        | Capability.BACKLOG
        | Capability.DEDUPE
    )

    def __init__(self, inner: RedisStreamsPubSub, delay: float) -> None:
        self.inner = inner
        self.delay = delay
        self.unsubscribing = asyncio.Event()

    def get_lease_provider(self) -> RedisStreamsPubSub:
        return self.inner

    async def publish(self, topic: str, event: Event) -> Event:
        return await self.inner.publish(topic, event)

    async def subscribe(self, topic: str, callback: Any, *, group: str | None = None) -> None:
        await self.inner.subscribe(topic, callback, group=group)

    async def unsubscribe(self, topic: str, callback: Any) -> None:
        self.unsubscribing.set()
        await asyncio.sleep(self.delay)
        await self.inner.unsubscribe(topic, callback)

    async def flush(self) -> None:
        await self.inner.flush()

    async def reclaim(self, topic: str, group: str) -> int:
        return await self.inner.reclaim(topic, group)

    async def backlog(self, prefix: str, group: str, *, skip: Collection[str] = ()) -> list[str]:
        return await self.inner.backlog(prefix, group, skip=skip)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest_asyncio.fixture
async def prefix(redis_url: str, unique: str) -> AsyncIterator[str]:
    name = f"tenure-test-{unique}:"
    try:
        yield name
    finally:
        await delete_prefix(redis_url, name)


@pytest.mark.asyncio
async def test_a_signal_that_reaches_a_closing_session_is_run_by_the_next_owner(
    redis_url: str, prefix: str
) -> None:
    def backend() -> RedisStreamsPubSub:
        return RedisStreamsPubSub.from_url(
            redis_url, prefix=prefix, quarantine=False, claim_idle_ms=NEVER_MS
        )

    handled: list[tuple[str, Any]] = []

    def handler(name: str) -> Any:
        async def handle(run: ThreadRun) -> None:
            handled.extend([(name, signal.payload) async for signal in run.signals()])

        return handle

    # The owner's unsubscribe takes three lease TTLs: its lease must stay held (and
    # renewed) until its unfinished signal is back in the group, or the other
    # runtime would open a session, find nothing, and leave the signal stranded.
    slow = SlowUnsubscribe(backend(), delay=3.0)
    fast = backend()
    options: dict[str, Any] = {"ttl_ms": 1000, "idle_timeout": 0.3}
    try:
        async with (
            ThreadRuntime(slow, handler("owner"), process_id="owner", **options) as owner,
            ThreadRuntime(fast, handler("other"), process_id="other", **options) as other,
        ):
            first = await owner.send_signal("thread", "first")
            assert first.outcome == "wake"
            await eventually(lambda: ("owner", "first") in handled)
            # The owner's session read its close marker and is now unsubscribing.
            await asyncio.wait_for(slow.unsubscribing.wait(), 10)
            late = await other.send_signal("thread", "late")
            assert late.outcome == "deliver"  # the closing session still held the thread
            # Run once, by whichever runtime's sweep finds it first after the release.
            await eventually(lambda: any(p == "late" for _, p in handled), timeout=15)
            await asyncio.sleep(0.5)
            assert [p for _, p in handled] == ["first", "late"]
    finally:
        await slow.aclose()
        await fast.aclose()


@pytest.mark.asyncio
async def test_a_first_signal_sent_during_a_fresh_servers_quarantine_is_run() -> None:
    # A fresh server refuses grants of unknown keys for max_ttl_ms (it cannot tell
    # a first start from a restart that lost leases). A sender of a new thread must
    # not publish before the thread's group exists: it waits for the grant.
    handled: list[Any] = []

    async def handle(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    with RedisServer() as server:
        backend = RedisStreamsPubSub.from_url(server.url, max_ttl_ms=1500)
        try:
            async with ThreadRuntime(backend, handle, ttl_ms=1500, idle_timeout=0.2) as rt:
                result = await rt.send_signal("new-thread", "first")
                assert result.outcome == "wake"
                await eventually(lambda: handled == ["first"], timeout=10)
        finally:
            await backend.aclose()


@pytest.mark.asyncio
async def test_a_session_whose_unsubscribe_hangs_releases_its_thread_after_the_timeout(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The events connection black-holed (a proxy that forwards nothing) as a
    session closes: its unsubscribe hangs, for up to the 60 s socket timeout set
    here, but the session goes on after ``unsubscribe_timeout`` and releases the
    thread's lease (taken on a connection of its own), instead of keeping the
    thread hostage. Once the connection passes again, the thread runs again."""
    from safety.proxy import Proxy

    host, port = redis_url.split("//")[1].split("/")[0].split(":")
    handled: list[Any] = []
    go = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append(signal.payload)
            if signal.payload == 1:
                await go.wait()
                return

    caplog.set_level(logging.WARNING, logger="tenure.runtime")
    async with Proxy(host, int(port)) as proxy:
        events = RedisStreamsPubSub.from_url(
            f"redis://127.0.0.1:{proxy.port}/0",
            prefix=prefix,
            quarantine=False,
            socket_timeout=60,
        )
        leases = RedisStreamsPubSub.from_url(redis_url, prefix=prefix, quarantine=False)
        try:
            async with ThreadRuntime(
                events,
                handler,
                lease_provider=leases,
                ttl_ms=2_000,
                idle_timeout=0.2,
                marker_timeout=0.5,
                unsubscribe_timeout=0.3,
            ) as rt:
                await rt.send_signal("t", 1)
                await eventually(lambda: handled == [1])
                assert await leases.get_lease_owner(rt.lease_key("t")) is not None
                proxy.set_mode("blackhole")
                go.set()  # the run ends: the session closes and unsubscribes
                for _ in range(1000):
                    if await leases.get_lease_owner(rt.lease_key("t")) is None:
                        break
                    await asyncio.sleep(0.01)
                else:
                    pytest.fail("the thread's lease was not released within 10 s")
                assert proxy.mode == "blackhole"  # released while the unsubscribe still hangs
                assert any("takes longer than" in r.getMessage() for r in caplog.records)
                proxy.set_mode("pass")  # resets the black-holed connections
                for _ in range(100):  # a sender retries what failed on a reset connection
                    try:
                        await rt.send_signal("t", 2, signal_id="two")
                        break
                    except BackendUnavailable:
                        await asyncio.sleep(0.05)
                await eventually(lambda: 2 in handled, timeout=20)
        finally:
            await events.aclose()
            await leases.aclose()
