"""The contract suite against Redis (the shared server, a key prefix per test).

The quarantine after state loss is turned off here: the shared server may have
been started moments before the suite, and a fresh server is quarantined by
design. The quarantine itself is tested on private servers in ``tests/redis``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tenure import from_url
from tenure.backends.redis import RedisStreamsPubSub
from tenure.testing import LeaseContract, PubSubContract
from tests.support.servers import REDIS_URL, require_tcp
from tests.support.targets import BackendTarget

from ..redis.helpers import delete_prefix


def _isolated_url(unique: str, tmp_path: Path) -> str:
    # The shared server may have started moments ago (CI): its restart
    # quarantine is tested on servers of the tests' own, not here.
    url = require_tcp(REDIS_URL, "Redis")
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}prefix=tenure-test-{unique}:&quarantine=off"


def _cleanup(unique: str) -> None:
    # The fixture runs outside any event loop; a short-lived one deletes the keys.
    asyncio.run(delete_prefix(REDIS_URL, f"tenure-test-{unique}:"))


TARGET = BackendTarget("redis", isolated_url=_isolated_url, cleanup=_cleanup)


@pytest_asyncio.fixture
async def redis_backend(redis_url: str, unique: str) -> AsyncIterator[RedisStreamsPubSub]:
    prefix = f"tenure-test-{unique}:"
    backend = from_url(redis_url, prefix=prefix, quarantine=False)
    assert isinstance(backend, RedisStreamsPubSub)
    try:
        yield backend
    finally:
        await backend.aclose()
        await delete_prefix(redis_url, prefix)


class TestRedisLeases(LeaseContract):
    ttl_ms = 800

    @pytest_asyncio.fixture
    async def lease_provider(
        self, redis_backend: RedisStreamsPubSub
    ) -> AsyncIterator[RedisStreamsPubSub]:
        yield redis_backend


class TestRedisPubSub(PubSubContract):
    @pytest_asyncio.fixture
    async def pubsub(self, redis_backend: RedisStreamsPubSub) -> AsyncIterator[RedisStreamsPubSub]:
        yield redis_backend
