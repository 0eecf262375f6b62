"""Helpers shared by the Redis tests."""

from __future__ import annotations

import contextlib
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
