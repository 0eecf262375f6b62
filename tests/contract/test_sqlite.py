"""The contract suite against the SQLite backend, on a real file, on real and on manual time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tenure import from_url
from tenure.backends.sqlite import SqlitePubSub
from tenure.testing import Advance, LeaseContract, ManualClock, PubSubContract
from tests.support.targets import BackendTarget

TARGET = BackendTarget(
    "sqlite", isolated_url=lambda unique, tmp_path: f"sqlite:///{tmp_path / f'{unique}.db'}"
)


class TestSqliteLeasesRealTime(LeaseContract):
    ttl_ms = 400

    @pytest_asyncio.fixture
    async def lease_provider(self, tmp_path: Path) -> AsyncIterator[SqlitePubSub]:
        async with from_url(f"sqlite:///{tmp_path / 'leases.db'}") as backend:
            assert isinstance(backend, SqlitePubSub)
            yield backend


class TestSqliteLeasesManualClock(LeaseContract):
    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def advance(self, clock: ManualClock) -> Advance:
        return clock.advance

    @pytest_asyncio.fixture
    async def lease_provider(
        self, tmp_path: Path, clock: ManualClock
    ) -> AsyncIterator[SqlitePubSub]:
        async with SqlitePubSub(tmp_path / "leases.db", clock=clock) as backend:
            yield backend


class TestSqlitePubSub(PubSubContract):
    @pytest_asyncio.fixture
    async def pubsub(self, tmp_path: Path) -> AsyncIterator[SqlitePubSub]:
        async with SqlitePubSub(tmp_path / "events.db") as backend:
            yield backend
