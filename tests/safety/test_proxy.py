"""The fault proxy against a real echo server and the real shared Redis."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from safety.proxy import Proxy


class Echo:
    def __init__(self) -> None:
        self.received = b""
        self.server: asyncio.Server | None = None

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(1024):
            self.received += data
            w.write(data)
            await w.drain()
        w.close()


@pytest_asyncio.fixture
async def echo() -> AsyncIterator[tuple[Echo, Proxy]]:
    e = Echo()
    e.server = await asyncio.start_server(e.handle, "127.0.0.1", 0)
    port = e.server.sockets[0].getsockname()[1]
    async with Proxy("127.0.0.1", port) as proxy:
        yield e, proxy
    e.server.close()


async def roundtrip(proxy: Proxy, data: bytes, timeout: float = 0.5) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        w.write(data)
        await w.drain()
        return await asyncio.wait_for(r.readexactly(len(data)), timeout)
    finally:
        w.close()


@pytest.mark.asyncio
async def test_pass_forwards_both_ways(echo: tuple[Echo, Proxy]) -> None:
    _, proxy = echo
    assert await roundtrip(proxy, b"hello") == b"hello"


@pytest.mark.asyncio
async def test_drop_reply_delivers_the_request_but_not_the_answer(echo: tuple[Echo, Proxy]) -> None:
    server, proxy = echo
    proxy.set_mode("drop-reply")
    with pytest.raises(TimeoutError):
        await roundtrip(proxy, b"lost-answer", timeout=0.3)
    assert b"lost-answer" in server.received
    proxy.set_mode("pass")
    assert await roundtrip(proxy, b"again") == b"again"


@pytest.mark.asyncio
async def test_blackhole_delivers_nothing(echo: tuple[Echo, Proxy]) -> None:
    server, proxy = echo
    proxy.set_mode("blackhole")
    with pytest.raises(TimeoutError):
        await roundtrip(proxy, b"into-the-void", timeout=0.3)
    assert b"into-the-void" not in server.received
    proxy.set_mode("pass")
    assert await roundtrip(proxy, b"healed") == b"healed"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.asyncio
async def test_blackholed_connection_closed_by_the_client_is_closed_by_the_proxy(
    echo: tuple[Echo, Proxy],
) -> None:
    # Both ends live in this process: a proxy end left open shows as a file descriptor.
    _, proxy = echo
    proxy.set_mode("blackhole")
    before = _open_fds()
    for _ in range(20):
        _, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        w.write(b"swallowed")
        await w.drain()
        w.close()
        await w.wait_closed()
    for _ in range(100):
        if _open_fds() <= before:
            break
        await asyncio.sleep(0.02)
    assert _open_fds() <= before, "the proxy kept its ends of closed blackholed connections"
    proxy.set_mode("pass")
    assert await roundtrip(proxy, b"healed") == b"healed"


@pytest.mark.asyncio
async def test_reset_closes_open_and_new_connections(echo: tuple[Echo, Proxy]) -> None:
    _, proxy = echo
    r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
    w.write(b"x")
    assert await asyncio.wait_for(r.readexactly(1), 1) == b"x"
    proxy.set_mode("reset")
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(r.readexactly(1), 1)
    w.close()
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await roundtrip(proxy, b"y", timeout=1)
    proxy.set_mode("pass")
    assert await roundtrip(proxy, b"z") == b"z"


@pytest.mark.asyncio
async def test_drop_reply_in_front_of_redis_applies_the_write(redis_url: str, unique: str) -> None:
    direct = aioredis.Redis.from_url(redis_url)
    host = direct.connection_pool.connection_kwargs.get("host", "127.0.0.1")
    port = direct.connection_pool.connection_kwargs.get("port", 6379)
    key = f"tenure-test-{unique}:proxied"
    try:
        async with Proxy(host, port) as proxy:
            # No client-side retries: one SET, one lost reply.
            via = aioredis.Redis(
                host="127.0.0.1", port=proxy.port, socket_timeout=0.3, retry=Retry(NoBackoff(), 0)
            )
            try:
                assert await via.ping()
                proxy.set_mode("drop-reply")
                with pytest.raises((RedisTimeoutError, RedisConnectionError)):
                    await via.set(key, "applied", px=60_000)
                assert await direct.get(key) == b"applied"
            finally:
                await via.aclose()
    finally:
        await direct.delete(key)
        await direct.aclose()
