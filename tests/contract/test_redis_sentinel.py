"""The contract suite against Redis run by Sentinel (``redis+sentinel://``).

One master, one replica and three sentinels, started once for this module by
tests/support (never the shared server); each test has a key prefix of its own.
The quarantine is on: the master counts as new (no marker, appendfsync always),
so the suite runs unchanged. Failover is in tests/redis/test_sentinel.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from tenure.backends.redis import RedisStreamsPubSub
from tenure.testing import LeaseContract, PubSubContract
from tests.support.redis_server import RedisSentinels

from ..redis.helpers import backend_on_prefix


@pytest.fixture(scope="module")
def sentinels() -> Iterator[RedisSentinels]:
    with RedisSentinels(persistence=True) as group:
        yield group


@pytest_asyncio.fixture
async def sentinel_backend(
    sentinels: RedisSentinels, unique: str
) -> AsyncIterator[RedisStreamsPubSub]:
    async with backend_on_prefix(sentinels.url, unique, [sentinels.master.url]) as backend:
        yield backend


class TestRedisSentinelLeases(LeaseContract):
    ttl_ms = 800

    @pytest_asyncio.fixture
    async def lease_provider(
        self, sentinel_backend: RedisStreamsPubSub
    ) -> AsyncIterator[RedisStreamsPubSub]:
        yield sentinel_backend


class TestRedisSentinelPubSub(PubSubContract):
    @pytest_asyncio.fixture
    async def pubsub(
        self, sentinel_backend: RedisStreamsPubSub
    ) -> AsyncIterator[RedisStreamsPubSub]:
        yield sentinel_backend
