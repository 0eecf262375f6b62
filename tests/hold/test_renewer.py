"""The renewer alone, on a ManualClock: the deadline's edge, the reasons it gives, how it stops.

Only the renewer's decisions use the injected clock; a call's time limit is
``deadline - sent`` real seconds, so a wide deadline keeps real time out of
what these tests check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from tenure import InvalidArgument, MemoryPubSub
from tenure._renewer import Renewer, renew_timing
from tenure.testing import ManualClock, eventually

from ..support.virtual_time import run_virtual
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


# -- the retry schedule, on virtual time (tests/support/virtual_time.py) -------------


class Timed(Flaky):
    """Notes the loop's (virtual) time of each renew call."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.sent: list[float] = []

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self.sent.append(asyncio.get_running_loop().time())
        return await super().renew_lease(key, owner, ttl_ms)


async def _failing_schedule(
    every: float, deadline: float, *, hang: bool = False
) -> tuple[list[float], float, str | None]:
    """Renew times (from the grant) of renewals that all fail, the loss time and reason."""
    loop = asyncio.get_running_loop()
    async with MemoryPubSub() as backend:
        assert (await backend.acquire_lease("k", "a", 600_000)).acquired
        timed = Timed(backend)
        timed.failing, timed.hanging = not hang, hang
        lost_at: list[float] = []
        renewer = Renewer(
            timed,
            "k",
            "a",
            600_000,
            sent_at=loop.time(),
            every=every,
            deadline=deadline,
            on_lost=lambda _: lost_at.append(loop.time()),
            clock=loop.time,
        )
        start = loop.time()
        renewer.start()
        await renewer.lost.wait()
        await renewer.stop()
    return [round(t - start, 9) for t in timed.sent], round(lost_at[0] - start, 9), renewer.reason


@pytest.mark.parametrize(
    ("every", "deadline", "sent"),
    [
        # The first retry after 25 ms, doubling, never more than half the interval
        # (0.5 s), the last nap cut short by the deadline (2.775 + 0.125 = 2.9).
        (1.0, 2.9, [1.0, 1.025, 1.075, 1.175, 1.375, 1.775, 2.275, 2.775]),
        # A short interval: the first retry after a quarter of it (10 ms), then
        # doubling up to half of it (20 ms).
        (0.04, 0.1, [0.04, 0.05, 0.07, 0.09]),
    ],
)
def test_failed_renewals_are_retried_with_capped_doubling_backoff_until_the_deadline(
    every: float, deadline: float, sent: list[float]
) -> None:
    times, lost_at, reason = run_virtual(_failing_schedule(every, deadline))
    assert times == sent
    assert lost_at == deadline  # given up at the deadline itself, not at the next nap's end
    assert reason is not None and reason.startswith(
        f"no renewal succeeded within the renew deadline of {deadline * 1000:g} ms"
        " (last error: BackendUnavailable("
    )


def test_a_hung_renewal_is_abandoned_at_the_deadline_and_not_retried() -> None:
    times, lost_at, reason = run_virtual(_failing_schedule(1.0, 2.0, hang=True))
    assert times == [1.0]  # the call's time limit is the deadline: no time is left to retry
    assert lost_at == 2.0
    assert reason == (
        "no renewal succeeded within the renew deadline of 2000 ms"
        " (last error: the renew call did not return in time)"
    )


def test_successful_renewals_are_sent_every_interval_from_the_last_send() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        async with MemoryPubSub() as backend:
            assert (await backend.acquire_lease("k", "a", 600_000)).acquired
            timed = Timed(backend)
            renewer = Renewer(
                timed, "k", "a", 600_000, sent_at=0.0, every=0.3, deadline=0.6, clock=loop.time
            )
            renewer.start()
            await asyncio.sleep(1.0)
            assert renewer.running and not renewer.lost.is_set()
            await renewer.stop(final=True)
            assert not renewer.running
        return [round(t, 9) for t in timed.sent]

    assert run_virtual(main()) == [0.3, 0.6, 0.9]


def test_failures_and_the_loss_are_logged_naming_the_lease_and_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tenure.renewer")
    run_virtual(_failing_schedule(0.04, 0.1))
    failed = (
        "renewing lease 'k' of 'a' failed, retrying until the renew deadline: "
        "BackendUnavailable('simulated network error')"
    )
    assert [r.getMessage() for r in caplog.records] == [failed] * 4 + [
        "lease 'k' of 'a' lost: no renewal succeeded within the renew deadline of 100 ms"
        " (last error: BackendUnavailable('simulated network error'))"
    ]
    assert {(r.name, r.levelno) for r in caplog.records} == {("tenure.renewer", logging.WARNING)}


class BadReply(FiveMethodsOnly):
    """``renew_lease`` returns something that cannot be read as a boolean: a bug."""

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        class Unreadable:
            def __bool__(self) -> bool:
                raise RuntimeError("no truth value")

        return Unreadable()  # type: ignore[return-value]


def test_a_bug_in_the_renewal_loses_the_lease_and_logs_the_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> str | None:
        loop = asyncio.get_running_loop()
        async with MemoryPubSub() as backend:
            renewer = Renewer(
                BadReply(backend),
                "k",
                "a",
                600_000,
                sent_at=0.0,
                every=1.0,
                deadline=2.0,
                clock=loop.time,
            )
            renewer.start()
            await renewer.lost.wait()
            assert loop.time() == 1.0  # at the first renewal, not at the deadline
            await eventually(lambda: not renewer.running)
        return renewer.reason

    assert run_virtual(main()) == "the renewal task failed: RuntimeError('no truth value')"
    crash = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in crash] == ["renewal of lease 'k' failed unexpectedly"]
    assert crash[0].exc_info is not None and isinstance(crash[0].exc_info[1], RuntimeError)


def test_the_renewal_task_is_named_after_the_key_and_started_once() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with MemoryPubSub() as backend:
            assert (await backend.acquire_lease("k", "a", 600_000)).acquired
            renewer = Renewer(
                backend, "k", "a", 600_000, sent_at=0.0, every=1.0, deadline=2.0, clock=loop.time
            )
            renewer.start()
            task = renewer._renewals._task
            assert task is not None and task.get_name() == "tenure-renew-'k'"
            renewer.start()  # running: nothing new
            assert renewer._renewals._task is task
            await renewer.stop()
            renewer.lose("revoked")
            renewer.start()  # lost: never again
            assert renewer._renewals._task is None and not renewer.running

    run_virtual(main())


def test_a_stop_that_is_not_final_still_lets_the_lease_be_lost() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with MemoryPubSub() as backend:
            seen: list[str] = []
            renewer = Renewer(
                backend,
                "k",
                "a",
                600_000,
                sent_at=0.0,
                every=1.0,
                deadline=2.0,
                on_lost=seen.append,
                clock=loop.time,
            )
            renewer.start()
            await renewer.stop()  # paused, say for a transfer: not released
            assert not renewer.finished
            await asyncio.sleep(2.0)
            assert not renewer.check() and seen == [
                "no renewal succeeded within the renew deadline of 2000 ms"
            ]

    run_virtual(main())


def test_stop_returns_only_once_the_call_in_flight_was_dropped() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with MemoryPubSub() as backend:
            hanging = Hanging(backend)
            renewer = Renewer(
                hanging, "k", "a", 600_000, sent_at=0.0, every=1.0, deadline=2.0, clock=loop.time
            )
            renewer.start()
            await hanging.called.wait()
            await renewer.stop()
            assert hanging.cancelled.is_set()  # no await needed: stop waited for it
            assert not renewer.running and not renewer.lost.is_set()

    run_virtual(main())


def test_a_refused_renewal_loses_the_lease_at_once_saying_so() -> None:
    async def main() -> tuple[float, str | None, list[float]]:
        loop = asyncio.get_running_loop()
        async with MemoryPubSub() as backend:
            assert (await backend.acquire_lease("k", "a", 600_000)).acquired
            assert await backend.revoke_lease("k")  # an operator took it away
            timed = Timed(backend)
            renewer = Renewer(
                timed, "k", "a", 600_000, sent_at=0.0, every=1.0, deadline=2.0, clock=loop.time
            )
            renewer.start()
            await renewer.lost.wait()
            lost_at = loop.time()
            await renewer.stop()
        return lost_at, renewer.reason, timed.sent

    lost_at, reason, sent = run_virtual(main())
    assert (lost_at, sent) == (1.0, [1.0])  # at the first renewal, not retried
    assert reason == (
        "a renewal was refused: the backend reports the lease is no longer held by its owner"
    )
