"""``acquire_wait`` on every backend, and its fallbacks for providers without extensions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import tenure
from tenure import InvalidArgument, LeaseUnavailable, MemoryPubSub
from tenure.testing import eventually

from ..support.waiting import asleep, until_parked
from .support import Counting, FiveMethodsOnly, WithGetLease


@pytest_asyncio.fixture
async def backend(backend_url: str) -> AsyncIterator[Any]:
    async with tenure.from_url(backend_url) as b:
        yield b


@pytest.mark.asyncio
async def test_a_free_key_is_granted_at_once(backend: Any) -> None:
    result = await tenure.acquire_wait(backend, "k", "a", 10_000, timeout=0)
    assert result.acquired and result.owner == "a" and result.token is not None
    assert await backend.get_lease_owner("k") == "a"


@pytest.mark.asyncio
async def test_timeout_raises_naming_the_holder(backend: Any) -> None:
    await backend.acquire_lease("k", "the-holder", 30_000)
    with pytest.raises(LeaseUnavailable, match="the-holder") as info:
        await tenure.acquire_wait(backend, "k", "b", 10_000, timeout=0.3)
    assert info.value.holder == "the-holder" and info.value.key == "k"
    assert await backend.get_lease_owner("k") == "the-holder"


@pytest.mark.asyncio
async def test_a_release_wakes_the_waiter_long_before_the_ttl(backend: Any) -> None:
    holder = await backend.acquire_lease("k", "a", 60_000)
    waiter = asyncio.create_task(tenure.acquire_wait(backend, "k", "b", 10_000, timeout=20))
    await until_parked(backend, "k")  # refused, looked, asleep
    assert not waiter.done()
    await backend.release_lease("k", "a")
    # Only a wake-up can grant it: the released lease had 60 s left, the wait 20 s.
    result = await waiter
    assert result.acquired and result.owner == "b"
    assert result.token is not None and holder.token is not None and result.token > holder.token


@pytest.mark.asyncio
async def test_a_dead_holder_is_replaced_when_its_ttl_ends(backend: Any) -> None:
    await backend.acquire_lease("k", "dead", 500)  # never renewed nor released
    result = await tenure.acquire_wait(backend, "k", "b", 10_000, timeout=20)
    assert result.acquired and result.owner == "b"


@pytest.mark.asyncio
async def test_a_release_wakes_one_waiter_of_the_process(backend: Any) -> None:
    counted = Counting(backend)
    await backend.acquire_lease("k", "first", 60_000)
    waiters = {
        f"w{i}": asyncio.create_task(tenure.acquire_wait(counted, "k", f"w{i}", 60_000, timeout=30))
        for i in range(4)
    }
    try:
        # All four parked (refused, looked, asleep), so the release below cannot be
        # seen by a look instead of waking a waiter.
        await until_parked(backend, "k", 4)
        holder = "first"
        for left in range(3, -1, -1):
            before = counted.calls["acquire_lease"]
            await backend.release_lease("k", holder)
            await eventually(lambda: any(t.done() for t in waiters.values()))
            # A herd would have woken the others (no longer registered) and sent them
            # to acquire again before they park again: wait until they are all back.
            await eventually(lambda: asleep(backend) == left)  # noqa: B023 - used at once
            await until_parked(backend, "k", left)
            done = [name for name, t in waiters.items() if t.done()]
            assert len(done) == 1
            holder = done[0]
            assert waiters.pop(holder).result().owner == holder
            # The winner's acquire, and no one else's: the others kept sleeping.
            assert counted.calls["acquire_lease"] - before == 1
        await backend.release_lease("k", holder)
    finally:
        for task in waiters.values():
            task.cancel()
        await asyncio.gather(*waiters.values(), return_exceptions=True)


@pytest.mark.asyncio
async def test_a_cancelled_waiter_passes_its_wake_up_on(backend: Any) -> None:
    await backend.acquire_lease("k", "a", 60_000)
    first = asyncio.create_task(tenure.acquire_wait(backend, "k", "b", 10_000, timeout=30))
    await until_parked(backend, "k")
    second = asyncio.create_task(tenure.acquire_wait(backend, "k", "c", 10_000, timeout=30))
    await until_parked(backend, "k", 2)  # both parked, first one first
    first.cancel()
    await backend.release_lease("k", "a")
    with pytest.raises(asyncio.CancelledError):
        await first
    assert (await second).owner == "c"


@pytest.mark.asyncio
async def test_without_extensions_the_waiter_backs_off_instead_of_polling() -> None:
    async with MemoryPubSub() as memory:
        bare = FiveMethodsOnly(memory)
        await memory.acquire_lease("k", "a", 60_000)
        with pytest.raises(LeaseUnavailable):
            await tenure.acquire_wait(bare, "k", "b", 10_000, timeout=1.0)
        # Backoff doubles from 25 ms up to 1 s: a handful of attempts in a second.
        assert 2 <= bare.calls["acquire_lease"] <= 8
        await memory.release_lease("k", "a")
        assert (await tenure.acquire_wait(bare, "k", "b", 10_000, timeout=5)).acquired


class Refusing(FiveMethodsOnly):
    """Refuses every grant without naming a holder, like Redis in quarantine after a restart."""

    capabilities = tenure.Capability.RECORD | tenure.Capability.RELEASE_WAKEUPS

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> tenure.AcquireResult:
        self.calls["acquire_lease"] += 1
        return tenure.AcquireResult(False, None, None)

    async def get_lease(self, key: str) -> tenure.LeaseRecord | None:
        return None

    async def wait_lease_released(self, key: str, timeout: float) -> bool:
        return True  # no live lease: returns at once


@pytest.mark.asyncio
async def test_refusals_without_a_visible_lease_back_off() -> None:
    async with MemoryPubSub() as memory:
        refusing = Refusing(memory)
        with pytest.raises(LeaseUnavailable) as info:
            await tenure.acquire_wait(refusing, "k", "b", 10_000, timeout=1.0)
        assert info.value.holder is None
        assert 2 <= refusing.calls["acquire_lease"] <= 8


@pytest.mark.asyncio
async def test_with_get_lease_only_the_waiter_sleeps_until_the_ttl_ends() -> None:
    async with MemoryPubSub() as memory:
        provider = WithGetLease(memory)
        await memory.acquire_lease("k", "a", 600)
        result = await tenure.acquire_wait(provider, "k", "b", 10_000, timeout=20)
        assert result.owner == "b"
        # One failed attempt, one sleep of the remaining TTL, then the grant (a
        # clock edge may cost one more round).
        assert provider.calls["acquire_lease"] <= 3


@pytest.mark.asyncio
async def test_hold_can_wait_for_the_lease() -> None:
    async with MemoryPubSub() as memory:
        await memory.acquire_lease("k", "a", 60_000)
        waiting = asyncio.create_task(_hold_briefly(memory))
        await until_parked(memory, "k")
        assert not waiting.done()
        await memory.release_lease("k", "a")
        assert await waiting == "b"
        assert await memory.get_lease_owner("k") is None


async def _hold_briefly(memory: MemoryPubSub) -> str:
    async with tenure.hold(memory, "k", "b", 1000, wait=20) as lease:
        return lease.owner


@pytest.mark.asyncio
async def test_arguments_are_checked_before_any_call() -> None:
    async with MemoryPubSub() as memory:
        bare = FiveMethodsOnly(memory)
        cases: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
            (("", "a", 1000), {"timeout": 1}, "key"),
            (("k", "", 1000), {"timeout": 1}, "owner"),
            (("k", "a", 0), {"timeout": 1}, "ttl_ms"),
            (("k", "a", 1000), {"timeout": -1}, "timeout"),
            (("k", "a", 1000), {"timeout": float("nan")}, "timeout"),
        ]
        for args, kwargs, message in cases:
            with pytest.raises(InvalidArgument, match=message):
                await tenure.acquire_wait(bare, *args, **kwargs)
        assert not bare.calls
