"""The contract suite against the in-memory backend, on real and on manual time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tenure import MemoryPubSub, from_url
from tenure.testing import Advance, LeaseContract, ManualClock, PubSubContract
from tests.support.targets import BackendTarget

TARGET = BackendTarget("memory", isolated_url=lambda unique, tmp_path: "memory://")


class TestMemoryLeasesRealTime(LeaseContract):
    ttl_ms = 400

    @pytest_asyncio.fixture
    async def lease_provider(self) -> AsyncIterator[MemoryPubSub]:
        async with from_url("memory://") as backend:
            assert isinstance(backend, MemoryPubSub)
            yield backend


class TestMemoryLeasesManualClock(LeaseContract):
    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def advance(self, clock: ManualClock) -> Advance:
        return clock.advance

    @pytest_asyncio.fixture
    async def lease_provider(self, clock: ManualClock) -> AsyncIterator[MemoryPubSub]:
        async with MemoryPubSub(clock=clock) as backend:
            yield backend


class TestMemoryPubSub(PubSubContract):
    @pytest_asyncio.fixture
    async def pubsub(self) -> AsyncIterator[MemoryPubSub]:
        async with MemoryPubSub() as backend:
            yield backend
