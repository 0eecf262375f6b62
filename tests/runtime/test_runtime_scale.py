"""What a live, idle thread costs its backend: counted on a private Redis (``INFO commandstats``),
so that no other client's commands are counted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import redis
from tenure import ThreadRun, ThreadRuntime
from tenure.backends.redis import RedisStreamsPubSub
from tenure.testing import eventually

from ..redis.helpers import wait_out_quarantine
from ..support.redis_server import RedisServer

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
