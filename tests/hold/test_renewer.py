"""The renewer alone, on a ManualClock: the deadline's edge, the reasons it gives, how it stops.

Only the renewer's decisions use the injected clock; a call's time limit is
``deadline - sent`` real seconds, so a wide deadline keeps real time out of
what these tests check.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from tenure import InvalidArgument, MemoryPubSub
from tenure._renewer import Renewer, renew_timing
from tenure.testing import ManualClock, eventually

from .support import FiveMethodsOnly, Flaky, LateRenewal

DEADLINE_REASON = "no renewal succeeded within the renew deadline of 2000 ms"


class Hanging(FiveMethodsOnly):
    """``renew_lease`` never returns; notes when it is called and when it is cancelled."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.called = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self.called.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")


@pytest_asyncio.fixture
async def memory() -> AsyncIterator[MemoryPubSub]:
    async with MemoryPubSub() as backend:
        assert (await backend.acquire_lease("k", "a", 600_000)).acquired
        yield backend


def _renewer(
    provider: Any,
    clock: ManualClock,
    *,
    every: float = 1.0,
    deadline: float = 2.0,
    on_lost: Callable[[str], None] | None = None,
) -> Renewer:
    return Renewer(
        provider,
        "k",
        "a",
        600_000,
        sent_at=clock(),
        every=every,
        deadline=deadline,
        on_lost=on_lost,
        clock=clock,
    )


@pytest.mark.asyncio
async def test_a_look_at_the_deadline_itself_finds_the_lease_lost(memory: MemoryPubSub) -> None:
    clock = ManualClock()
    renewer = _renewer(memory, clock)  # not started: only the clock decides
    clock.advance_ms(1999)
    assert renewer.check() and not renewer.lost.is_set()
    clock.advance_ms(1)
    assert not renewer.check()
    assert renewer.lost.is_set() and renewer.reason == DEADLINE_REASON


@pytest.mark.asyncio
async def test_a_renewal_started_past_the_deadline_sends_nothing(memory: MemoryPubSub) -> None:
    clock = ManualClock()
    counted = FiveMethodsOnly(memory)
    renewer = _renewer(counted, clock)
    clock.advance_ms(2500)  # the process was stopped before its first renewal
    renewer.start()
    await asyncio.wait_for(renewer.lost.wait(), 5)
    assert renewer.reason == DEADLINE_REASON  # no error to report: nothing was tried
    assert counted.calls["renew_lease"] == 0


@pytest.mark.asyncio
async def test_a_success_seen_exactly_at_the_deadline_is_a_loss(memory: MemoryPubSub) -> None:
    clock = ManualClock()
    late = LateRenewal(memory)
    renewer = _renewer(late, clock)
    clock.advance_ms(1000)  # due: sent at 1 s...
    late.then = lambda: clock.advance_ms(1000)  # ...and its reply seen at 2 s
    renewer.start()
    try:
        await asyncio.wait_for(renewer.lost.wait(), 5)
    finally:
        await renewer.stop()
    assert renewer.reason == f"{DEADLINE_REASON} (last error: the renewal succeeded only after it)"


@pytest.mark.asyncio
async def test_failing_renewals_are_retried_until_the_deadline_itself(memory: MemoryPubSub) -> None:
    clock = ManualClock()
    flaky = Flaky(memory)
    flaky.failing = True
    renewer = _renewer(flaky, clock)
    clock.advance_ms(1000)
    renewer.start()
    try:
        await eventually(lambda: flaky.failures >= 2)  # retried while the clock stands
        assert not renewer.lost.is_set()
        clock.advance_ms(1000)  # exactly the deadline: the next attempt gives up
        await asyncio.wait_for(renewer.lost.wait(), 5)
    finally:
        await renewer.stop()
    reason = renewer.reason or ""
    assert reason.startswith(f"{DEADLINE_REASON} (last error: BackendUnavailable(")
    assert "simulated network error" in reason


@pytest.mark.asyncio
async def test_a_loss_found_by_a_look_abandons_the_renewal_in_flight(memory: MemoryPubSub) -> None:
    clock = ManualClock()
    hanging = Hanging(memory)
    # A 60 s deadline: the call's own time limit (real seconds) is far away.
    renewer = _renewer(hanging, clock, every=30.0, deadline=60.0)
    clock.advance_ms(30_000)
    renewer.start()
    try:
        await asyncio.wait_for(hanging.called.wait(), 5)
        clock.advance_ms(30_000)
        assert not renewer.check()  # a look at the clock declares the loss...
        await asyncio.wait_for(hanging.cancelled.wait(), 5)  # ...and the call is dropped
        await eventually(lambda: not renewer.running)
    finally:
        await renewer.stop()


@pytest.mark.asyncio
async def test_nothing_is_lost_after_a_final_stop(memory: MemoryPubSub) -> None:
    clock = ManualClock()
    seen: list[str] = []
    renewer = _renewer(memory, clock, on_lost=seen.append)
    renewer.start()
    await renewer.stop(final=True)  # released or handed over
    renewer.lose("a late refusal")
    clock.advance_ms(10_000)
    assert renewer.check()
    assert not renewer.lost.is_set() and renewer.reason is None and seen == []
    renewer.start()
    assert not renewer.running  # and it does not start again


# -- renew_timing: the checked (every, deadline) of hold and the runtime -------------


def test_renew_timing_defaults_to_a_third_and_two_thirds_of_the_ttl_in_seconds() -> None:
    assert renew_timing(3_000, None, None) == (1.0, 2.0)
    assert renew_timing(3_000, 1_000, 2_000) == (1.0, 2.0)
    assert renew_timing(3_000, 1, 2) == (0.001, 0.002)  # the smallest whole values
    assert renew_timing(3_000, 0.5, 1) == (0.0005, 0.001)


@pytest.mark.parametrize("name", ["renew_every_ms", "renew_deadline_ms"])
@pytest.mark.parametrize("bad", ["100", True, None, float("nan")])
def test_renew_timing_refuses_what_is_not_a_number_naming_the_option(
    name: str, bad: object
) -> None:
    every: object = bad if name == "renew_every_ms" else 100
    deadline: object = bad if name == "renew_deadline_ms" else 2_000
    if bad is None:  # None is the default, not an error
        renew_timing(3_000, every, deadline)  # type: ignore[arg-type]
        return
    with pytest.raises(InvalidArgument) as refused:
        renew_timing(3_000, every, deadline)  # type: ignore[arg-type]
    assert str(refused.value) == f"{name} must be a number of milliseconds, got {bad!r}"


@pytest.mark.parametrize(
    ("every", "deadline", "message"),
    [
        (None, 0, "renew_deadline_ms must be > 0 and shorter than ttl_ms (3000), got 0"),
        (None, 3_000, "renew_deadline_ms must be > 0 and shorter than ttl_ms (3000), got 3000"),
        (0, 2_000, "renew_every_ms must be > 0 and shorter than renew_deadline_ms (2000), got 0"),
        (
            2_000,
            2_000,
            "renew_every_ms must be > 0 and shorter than renew_deadline_ms (2000), got 2000",
        ),
    ],
)
def test_renew_timing_refuses_bounds_that_do_not_hold(
    every: float | None, deadline: float, message: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        renew_timing(3_000, every, deadline)
    assert str(refused.value) == message
