"""Loss paths of holding, forced: a stalled event loop, a hung renew, a cancelled transfer.

Each test reproduces a way the holder could go on believing it holds a lease
that it may no longer hold, and checks that the holder is told; and the
failure paths around it (a failing transfer, a raising ``on_lost``, a release
cancelled on the way out) leave the lease in a known state. The providers here
wrap a real memory backend and fail one call on purpose: no real fault reaches
these calls at a chosen moment.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

import tenure
from tenure import BackendUnavailable, HeldLease, LeaseLost, MemoryPubSub
from tenure.testing import ManualClock, eventually

from .support import FiveMethodsOnly, Flaky, GatedRelease, stall


class FailingTransfer(FiveMethodsOnly):
    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        self.calls["transfer_lease"] += 1
        raise BackendUnavailable("simulated network error") from OSError("connection reset")


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
        lost_at: list[tuple[float, float, float]] = []

        def on_lost(lease: tenure.HeldLease) -> None:
            renewer = lease._s.renewer
            lost_at.append((time.monotonic(), renewer.deadline, renewer.valid_from))

        lease = await tenure.hold(flaky, "k", "a", ttl_ms=900, on_lost=on_lost).start()
        flaky.hanging = True
        await asyncio.wait_for(lease.lost.wait(), 5)
        # Declared lost at the renew deadline (600 ms after the last successful
        # renewal was sent), not before, and before the TTL counted from that send
        # (the earliest the backend can expire it) with a third of the TTL to spare.
        [(at, deadline, valid_from)] = lost_at
        assert deadline <= at < valid_from + 0.9
        assert "renew deadline" in (lease.lost_reason or "")
        with pytest.raises(LeaseLost):
            lease.ensure_held()
        await lease.release()


@pytest.mark.asyncio
async def test_a_transfer_that_fails_keeps_the_lease_held_and_renewed() -> None:
    async with MemoryPubSub() as memory:
        provider = FailingTransfer(memory)
        lease = await tenure.hold(provider, "k", "a", ttl_ms=300).start()
        try:
            with pytest.raises(BackendUnavailable):
                await lease.transfer_to("b")
            # The outcome is unknown, so the lease is renewed on: three more
            # renewals (more than a TTL), and it is still a's.
            renewed = provider.calls["renew_lease"]
            await eventually(lambda: provider.calls["renew_lease"] >= renewed + 3)
            assert lease.held and not lease.lost.is_set()
            assert await memory.get_lease_owner("k") == "a"
        finally:
            await lease.release()
        assert provider.calls["transfer_lease"] == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["function", "coroutine"])
async def test_an_on_lost_that_raises_is_logged_and_the_loss_still_counts(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="tenure.hold")

    def failing(lease: HeldLease) -> None:
        raise RuntimeError("a bug in on_lost")

    async def failing_later(lease: HeldLease) -> None:
        raise RuntimeError("a bug in on_lost")

    clock = ManualClock()
    async with MemoryPubSub(clock=clock) as memory:
        on_lost = failing if kind == "function" else failing_later
        leases: list[HeldLease] = []
        with pytest.raises(LeaseLost):  # noqa: PT012 - the whole block is what raises
            async with tenure.hold(memory, "k", "a", ttl_ms=300, on_lost=on_lost) as lease:
                leases.append(lease)
                clock.advance_ms(301)  # expired on the backend: the next renewal is refused
                await asyncio.sleep(10)  # cancelled on loss, whatever on_lost did
        [lease] = leases
        assert lease.lost.is_set() and not lease.held
        await eventually(lambda: any("on_lost callback" in r.getMessage() for r in caplog.records))
        [record] = [r for r in caplog.records if "on_lost callback" in r.getMessage()]
        assert record.exc_info is not None and "a bug in on_lost" in str(record.exc_info[1])


@pytest.mark.asyncio
async def test_a_release_cancelled_on_the_way_out_still_happens() -> None:
    async with MemoryPubSub() as memory:
        provider = GatedRelease(memory)

        async def body() -> None:
            async with tenure.hold(provider, "k", "a", ttl_ms=10_000):
                pass

        task = asyncio.create_task(body())
        await asyncio.wait_for(provider.releasing.wait(), 5)
        task.cancel()  # while the release on exit is in flight
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await memory.get_lease_owner("k") == "a"  # not released yet...
        provider.gate.set()
        await asyncio.wait_for(provider.released.wait(), 5)  # ...but it carries on
        assert await memory.get_lease_owner("k") is None
