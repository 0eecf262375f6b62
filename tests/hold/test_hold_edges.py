"""``hold`` at its edges: what it says, what it leaves behind, and how its block ends.

What a user reads is checked word for word: ``repr``, the ``LeaseLost`` raised
by ``ensure_held``, the refusal of a second ``start()``, the log lines of a
failed release or a raising ``on_lost``, the ``ResourceWarning`` of a dropped
lease and the names of the tasks ``hold`` starts. Then how the ``async with``
block ends when the loss meets another event: a body that swallows or
replaces the cancellation, an outside cancellation, a loss noticed while the
block is already exiting, a renewal's refusal that comes back while the lease
is being released.

The loss is made real on a memory backend on a ``ManualClock``: the lease
expires there, another owner takes the key, and a ``transfer_to`` (the
backend refuses it) tells the holder, in the test's own task, at a known
point. The background tasks (``on_lost`` coroutines, releases) are looked at
through weak references: the loop keeps only weak references to tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import weakref
from typing import Any

import pytest

import tenure
import tenure._hold
from tenure import (
    BackendClosed,
    HeldLease,
    InvalidArgument,
    LeaseLost,
    LeaseUnavailable,
    MemoryPubSub,
)
from tenure.testing import ManualClock, eventually

from ..support.waiting import until_parked
from .support import FiveMethodsOnly, GatedRelease, GatedRenewal, stall

TAKEN_OVER = "the transfer found the lease no longer held by its owner"


async def _lose(backend: MemoryPubSub, clock: ManualClock, lease: HeldLease) -> None:
    """Expire ``lease`` on the backend, let ``b`` take the key; this task then finds it lost."""
    clock.advance_ms(lease.ttl_ms + 1)
    assert (await backend.acquire_lease(lease.key, "b", 600_000)).acquired
    assert await lease.transfer_to("c") is False


class NamedCalls(FiveMethodsOnly):
    """Notes the name of the task each ``release_lease`` runs in (what a task dump shows)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.release_tasks: list[str] = []

    async def release_lease(self, key: str, owner: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.release_tasks.append(task.get_name())
        await super().release_lease(key, owner)


def _collected(ref: weakref.ref[Any]) -> bool:
    gc.collect()
    return ref() is None


def _drop(objects: list[HeldLease]) -> None:
    objects.clear()
    gc.collect()


# -- what it says ------------------------------------------------------------


@pytest.mark.asyncio
async def test_repr_names_the_lease_and_its_state(manual: MemoryPubSub, clock: ManualClock) -> None:
    lease = await tenure.hold(manual, "k", "a", 10_000).start()
    token = lease.token
    assert token is not None
    assert repr(lease) == f"HeldLease(key='k', owner='a', token={token}, held)"
    await _lose(manual, clock, lease)
    assert repr(lease) == f"HeldLease(key='k', owner='a', token={token}, lost)"
    await lease.release()  # released after the loss: released wins
    assert repr(lease) == f"HeldLease(key='k', owner='a', token={token}, released)"
    handed = await tenure.hold(manual, "k2", "a", 10_000).start()
    assert await handed.transfer_to("b")
    assert repr(handed) == f"HeldLease(key='k2', owner='a', token={handed.token}, released)"


@pytest.mark.asyncio
async def test_ensure_held_names_the_lease_and_why(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    lease = await tenure.hold(manual, "k", "a", 10_000).start()
    await _lose(manual, clock, lease)
    assert lease.lost_reason == TAKEN_OVER
    with pytest.raises(LeaseLost) as lost:
        lease.ensure_held()
    assert (lost.value.key, lost.value.owner, lost.value.reason) == ("k", "a", TAKEN_OVER)
    await lease.release()
    released = await tenure.hold(manual, "k2", "o", 10_000).start()
    await released.release()
    with pytest.raises(LeaseLost) as gone:
        released.ensure_held()
    assert (gone.value.key, gone.value.owner) == ("k2", "o")
    assert str(gone.value) == "lease 'k2' held by 'o' was lost: it was released or transferred"


@pytest.mark.asyncio
async def test_a_second_start_of_one_hold_is_refused_saying_what_to_do(
    manual: MemoryPubSub,
) -> None:
    holding = tenure.hold(manual, "k", "a", 10_000)
    lease = await holding.start()
    with pytest.raises(RuntimeError) as info:
        await holding.start()
    assert str(info.value) == "this hold() was already started; call hold() again"
    await lease.release()


@pytest.mark.asyncio
async def test_wait_zero_tries_once_and_names_the_holder(manual: MemoryPubSub) -> None:
    await manual.acquire_lease("k", "the-holder", 10_000)
    counted = FiveMethodsOnly(manual)
    with pytest.raises(LeaseUnavailable) as info:
        await tenure.hold(counted, "k", "a", 10_000).start()
    # No "gave up after waiting": nothing was waited for.
    assert str(info.value) == "lease 'k' is held by 'the-holder'"
    assert counted.calls["acquire_lease"] == 1


@pytest.mark.asyncio
async def test_a_wait_gives_up_after_that_long_naming_the_holder(manual: MemoryPubSub) -> None:
    await manual.acquire_lease("k", "the-holder", 10_000)  # on the manual clock: held throughout
    with pytest.raises(LeaseUnavailable) as info:
        await asyncio.wait_for(tenure.hold(manual, "k", "a", 10_000, wait=0.05).start(), 30)
    assert str(info.value) == "lease 'k' is held by 'the-holder'; gave up after waiting 0.05 s"
    assert info.value.holder == "the-holder"


@pytest.mark.asyncio
async def test_wait_none_waits_until_the_holder_lets_go(manual: MemoryPubSub) -> None:
    await manual.acquire_lease("k", "the-holder", 10_000)  # on the manual clock: until released
    waiting = asyncio.create_task(tenure.hold(manual, "k", "a", 10_000, wait=None).start())
    await until_parked(manual, "k")  # refused once, now waiting for a release
    assert not waiting.done()
    await manual.release_lease("k", "the-holder")
    lease = await asyncio.wait_for(waiting, 10)
    assert lease.held and await manual.get_lease_owner("k") == "a"
    await lease.release()


@pytest.mark.asyncio
async def test_transfer_to_checks_the_new_owner_by_name(manual: MemoryPubSub) -> None:
    lease = await tenure.hold(manual, "k", "a", 10_000).start()
    with pytest.raises(InvalidArgument) as empty:
        await lease.transfer_to("")
    assert str(empty.value) == "new_owner must not be empty"
    with pytest.raises(InvalidArgument) as number:
        await lease.transfer_to(7)  # type: ignore[arg-type]
    assert str(number.value) == "new_owner must be a str, got int"
    assert lease.held and await manual.get_lease_owner("k") == "a"
    await lease.release()


@pytest.mark.asyncio
async def test_transfer_to_gives_the_new_owner_the_ttl_asked_for(manual: MemoryPubSub) -> None:
    lease = await tenure.hold(manual, "k", "a", 10_000).start()
    assert await lease.transfer_to("b", ttl_ms=4_000)
    record = await manual.get_lease("k")
    assert record is not None and (record.owner, record.ttl_ms) == ("b", 4_000)
    default = await tenure.hold(manual, "k2", "a", 10_000).start()
    assert await default.transfer_to("b")  # without ttl_ms: the lease's own TTL
    record = await manual.get_lease("k2")
    assert record is not None and (record.owner, record.ttl_ms) == ("b", 10_000)


@pytest.mark.asyncio
async def test_transfer_to_after_the_renew_deadline_hands_nothing_over(
    manual: MemoryPubSub,
) -> None:
    counted = FiveMethodsOnly(manual)
    lease = await tenure.hold(counted, "k", "a", 300).start()
    # Past the 200 ms renew deadline before any renewal could run. The backend's
    # clock stands still, so it would still hand the lease over: the holder may
    # not, as it can no longer be sure the lease is its own.
    stall(0.25)
    assert await lease.transfer_to("b") is False
    assert counted.calls["transfer_lease"] == 0
    assert lease.lost.is_set()
    assert (lease.lost_reason or "").startswith("no renewal succeeded within the renew deadline")
    assert await manual.get_lease_owner("k") == "a"
    await lease.release()


# -- what it logs ------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_loss_without_on_lost_logs_no_error(
    manual: MemoryPubSub, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tenure.hold")
    lease = await tenure.hold(manual, "k", "a", 10_000).start()
    await _lose(manual, clock, lease)  # on_lost would have been called by now
    assert lease.lost.is_set()
    assert [r.getMessage() for r in caplog.records if r.name == "tenure.hold"] == []
    await lease.release()


@pytest.mark.asyncio
async def test_a_release_on_exit_that_fails_is_logged_and_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tenure.hold")
    backend = MemoryPubSub()
    async with tenure.hold(backend, "k", "a", 10_000):
        await backend.aclose()  # a real fault: the backend is gone when the block releases
    with pytest.raises(BackendClosed) as closed:
        await backend.release_lease("k", "a")
    [record] = [r for r in caplog.records if r.name == "tenure.hold"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"releasing lease 'k' failed; it expires in at most 10000 ms: {closed.value!r}"
    )


@pytest.mark.asyncio
async def test_a_release_of_a_dropped_lease_that_fails_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tenure.hold")
    backend = MemoryPubSub()
    leases = [await tenure.hold(backend, "k", "a", 10_000).start()]
    await backend.aclose()
    with pytest.warns(ResourceWarning, match="without release"):
        _drop(leases)
    await eventually(lambda: any(r.name == "tenure.hold" for r in caplog.records))
    with pytest.raises(BackendClosed) as closed:
        await backend.release_lease("k", "a")
    [record] = [r for r in caplog.records if r.name == "tenure.hold"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"releasing abandoned lease 'k' failed; it expires in at most 10000 ms: {closed.value!r}"
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["function", "coroutine"])
async def test_an_on_lost_that_raises_is_logged_word_for_word(
    kind: str, manual: MemoryPubSub, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="tenure.hold")

    def failing(lease: HeldLease) -> None:
        raise RuntimeError("a bug in on_lost")

    async def failing_later(lease: HeldLease) -> None:
        raise RuntimeError("a bug in on_lost")

    on_lost = failing if kind == "function" else failing_later
    lease = await tenure.hold(manual, "k", "a", 10_000, on_lost=on_lost).start()
    await _lose(manual, clock, lease)
    await eventually(lambda: any(r.name == "tenure.hold" for r in caplog.records))
    [record] = [r for r in caplog.records if r.name == "tenure.hold"]
    assert record.getMessage() == "on_lost callback for lease 'k' raised"
    assert record.exc_info is not None and str(record.exc_info[1]) == "a bug in on_lost"
    await lease.release()


# -- what it leaves behind ---------------------------------------------------


@pytest.mark.asyncio
async def test_background_work_runs_in_tasks_named_after_the_key(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    named = NamedCalls(manual)
    async with tenure.hold(named, "k", "a", 10_000):
        pass
    assert named.release_tasks == ["tenure-release-'k'"]

    leases = [await tenure.hold(named, "dropped", "a", 10_000).start()]
    with pytest.warns(ResourceWarning, match="without release"):
        _drop(leases)
    await eventually(lambda: len(named.release_tasks) == 2)
    assert named.release_tasks[1] == "tenure-release-'dropped'"

    names: list[str] = []

    async def on_lost(lease: HeldLease) -> None:
        task = asyncio.current_task()
        assert task is not None
        names.append(task.get_name())

    lease = await tenure.hold(manual, "lost", "a", 10_000, on_lost=on_lost).start()
    await _lose(manual, clock, lease)
    await eventually(lambda: bool(names))
    assert names == ["tenure-on-lost-'lost'"]
    await lease.release()


@pytest.mark.asyncio
async def test_an_on_lost_coroutine_runs_to_its_end_though_nothing_else_refers_to_it(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    # It waits on a future only it refers to: without hold keeping its task, a
    # garbage collection would destroy the task while it waits.
    parked: list[weakref.ref[asyncio.Future[None]]] = []
    finished = asyncio.Event()

    async def on_lost(lease: HeldLease) -> None:
        waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        parked.append(weakref.ref(waiting))
        await waiting
        finished.set()

    lease = await tenure.hold(manual, "k", "a", 10_000, on_lost=on_lost).start()
    await _lose(manual, clock, lease)
    await eventually(lambda: bool(parked))
    gc.collect()
    waiting = parked[0]()
    assert waiting is not None, "the on_lost task was destroyed while it waited"
    waiting.set_result(None)
    del waiting
    await asyncio.wait_for(finished.wait(), 10)
    await lease.release()


@pytest.mark.asyncio
async def test_a_finished_on_lost_task_is_not_kept(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    tasks: list[weakref.ref[asyncio.Task[Any]]] = []
    go = asyncio.Event()

    async def on_lost(lease: HeldLease) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(weakref.ref(task))
        await go.wait()

    lease = await tenure.hold(manual, "k", "a", 10_000, on_lost=on_lost).start()
    await _lose(manual, clock, lease)
    await eventually(lambda: bool(tasks))
    assert tasks[0]() is not None  # still running
    go.set()
    await eventually(lambda: _collected(tasks[0]))
    await lease.release()


@pytest.mark.asyncio
async def test_the_warning_of_a_dropped_lease_names_it_and_points_at_tenure(
    manual: MemoryPubSub,
) -> None:
    leases = [await tenure.hold(manual, "k", "a", 10_000).start()]
    token = leases[0].token
    with pytest.warns(ResourceWarning) as caught:
        _drop(leases)
    [warning] = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert str(warning.message) == (
        f"HeldLease(key='k', owner='a', token={token}, held) was garbage-collected "
        "without release(); releasing it in the background"
    )
    # Where the collector happened to run says nothing: the warning is tenure's own.
    assert warning.filename == tenure._hold.__file__
    await eventually(lambda: not manual._leases)


@pytest.mark.asyncio
async def test_a_lease_dropped_in_another_thread_is_released_by_its_loop(
    manual: MemoryPubSub,
) -> None:
    leases = [await tenure.hold(manual, "k", "a", 10_000).start()]
    with pytest.warns(ResourceWarning, match="without release"):
        await asyncio.to_thread(_drop, leases)
    await eventually(lambda: not manual._leases)


# -- how the block ends ------------------------------------------------------


async def _held_until_cancelled(
    provider: Any, leases: list[HeldLease], entered: asyncio.Event
) -> None:
    async with tenure.hold(provider, "k", "a", 10_000) as lease:
        leases.append(lease)
        entered.set()
        await asyncio.Event().wait()


@pytest.mark.asyncio
async def test_the_body_is_cancelled_with_a_message_naming_the_loss(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    leases: list[HeldLease] = []
    messages: list[str] = []

    async def body() -> None:
        async with tenure.hold(manual, "k", "a", 10_000) as lease:
            leases.append(lease)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError as cancelled:
                messages.append(str(cancelled))
                raise

    task = asyncio.create_task(body())
    await eventually(lambda: bool(leases))
    await _lose(manual, clock, leases[0])
    with pytest.raises(LeaseLost) as info:
        await task
    assert messages == [f"lease 'k' lost: {TAKEN_OVER}"]
    assert info.value.reason == TAKEN_OVER
    assert isinstance(info.value.__cause__, asyncio.CancelledError)


@pytest.mark.asyncio
async def test_a_body_that_swallows_the_cancellation_still_ends_in_lease_lost(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    leases: list[HeldLease] = []

    async def body() -> None:
        async with tenure.hold(manual, "k", "a", 10_000) as lease:
            leases.append(lease)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()

    task = asyncio.create_task(body())
    await eventually(lambda: bool(leases))
    await _lose(manual, clock, leases[0])
    with pytest.raises(LeaseLost, match="no longer held"):
        await task


@pytest.mark.asyncio
async def test_a_body_that_replaces_the_cancellation_with_its_own_error_raises_that(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    leases: list[HeldLease] = []

    async def body() -> None:
        async with tenure.hold(manual, "k", "a", 10_000) as lease:
            leases.append(lease)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise RuntimeError("cleanup failed") from None

    task = asyncio.create_task(body())
    await eventually(lambda: bool(leases))
    await _lose(manual, clock, leases[0])
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await task
    assert await manual.get_lease_owner("k") == "b"  # nothing of b's was released


@pytest.mark.asyncio
async def test_a_task_that_caught_lease_lost_keeps_no_cancellation_and_is_told_of_the_next(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    # hold takes back the cancellation it made (Task.uncancel), as asyncio asks
    # of code that turns a cancellation into something else: a request left
    # counted would make the next loss look like someone else's cancellation.
    leases: list[HeldLease] = []
    ends: list[str] = []

    async def worker() -> None:
        for key in ("k1", "k2"):
            try:
                async with tenure.hold(manual, key, "a", 10_000) as lease:
                    leases.append(lease)
                    await asyncio.Event().wait()
            except LeaseLost as lost:
                ends.append(f"{lost.key}: LeaseLost")

    task = asyncio.create_task(worker())
    await eventually(lambda: len(leases) == 1)
    await _lose(manual, clock, leases[0])
    await eventually(lambda: len(leases) == 2)
    await _lose(manual, clock, leases[1])
    await asyncio.wait_for(task, 10)
    assert ends == ["k1: LeaseLost", "k2: LeaseLost"]
    assert task.cancelling() == 0


@pytest.mark.asyncio
async def test_a_cancellation_from_outside_at_the_loss_ends_the_task_cancelled(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    leases: list[HeldLease] = []
    entered = asyncio.Event()
    task = asyncio.create_task(_held_until_cancelled(manual, leases, entered))
    await entered.wait()
    task.cancel()  # the outside cancellation, and the loss, both before the body runs again
    await _lose(manual, clock, leases[0])
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


@pytest.mark.asyncio
async def test_a_cancellation_from_outside_during_the_release_after_a_loss_is_not_held_back(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    gated = GatedRelease(manual)
    leases: list[HeldLease] = []
    entered = asyncio.Event()
    task = asyncio.create_task(_held_until_cancelled(gated, leases, entered))
    await entered.wait()
    await _lose(manual, clock, leases[0])  # the body is cancelled; the block releases
    await asyncio.wait_for(gated.releasing.wait(), 10)
    task.cancel()
    gated.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(gated.released.wait(), 10)  # the release carried on


@pytest.mark.asyncio
async def test_an_outside_cancellation_during_the_release_counts_after_the_body_swallowed_ours(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    """The body swallows hold's loss cancellation and returns; while the block
    releases, its task is cancelled from outside. That cancellation is not
    hold's own still on its way: the block raises it, and the release goes on."""
    gated = GatedRelease(manual)
    leases: list[HeldLease] = []
    swallowed = asyncio.Event()

    async def body() -> None:
        async with tenure.hold(gated, "k", "a", 10_000) as lease:
            leases.append(lease)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                swallowed.set()

    task = asyncio.create_task(body())
    await eventually(lambda: bool(leases))
    await _lose(manual, clock, leases[0])
    await asyncio.wait_for(swallowed.wait(), 10)
    await asyncio.wait_for(gated.releasing.wait(), 10)
    task.cancel()
    await asyncio.sleep(0.01)  # delivered while the block waits for the release
    gated.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(gated.released.wait(), 10)  # the release carried on


@pytest.mark.asyncio
async def test_a_loss_noticed_while_the_block_exits_does_not_cancel_it(
    manual: MemoryPubSub, clock: ManualClock
) -> None:
    go = asyncio.Event()
    transferred: list[bool] = []

    async def other(lease: HeldLease) -> None:
        await go.wait()
        transferred.append(await lease.transfer_to("c"))

    async def block() -> HeldLease:
        async with tenure.hold(manual, "k", "a", 10_000) as lease:
            looking = asyncio.create_task(other(lease))
            await asyncio.sleep(0)  # ``other`` waits for ``go``
            clock.advance_ms(10_001)
            assert (await manual.acquire_lease("k", "b", 600_000)).acquired
            # ``other`` runs at the block's first wait, inside its exit, and
            # finds the lease lost: the body is over, nothing is to be cancelled.
            go.set()
        await looking
        return lease

    [outcome] = await asyncio.gather(block(), return_exceptions=True)
    assert isinstance(outcome, HeldLease), outcome
    assert transferred == [False]
    assert outcome.lost.is_set() and outcome.lost_reason == TAKEN_OVER
    assert await manual.get_lease_owner("k") == "b"


@pytest.mark.asyncio
async def test_a_refusal_that_comes_back_during_the_release_is_no_loss(
    manual: MemoryPubSub, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # On Python 3.11 ``wait_for`` returns a reply that arrived together with its
    # cancellation: the renewer then sees the refusal after it was stopped.
    caplog.set_level(logging.WARNING, logger="tenure.renewer")
    gated = GatedRenewal(manual)
    lost: list[HeldLease] = []
    lease = await tenure.hold(
        gated, "k", "a", 600_000, renew_every_ms=10, on_lost=lost.append
    ).start()
    await asyncio.wait_for(gated.asked.wait(), 10)  # a renewal is in flight
    clock.advance_ms(600_001)
    assert (await manual.acquire_lease("k", "b", 600_000)).acquired  # so it will be refused
    gated.gate.set()
    await lease.release()  # stops the renewer while the refusal comes back
    assert not lease.lost.is_set() and lease.lost_reason is None and lost == []
    assert [r.getMessage() for r in caplog.records if "lost" in r.getMessage()] == []


@pytest.mark.asyncio
async def test_a_refusal_that_comes_back_while_a_dropped_lease_is_released_is_no_loss(
    manual: MemoryPubSub, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tenure.renewer")
    gated = GatedRenewal(manual)
    leases = [await tenure.hold(gated, "k", "a", 600_000, renew_every_ms=10).start()]
    await asyncio.wait_for(gated.asked.wait(), 10)
    clock.advance_ms(600_001)
    assert (await manual.acquire_lease("k", "b", 600_000)).acquired
    gated.gate.set()
    with pytest.warns(ResourceWarning, match="without release"):
        _drop(leases)
    await eventually(lambda: gated.calls["release_lease"] == 1)
    assert [r.getMessage() for r in caplog.records if "lost" in r.getMessage()] == []
