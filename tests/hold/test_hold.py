"""``tenure.hold`` on the in-memory backend: renewal, loss, release, transfer, leaks."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import tenure
from tenure import (
    HeldLease,
    InvalidArgument,
    LeaseLost,
    LeaseUnavailable,
    MemoryPubSub,
    NoopLeaseProvider,
)
from tenure.testing import ManualClock, eventually

from .support import FiveMethodsOnly, Flaky


@pytest_asyncio.fixture
async def memory() -> AsyncIterator[MemoryPubSub]:
    async with MemoryPubSub() as backend:
        yield backend


@pytest.mark.asyncio
async def test_hold_renews_past_the_ttl_and_releases_on_exit(memory: MemoryPubSub) -> None:
    # TTLs in these real-time tests are generous: the machine may be loaded.
    async with tenure.hold(memory, "k", "a", 1200) as lease:
        granted = await memory.get_lease("k")
        assert granted is not None and lease.token == granted.token
        await asyncio.sleep(2.0)  # more than a TTL: only renewal keeps it
        record = await memory.get_lease("k")
        assert record is not None
        assert (record.owner, record.token) == ("a", lease.token)
        assert lease.held and not lease.lost.is_set()
        lease.ensure_held()
    assert await memory.get_lease_owner("k") is None
    assert not lease.held and not lease.lost.is_set()
    with pytest.raises(LeaseLost):
        lease.ensure_held()


@pytest.mark.asyncio
async def test_hold_of_a_held_key_raises_naming_the_holder(memory: MemoryPubSub) -> None:
    await memory.acquire_lease("k", "the-holder", 10_000)
    with pytest.raises(LeaseUnavailable, match="the-holder") as info:
        async with tenure.hold(memory, "k", "b", 10_000):
            pytest.fail("the body must not run")
    assert isinstance(info.value, tenure.TenureError)
    assert (info.value.key, info.value.holder) == ("k", "the-holder")


@pytest.mark.asyncio
async def test_hold_of_a_received_lease_keeps_its_token(memory: MemoryPubSub) -> None:
    first = await memory.acquire_lease("k", "a", 10_000)
    assert await memory.transfer_lease("k", "a", "b", 10_000)
    received = await memory.get_lease("k")
    assert received is not None and received.token > (first.token or 0)
    async with tenure.hold(memory, "k", "b", 10_000) as lease:
        assert lease.token == received.token


@pytest.mark.asyncio
async def test_an_exception_in_the_body_releases_the_lease(memory: MemoryPubSub) -> None:
    async def failing() -> None:
        async with tenure.hold(memory, "k", "a", 10_000):
            assert await memory.get_lease_owner("k") == "a"
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await failing()
    assert await memory.get_lease_owner("k") is None


@pytest.mark.asyncio
async def test_cancelling_the_body_releases_the_lease(memory: MemoryPubSub) -> None:
    entered = asyncio.Event()

    async def body() -> None:
        async with tenure.hold(memory, "k", "a", 10_000):
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(body())
    await entered.wait()
    assert await memory.get_lease_owner("k") == "a"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await memory.get_lease_owner("k") is None


@pytest.mark.asyncio
async def test_a_refused_renewal_cancels_the_body_and_raises_lease_lost(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    seen: list[HeldLease] = []
    leases: list[HeldLease] = []
    reached_end = False

    async def body() -> int | None:
        nonlocal reached_end
        async with tenure.hold(manual, "k", "a", 300, on_lost=seen.append) as lease:
            leases.append(lease)
            clock.advance_ms(301)  # the backend expires the lease...
            taken = await manual.acquire_lease("k", "b", 60_000)  # ...and b takes over
            assert taken.acquired
            await asyncio.sleep(10)  # the next renewal is refused: this is cancelled
            reached_end = True
        return taken.token

    with pytest.raises(LeaseLost) as info:
        await body()
    assert not reached_end
    [lease] = leases
    assert info.value.key == "k" and info.value.owner == "a"
    assert seen == [lease]
    assert lease.lost.is_set() and not lease.held
    assert "no longer held" in (lease.lost_reason or "")
    # Leaving the block released nothing of b's.
    record = await manual.get_lease("k")
    assert record is not None and record.owner == "b" and record.token > (lease.token or 0)


@pytest.mark.asyncio
async def test_without_cancel_on_loss_the_loss_is_only_signalled(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    called = asyncio.Event()
    leases: list[HeldLease] = []

    async def on_lost(lease: HeldLease) -> None:
        called.set()

    async def body() -> str:
        async with tenure.hold(
            manual, "k", "a", 300, on_lost=on_lost, cancel_on_loss=False
        ) as lease:
            leases.append(lease)
            clock.advance_ms(301)
            await asyncio.wait_for(lease.lost.wait(), 10)
            await asyncio.wait_for(called.wait(), 10)
            with pytest.raises(LeaseLost, match="no longer held"):
                lease.ensure_held()
            await asyncio.sleep(0.05)  # a cancellation of the body would land here
            return "ran to the end"

    # Neither cancelled nor LeaseLost on exit: the body ran on after the loss.
    [outcome] = await asyncio.gather(body(), return_exceptions=True)
    assert outcome == "ran to the end"
    [lease] = leases
    assert lease.lost.is_set() and not lease.held


@pytest.mark.asyncio
async def test_a_stalled_event_loop_is_seen_as_a_loss_without_the_renewal_task(
    memory: MemoryPubSub,
) -> None:
    async with tenure.hold(memory, "k", "a", 300, cancel_on_loss=False) as lease:
        # Deliberately blocking, right after the grant: past the renew deadline
        # (200 ms) but within the TTL (300 ms), so a holder that counted to the
        # TTL would still think it held the lease. Nothing can renew meanwhile.
        time.sleep(0.25)  # noqa: ASYNC251
        assert not lease.held
        assert lease.lost.is_set()
        with pytest.raises(LeaseLost, match="renew deadline"):
            lease.ensure_held()


@pytest.mark.asyncio
async def test_failing_renewals_are_retried_and_the_lease_kept_before_the_deadline(
    memory: MemoryPubSub,
) -> None:
    flaky = Flaky(memory)
    async with tenure.hold(flaky, "k", "a", 3000) as lease:
        flaky.failing = True
        await eventually(lambda: flaky.failures >= 2)
        flaky.failing = False
        await asyncio.sleep(2.5)  # several renewals later
        assert lease.held and not lease.lost.is_set()
        assert flaky.calls["renew_lease"] >= 1
    assert await memory.get_lease_owner("k") is None


@pytest.mark.asyncio
async def test_renewals_failing_past_the_deadline_lose_the_lease(memory: MemoryPubSub) -> None:
    flaky = Flaky(memory)

    async def body() -> None:
        async with tenure.hold(flaky, "k", "a", 300):
            flaky.failing = True
            await asyncio.sleep(10)

    with pytest.raises(LeaseLost, match="renew deadline") as info:
        await body()
    assert "simulated network error" in info.value.reason
    assert flaky.failures >= 2  # it was retried, not given up on the first error


@pytest.mark.asyncio
async def test_a_hanging_renewal_loses_the_lease_at_the_deadline(memory: MemoryPubSub) -> None:
    flaky = Flaky(memory)
    async with tenure.hold(flaky, "k", "a", 300, cancel_on_loss=False) as lease:
        flaky.hanging = True
        await asyncio.wait_for(lease.lost.wait(), 10)
    assert flaky.hangs >= 1
    assert "did not return in time" in (lease.lost_reason or "")


@pytest.mark.asyncio
async def test_a_closed_backend_loses_the_lease(memory: MemoryPubSub) -> None:
    backend = MemoryPubSub()
    lease = await tenure.hold(backend, "k", "a", 300).start()
    await backend.aclose()
    await asyncio.wait_for(lease.lost.wait(), 10)
    assert lease.lost_reason == "the backend was closed"
    with pytest.raises(tenure.BackendClosed):
        await lease.release()


@pytest.mark.asyncio
async def test_transfer_hands_over_and_stops_renewing(memory: MemoryPubSub) -> None:
    counted = FiveMethodsOnly(memory)
    async with tenure.hold(counted, "k", "a", 300) as lease:
        assert await lease.transfer_to("b", ttl_ms=10_000)
        assert not lease.held and not lease.lost.is_set()
        record = await memory.get_lease("k")
        assert record is not None and record.owner == "b"
        assert lease.token is not None and record.token > lease.token
        assert await lease.transfer_to("c") is False  # nothing left to hand over
        renewed = counted.calls["renew_lease"]
        async with tenure.hold(memory, "k", "b", 10_000) as received:
            assert received.token == record.token
            await asyncio.sleep(0.4)  # four of a's renew intervals
            assert counted.calls["renew_lease"] == renewed  # a renews nothing any more
            assert not lease.lost.is_set()
    assert await memory.get_lease_owner("k") is None


@pytest.mark.asyncio
async def test_transfer_of_a_lease_taken_over_fails_and_marks_it_lost(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    lease = await tenure.hold(manual, "k", "a", 10_000).start()
    try:
        clock.advance_ms(10_001)
        assert (await manual.acquire_lease("k", "c", 10_000)).acquired
        assert await lease.transfer_to("b") is False
        assert lease.lost.is_set()
        assert await manual.get_lease_owner("k") == "c"
    finally:
        await lease.release()


@pytest.mark.asyncio
async def test_start_and_release_hold_a_lease_across_tasks(memory: MemoryPubSub) -> None:
    lease = await asyncio.create_task(tenure.hold(memory, "k", "a", 900).start())
    await asyncio.sleep(1.2)
    assert lease.held and await memory.get_lease_owner("k") == "a"
    await asyncio.create_task(lease.release())
    await lease.release()  # idempotent
    assert await memory.get_lease_owner("k") is None and not lease.held


@pytest.mark.asyncio
async def test_a_leaked_lease_warns_and_is_released(memory: MemoryPubSub) -> None:
    leases = [await tenure.hold(memory, "k", "a", 10_000).start()]
    with pytest.warns(ResourceWarning, match="without release"):
        _drop(leases)
    await eventually(lambda: not memory._leases)
    assert await memory.get_lease_owner("k") is None


@pytest.mark.asyncio
async def test_the_noop_provider_can_be_held(memory: MemoryPubSub) -> None:
    async with tenure.hold(NoopLeaseProvider(), "k", "a", 300) as lease:
        await asyncio.sleep(0.4)
        assert lease.held and lease.token is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"renew_deadline_ms": 1000},
            "renew_deadline_ms must be > 0 and shorter than ttl_ms (1000), got 1000",
        ),
        (
            {"renew_deadline_ms": 0},
            "renew_deadline_ms must be > 0 and shorter than ttl_ms (1000), got 0",
        ),
        (
            {"renew_every_ms": 700},
            "renew_every_ms must be > 0 and shorter than renew_deadline_ms (666.667), got 700",
        ),
        ({"renew_every_ms": True}, "renew_every_ms must be a number of milliseconds, got True"),
        ({"on_lost": 3}, "on_lost must be callable, got int"),
        ({"wait": -1}, "wait must be a finite number of seconds >= 0, got -1"),
        ({"wait": "soon"}, "wait must be a number of seconds, got str"),
        ({"key": ""}, "key must not be empty"),
        ({"owner": ""}, "owner must not be empty"),
        ({"ttl_ms": 0}, "ttl_ms must be between 1 and 2147483647 milliseconds, got 0"),
    ],
)
@pytest.mark.asyncio
async def test_bad_options_are_rejected_before_any_call(
    memory: MemoryPubSub, options: dict[str, Any], message: str
) -> None:
    counted = FiveMethodsOnly(memory)
    arguments: dict[str, Any] = {"key": "k", "owner": "a", "ttl_ms": 1000, **options}
    with pytest.raises(InvalidArgument) as info:
        tenure.hold(counted, **arguments)
    assert str(info.value) == message
    assert not counted.calls


def _drop(objects: list[HeldLease]) -> None:
    objects.clear()
    gc.collect()
