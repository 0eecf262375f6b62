"""The contract suites against ``tenure.sync`` backends, through an adapter (``AsyncOverSync``).

Every call goes from a worker thread through tenure's loop thread and back, so
this checks the blocking facade on memory, SQLite and Redis with the same tests
as the async backends. No ``TARGET`` here: the backend-parametrized fixtures
build async backends from URLs, which the facade does not change.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import tenure.sync
from tenure.testing import Advance, LeaseContract, ManualClock, PubSubContract
from tests.support.sync_adapter import AsyncOverSync

from ..redis.helpers import delete_prefix


def _adapter(url: str, **options: object) -> AsyncOverSync:
    return AsyncOverSync(tenure.sync.from_url(url, **options))


@pytest_asyncio.fixture
async def sync_redis(redis_url: str, unique: str) -> AsyncIterator[AsyncOverSync]:
    prefix = f"tenure-test-{unique}:"
    adapter = await asyncio.to_thread(_adapter, redis_url, prefix=prefix, quarantine=False)
    try:
        yield adapter
    finally:
        await adapter.aclose()
        await delete_prefix(redis_url, prefix)


class TestSyncMemoryLeases(LeaseContract):
    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def advance(self, clock: ManualClock) -> Advance:
        return clock.advance

    @pytest_asyncio.fixture
    async def lease_provider(self, clock: ManualClock) -> AsyncIterator[AsyncOverSync]:
        adapter = await asyncio.to_thread(_adapter, "memory://", clock=clock)
        yield adapter
        await adapter.aclose()


class TestSyncSqliteLeases(LeaseContract):
    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def advance(self, clock: ManualClock) -> Advance:
        return clock.advance

    @pytest_asyncio.fixture
    async def lease_provider(
        self, tmp_path: Path, clock: ManualClock
    ) -> AsyncIterator[AsyncOverSync]:
        url = f"sqlite:///{tmp_path / 'leases.db'}"
        adapter = await asyncio.to_thread(_adapter, url, clock=clock)
        yield adapter
        await adapter.aclose()


class TestSyncRedisLeases(LeaseContract):
    ttl_ms = 800

    @pytest_asyncio.fixture
    async def lease_provider(self, sync_redis: AsyncOverSync) -> AsyncIterator[AsyncOverSync]:
        yield sync_redis


class TestSyncMemoryPubSub(PubSubContract):
    @pytest_asyncio.fixture
    async def pubsub(self) -> AsyncIterator[AsyncOverSync]:
        adapter = await asyncio.to_thread(_adapter, "memory://")
        yield adapter
        await adapter.aclose()


class TestSyncSqlitePubSub(PubSubContract):
    @pytest_asyncio.fixture
    async def pubsub(self, tmp_path: Path) -> AsyncIterator[AsyncOverSync]:
        adapter = await asyncio.to_thread(_adapter, f"sqlite:///{tmp_path / 'events.db'}")
        yield adapter
        await adapter.aclose()


class TestSyncRedisPubSub(PubSubContract):
    @pytest_asyncio.fixture
    async def pubsub(self, sync_redis: AsyncOverSync) -> AsyncIterator[AsyncOverSync]:
        yield sync_redis
