"""Renewal through a real network fault: a private redis-server paused with SIGSTOP.

While the server is stopped, renew calls time out (``socket_timeout``) and
raise ``BackendUnavailable``; the holder retries until its renew deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

import tenure

from ..support.redis_server import RedisServer


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _url(server: RedisServer) -> str:
    # A fresh server would quarantine first grants for max_ttl_ms; not the point here.
    return f"{server.url}?quarantine=false&socket_timeout=0.25&prefix=pause:"


@pytest.mark.asyncio
async def test_a_pause_shorter_than_the_deadline_is_retried_and_the_lease_kept(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tenure.hold")
    async with (
        tenure.from_url(_url(server)) as backend,
        # Renewal every 2 s, deadline 4 s: the pause below covers one renewal.
        tenure.hold(backend, "k", "a", 6000) as lease,
    ):
        await asyncio.sleep(0.5)
        server.pause()
        try:
            await asyncio.sleep(2.5)
        finally:
            server.resume()
        await asyncio.sleep(1.5)
        assert lease.held and not lease.lost.is_set()
        record = await backend.get_lease("k")
        assert record is not None and (record.owner, record.token) == ("a", lease.token)
        assert record.ttl_ms > 6000 - 2500  # renewed after the server came back
    retried = [r for r in caplog.records if "retrying until the renew deadline" in r.message]
    assert retried, "the pause did not hit a renewal: the test proved nothing"


@pytest.mark.asyncio
async def test_a_pause_past_the_deadline_loses_the_lease(server: RedisServer) -> None:
    async with tenure.from_url(_url(server)) as backend:

        async def hold_through_the_pause() -> None:
            async with tenure.hold(backend, "k", "a", 3000):
                server.pause()
                try:
                    await asyncio.sleep(2.5)  # the deadline (2 s) passes while paused
                finally:
                    server.resume()
                await asyncio.sleep(5)

        with pytest.raises(tenure.LeaseLost) as info:
            await hold_through_the_pause()
        assert "renew deadline" in info.value.reason
        # The holder gave up before its TTL ran out on the server: nobody else
        # could have been granted the key while it still believed it held it.
        other = await tenure.acquire_wait(backend, "k", "b", 3000, timeout=10)
        assert other.acquired
