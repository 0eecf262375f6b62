"""``tenure.hold`` against every backend: renewal, release on exit, cancellation, transfer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import tenure


@pytest_asyncio.fixture
async def backend(backend_url: str) -> AsyncIterator[Any]:
    async with tenure.from_url(backend_url) as b:
        yield b


@pytest.mark.asyncio
async def test_hold_keeps_the_lease_past_its_ttl_and_releases_on_exit(backend: Any) -> None:
    async with tenure.hold(backend, "k", "a", 1500) as lease:
        await asyncio.sleep(2.0)
        record = await backend.get_lease("k")
        assert record is not None and (record.owner, record.token) == ("a", lease.token)
        assert lease.held
    assert await backend.get_lease_owner("k") is None


@pytest.mark.asyncio
async def test_an_exception_or_a_cancellation_releases(backend: Any) -> None:
    async def failing() -> None:
        async with tenure.hold(backend, "k", "a", 60_000):
            raise KeyError("k")

    with pytest.raises(KeyError):
        await failing()
    assert await backend.get_lease_owner("k") is None

    entered = asyncio.Event()

    async def body() -> None:
        async with tenure.hold(backend, "k", "a", 60_000):
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await backend.get_lease_owner("k") is None


@pytest.mark.asyncio
async def test_loss_to_another_owner_is_detected(backend: Any) -> None:
    leases: list[tenure.HeldLease] = []

    async def body() -> None:
        async with tenure.hold(backend, "k", "a", 900) as lease:
            leases.append(lease)
            # Another process's view: the lease moved on (as after an expiry).
            assert await backend.transfer_lease("k", "a", "b", 60_000)
            await asyncio.sleep(10)

    with pytest.raises(tenure.LeaseLost):
        await body()
    assert "no longer held" in (leases[0].lost_reason or "")
    assert await backend.get_lease_owner("k") == "b"


@pytest.mark.asyncio
async def test_transfer_to_hands_over_and_the_receiver_keeps_the_token(backend: Any) -> None:
    async with tenure.hold(backend, "k", "a", 1500) as lease:
        assert await lease.transfer_to("b")
    record = await backend.get_lease("k")
    assert record is not None and record.owner == "b"
    assert lease.token is not None and record.token > lease.token
    async with tenure.hold(backend, "k", "b", 1500) as received:
        assert received.token == record.token
        await asyncio.sleep(0.8)
    assert await backend.get_lease_owner("k") is None
