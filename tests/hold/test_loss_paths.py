"""Loss paths of holding, forced: a stalled event loop, a hung renew, a cancelled transfer.

Each test reproduces a way the holder could go on believing it holds a lease
that it may no longer hold, and checks that the holder is told.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import tenure
from tenure import LeaseLost, MemoryPubSub

from .support import FiveMethodsOnly, Flaky, stall


class HangingTransfer(FiveMethodsOnly):
    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.mark.asyncio
async def test_a_loss_noticed_by_another_task_cancels_the_body() -> None:
    async with MemoryPubSub() as memory:
        flaky = Flaky(memory)
        ran_on = False
        noticed: list[bool] = []
        with pytest.raises(LeaseLost):  # noqa: PT012 - the whole block is what raises
            async with tenure.hold(flaky, "k", "a", ttl_ms=300) as lease:

                async def look() -> None:
                    while lease.held:  # noqa: ASYNC110 - polling ``held`` is the point
                        await asyncio.sleep(0.01)
                    noticed.append(True)

                watcher = asyncio.create_task(look())
                flaky.hanging = True
                stall(0.35)  # the process stalls past the 200 ms renew deadline
                await asyncio.sleep(0.6)
                ran_on = True
        await watcher
        assert noticed == [True]
        assert not ran_on
        assert lease.lost.is_set()


@pytest.mark.asyncio
async def test_a_body_that_ends_after_its_renew_deadline_raises_lease_lost() -> None:
    async with MemoryPubSub() as memory:
        with pytest.raises(LeaseLost, match="renew deadline"):
            async with tenure.hold(memory, "k", "a", ttl_ms=300) as lease:
                stall(0.25)  # past the 200 ms deadline, before any renewal could run
        assert lease.lost.is_set()


@pytest.mark.asyncio
async def test_a_body_that_ends_in_time_does_not_raise() -> None:
    async with MemoryPubSub() as memory:
        async with tenure.hold(memory, "k", "a", ttl_ms=300) as lease:
            stall(0.15)  # stalls, but within the 200 ms deadline
        assert not lease.lost.is_set()


@pytest.mark.asyncio
async def test_a_cancelled_transfer_leaves_the_lease_handed_over_or_still_renewed() -> None:
    async with MemoryPubSub() as memory:
        lease = await tenure.hold(memory, "k", "a", ttl_ms=300).start()
        task = asyncio.create_task(lease.transfer_to("b"))
        await asyncio.sleep(0)  # the transfer is under way
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if await memory.get_lease_owner("k") == "b":
            assert not lease.held  # handed over: no longer ours, and not renewed
            return
        await asyncio.sleep(0.7)  # more than two TTLs
        assert await memory.get_lease_owner("k") == "a" or lease.lost.is_set()
        await lease.release()


@pytest.mark.asyncio
async def test_a_hung_transfer_cancelled_keeps_the_lease_renewed() -> None:
    async with MemoryPubSub() as memory:
        provider = HangingTransfer(memory)
        lease = await tenure.hold(provider, "k", "a", ttl_ms=300).start()
        task = asyncio.create_task(lease.transfer_to("b"))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.7)
        assert await memory.get_lease_owner("k") == "a"
        assert lease.held
        await lease.release()


@pytest.mark.asyncio
async def test_a_hung_renew_is_abandoned_at_the_deadline() -> None:
    async with MemoryPubSub() as memory:
        flaky = Flaky(memory)
        lease = await tenure.hold(flaky, "k", "a", ttl_ms=300).start()
        flaky.hanging = True
        started = time.monotonic()
        await asyncio.wait_for(lease.lost.wait(), 2)
        # Lost within the 200 ms deadline of the last renewal (itself at most 100 ms old).
        assert time.monotonic() - started < 0.25
        assert "renew deadline" in (lease.lost_reason or "")
        with pytest.raises(LeaseLost):
            lease.ensure_held()
        await lease.release()
