"""Fixtures shared by the hold tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tenure import MemoryPubSub
from tenure.testing import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest_asyncio.fixture
async def manual(clock: ManualClock) -> AsyncIterator[MemoryPubSub]:
    """Memory on a manual clock: a lease expires there only when the test moves the clock."""
    async with MemoryPubSub(clock=clock) as backend:
        yield backend
