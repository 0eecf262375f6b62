"""Helpers shared by the Redis tests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import redis.asyncio as aioredis

from tenure._url import backend_class
from tenure.backends.redis import RedisStreamsPubSub


async def delete_prefix(url: str, prefix: str, *, one_by_one: bool = False) -> int:
    """Delete every key under ``prefix`` (a test's own namespace); returns how many.

    ``one_by_one``: one ``DEL`` per key (a Redis Cluster node refuses a ``DEL``
    of keys in several slots); pass each node's own URL."""
    pattern = b"".join(
        b"\\" + bytes([c]) if c in b"\\*?[]" else bytes([c]) for c in prefix.encode()
    )
    client = aioredis.Redis.from_url(url)
    deleted = 0
    try:
        batch: list[bytes] = []
        async for key in client.scan_iter(match=pattern + b"*", count=1000):
            batch.append(key)
            if one_by_one:
                deleted += await client.delete(batch.pop())
            elif len(batch) >= 1000:
                deleted += await client.delete(*batch)
                batch.clear()
        if batch:
            deleted += await client.delete(*batch)
    finally:
        await client.aclose()
    return deleted


@contextlib.asynccontextmanager
async def backend_on_prefix(
    url: str, unique: str, nodes: Sequence[str], *, one_by_one: bool = False
) -> AsyncIterator[RedisStreamsPubSub]:
    """The backend of ``url`` (its scheme's class) under a prefix of its own;
    at the end it is closed and the prefix's keys deleted on every URL of ``nodes``."""
    prefix = f"tenure-test-{unique}:"
    backend: RedisStreamsPubSub = backend_class(url).from_url(
        url, prefix=prefix, socket_timeout=2.0
    )
    try:
        yield backend
    finally:
        await backend.aclose()
        for node in nodes:
            await delete_prefix(node, prefix, one_by_one=one_by_one)


def wait_out_quarantine(url: str, *, max_ttl_ms: int = 60_000, timeout: float = 180.0) -> None:
    """Return once a prefix used for the first time on the Redis at ``url`` is granted at once.

    What quarantines a new prefix is server-wide: a server younger than
    ``max_ttl_ms`` without ``appendfsync always``, or a ``FLUSHALL``/``FLUSHDB``
    first seen less than ``max_ttl_ms`` ago. Once a throwaway prefix is granted,
    so is every new one (with a ``max_ttl_ms`` no larger), until the server
    restarts or is flushed. A test that expects a grant at once on a shared
    server calls this first, so that nothing passes or fails by the server's
    uptime. Runs in a thread of its own: callable with or without a running loop.
    """
    failure: list[BaseException] = []

    def probe() -> None:
        try:
            asyncio.run(_wait_for_grant(url, max_ttl_ms, timeout))
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=probe, name="tenure-test-quarantine-probe")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


async def _wait_for_grant(url: str, max_ttl_ms: int, timeout: float) -> None:
    prefix = f"tenure-test-probe-{uuid.uuid4().hex[:8]}:"
    backend = RedisStreamsPubSub.from_url(url, prefix=prefix, max_ttl_ms=max_ttl_ms)
    deadline = time.monotonic() + timeout
    try:
        while not (result := await backend.acquire_lease("probe", "probe", 1000)).acquired:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: new prefixes still quarantined after {timeout} s")
            await asyncio.sleep(min(1.0, (result.retry_after_ms or 100) / 1000))
    finally:
        await backend.aclose()
        await delete_prefix(url, prefix)
