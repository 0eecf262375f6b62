"""A run learns of its lease's loss at the renew deadline at the latest: hung renew, paused owner;
and the runtime's failure paths around the lease: a hand-over whose transfer
raises, a session whose opening fails, a release that fails.

Two runtimes on one memory backend stand for two processes; the lease
provider of the first can be made to hang its renewals (a black-holed
connection at the unit level; the cross-process versions are in
``test_runtime_processes.py``), or to fail one transfer or release: no real
fault reaches those calls at a chosen moment of a session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from tenure import BackendUnavailable, LeaseLost, MemoryPubSub, ThreadRun, ThreadRuntime
from tenure.runtime import RuntimeEvent
from tenure.testing import eventually

from ..hold.support import FiveMethodsOnly, Flaky, LateRenewal, stall


class FailingCalls(FiveMethodsOnly):
    """Fails the next transfer of the chosen kind, or releases, on purpose.

    ``transfer``: ``"open"`` (a session's opening move, from ``.0``) or
    ``"handover"`` (to the next run); ``transfer_applied``: the failing transfer
    is applied on the backend before it raises (a lost reply) or not at all.
    ``release``: releases raise while set. ``owner_check``: the next
    ``get_lease_owner`` after a failed transfer raises too.
    """

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.transfer: str | None = None
        self.transfer_applied = False
        self.release = False
        self.owner_check = False
        self.failed: list[str] = []

    async def get_lease_owner(self, key: str) -> str | None:
        if self.owner_check and self.failed and self.failed[-1].startswith("transfer:"):
            self.owner_check = False
            self.failed.append("owner")
            raise BackendUnavailable("simulated network error") from OSError("connection reset")
        return await super().get_lease_owner(key)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        kind = "open" if from_owner.endswith(".0") else "handover"
        if self.transfer != kind:
            return await super().transfer_lease(key, from_owner, to_owner, ttl_ms)
        self.transfer = None
        if self.transfer_applied:
            await super().transfer_lease(key, from_owner, to_owner, ttl_ms)
        self.failed.append(f"transfer:{kind}")
        raise BackendUnavailable("simulated network error") from OSError("connection reset")

    async def release_lease(self, key: str, owner: str) -> None:
        if self.release:
            self.failed.append("release")
            raise BackendUnavailable("simulated network error") from OSError("connection reset")
        await super().release_lease(key, owner)


@pytest.mark.asyncio
async def test_a_run_whose_renewals_hang_is_told_before_another_run_can_start() -> None:
    starts: list[tuple[float, str]] = []
    lost: dict[str, float] = {}
    handled: list[object] = []
    started = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        starts.append((time.monotonic(), run.run_id))
        async for signal in run.signals():
            handled.append(signal.payload)
            started.set()
            if signal.payload != 1 or lost:
                continue  # only the first run of signal 1 waits for its loss
            while True:
                try:
                    run.ensure_held()
                except LeaseLost:
                    lost[run.run_id] = time.monotonic()
                    return
                await asyncio.sleep(0.01)

    async with MemoryPubSub() as memory:
        flaky = Flaky(memory)
        a = ThreadRuntime(memory, handler, lease_provider=flaky, ttl_ms=600, cancel_on_loss=False)
        b = ThreadRuntime(memory, handler, ttl_ms=600, sweep_interval=0.05)
        async with a, b:
            await a.send_signal("t", 1)
            await asyncio.wait_for(started.wait(), 5)
            first_run = starts[0][1]
            flaky.hanging = True
            hung = time.monotonic()
            await eventually(lambda: first_run in lost, timeout=3)
            # Lost at the 400 ms renew deadline after the last renewal sent (before
            # the hang): before its 600 ms TTL could end, whatever the machine's load.
            assert lost[first_run] - hung < 0.6
            flaky.hanging = False
            await b.send_signal("t", 2)
            await eventually(lambda: 2 in handled, timeout=5)
    # Whoever ran the thread next, it started after the first run knew it was lost.
    later = [at for at, run_id in starts if run_id != first_run]
    assert later and min(later) > lost[first_run]


@pytest.mark.asyncio
async def test_ensure_held_raises_right_after_the_owner_was_paused_past_its_deadline() -> None:
    outcome: list[str] = []

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            stall(0.45)  # the whole process stalls past the 400 ms deadline
            try:
                run.ensure_held()
                outcome.append("held")
            except LeaseLost:
                outcome.append("lost")

    memory = MemoryPubSub()
    async with memory, ThreadRuntime(memory, handler, ttl_ms=600, cancel_on_loss=False) as rt:
        await rt.send_signal("t", 1)
        await eventually(lambda: bool(outcome), timeout=5)
    assert outcome == ["lost"]


@pytest.mark.asyncio
async def test_a_run_within_its_deadline_is_held() -> None:
    outcome: list[str] = []

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            stall(0.1)
            run.ensure_held()
            outcome.append("held")

    async with MemoryPubSub() as memory, ThreadRuntime(memory, handler, ttl_ms=600) as rt:
        await rt.send_signal("t", 1)
        await eventually(lambda: bool(outcome), timeout=5)
    assert outcome == ["held"]


def _runtime_events(events: list[RuntimeEvent], kind: str) -> list[RuntimeEvent]:
    return [e for e in events if e.kind == kind]


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["hang", "fail"])
async def test_the_renewer_alone_ends_a_run_whose_renewals_never_succeed(fault: str) -> None:
    # The handler never looks (no ensure_held): only the renewer giving up at the
    # deadline, while the renewals still hang or fail, can tell and cancel the run.
    events: list[RuntimeEvent] = []
    started = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            started.set()
            await asyncio.sleep(3600)

    async with MemoryPubSub() as memory:
        flaky = Flaky(memory)
        rt = ThreadRuntime(
            memory, handler, lease_provider=flaky, ttl_ms=600, on_event=events.append
        )
        async with rt:
            await rt.send_signal("t", 1)
            await asyncio.wait_for(started.wait(), 5)
            if fault == "hang":
                flaky.hanging = True
            else:
                flaky.failing = True
            await eventually(lambda: bool(_runtime_events(events, "run_end")), timeout=5)
            failed = flaky.hangs if fault == "hang" else flaky.failures
            flaky.hanging = flaky.failing = False
    assert failed >= 1
    # The first run ended lost (the sweep may then have run the signal again).
    end = _runtime_events(events, "run_end")[0]
    assert end.detail == "lost"
    [lost] = [e for e in _runtime_events(events, "lost") if e.run_id == end.run_id]
    assert "renew deadline" in (lost.detail or "")
    if fault == "fail":
        assert "simulated network error" in (lost.detail or "")


@pytest.mark.asyncio
async def test_a_run_whose_renewal_succeeds_after_the_deadline_is_lost() -> None:
    events: list[RuntimeEvent] = []
    started = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            started.set()
            await asyncio.sleep(3600)

    async with MemoryPubSub() as memory:
        late = LateRenewal(memory)
        rt = ThreadRuntime(
            memory,
            handler,
            lease_provider=late,
            ttl_ms=3000,
            renew_every_ms=100,
            renew_deadline_ms=400,
            on_event=events.append,
        )
        async with rt:
            await rt.send_signal("t", 1)
            await asyncio.wait_for(started.wait(), 5)
            # The next renewal (due within 100 ms) succeeds, but is seen 350 ms
            # after its send: past the deadline of the one before (sent at least
            # 100 ms earlier), within its own.
            late.then = lambda: stall(0.35)
            await eventually(lambda: bool(_runtime_events(events, "run_end")), timeout=5)
    assert late.late == 1
    end = _runtime_events(events, "run_end")[0]
    assert end.detail == "lost"
    [lost] = [e for e in _runtime_events(events, "lost") if e.run_id == end.run_id]
    assert "succeeded only after" in (lost.detail or "")


def _one_signal_per_run(handled: list[tuple[str, Any]], go: asyncio.Event) -> Any:
    """A handler that takes one signal per run; the first run waits for ``go``."""

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append((run.run_id, signal.payload))
            if signal.payload == 1:
                await go.wait()
            return

    return handler


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("applied", "check_fails"),
    [(True, False), (False, False), (True, True)],
    ids=["applied", "not-applied", "applied-and-the-owner-check-fails"],
)
async def test_a_hand_over_whose_transfer_raises(
    applied: bool, check_fails: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # Applied (the reply was lost): the session reads the owner, sees the next
    # run's name, and the next run goes on as the new owner. Not applied, or
    # applied but the owner cannot be read either: the session cannot know
    # whether it holds the lease, counts it lost, and the signal is run by a
    # later session once this one let go (or, applied, once the lease expired).
    caplog.set_level(logging.WARNING, logger="tenure.runtime")
    events: list[RuntimeEvent] = []
    handled: list[tuple[str, Any]] = []
    go = asyncio.Event()
    async with MemoryPubSub() as memory:
        provider = FailingCalls(memory)
        rt = ThreadRuntime(
            memory,
            _one_signal_per_run(handled, go),
            lease_provider=provider,
            ttl_ms=600,
            idle_timeout=0.05,
            on_event=events.append,
        )
        async with rt:
            await rt.send_signal("t", 1)
            await eventually(lambda: len(handled) == 1)
            await rt.send_signal("t", 2)  # buffered behind the first run: a hand-over
            provider.transfer, provider.transfer_applied = "handover", applied
            provider.owner_check = check_fails
            go.set()
            await eventually(lambda: len(handled) == 2)
    assert provider.failed == ["transfer:handover", *(["owner"] if check_fails else [])]
    assert [payload for _, payload in handled] == [1, 2]
    first_run, second_run = (run_id for run_id, _ in handled)
    assert first_run != second_run
    assert f"transfer of {rt.lease_key('t')!r} failed: simulated network error" in [
        r.getMessage() for r in caplog.records if r.name == "tenure.runtime"
    ]
    # Each run ended once: a session that could not hand over starts no other run.
    assert [e.run_id for e in _runtime_events(events, "run_end")] == [first_run, second_run]
    kinds = [e.kind for e in events]
    if applied and not check_fails:
        assert "lost" not in kinds
        [handover] = [e for e in events if e.kind == "handover"]
        assert (handover.detail, handover.run_id) == (first_run, second_run)
    else:
        assert "handover" not in kinds
        [lost] = _runtime_events(events, "lost")
        assert (lost.run_id, lost.detail) == (
            first_run,
            "the lease was no longer held at hand-over",
        )
        # The second run is another session's, which took the thread over.
        assert first_run.split(".")[0] != second_run.split(".")[0]


@pytest.mark.asyncio
async def test_a_session_that_fails_to_open_lets_the_thread_go_and_the_send_can_be_retried() -> (
    None
):
    handled: list[Any] = []

    async def handler(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    async with MemoryPubSub() as memory:
        provider = FailingCalls(memory)
        async with ThreadRuntime(
            memory, handler, lease_provider=provider, ttl_ms=600, idle_timeout=0.05
        ) as rt:
            provider.transfer = "open"
            with pytest.raises(BackendUnavailable):
                await rt.send_signal("t", "hello", signal_id="s-1")
            # Nothing holds the thread any more, nothing was stored: retrying is safe.
            assert provider.failed == ["transfer:open"]
            assert not rt.owned_threads()
            assert await memory.get_lease_owner(rt.lease_key("t")) is None
            assert (await rt.send_signal("t", "hello", signal_id="s-1")).outcome == "wake"
            await eventually(lambda: handled == ["hello"])
            await asyncio.sleep(0.2)  # room for a second run of it, if there were one
    assert handled == ["hello"]


@pytest.mark.asyncio
async def test_a_release_that_fails_leaves_the_thread_to_expire_and_be_taken_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tenure.runtime")
    events: list[RuntimeEvent] = []
    handled: list[Any] = []

    async def handler(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    async with MemoryPubSub() as memory:
        provider = FailingCalls(memory)
        async with ThreadRuntime(
            memory,
            handler,
            lease_provider=provider,
            ttl_ms=600,
            idle_timeout=0.05,
            on_event=events.append,
        ) as rt:
            provider.release = True
            await rt.send_signal("t", 1)
            await eventually(lambda: "release" in provider.failed and not rt.owned_threads())
            provider.release = False
            # The lease is still the ended session's until it expires: a new
            # signal waits for that, then is run by a session that takes over.
            assert await memory.get_lease_owner(rt.lease_key("t")) is not None
            assert (await rt.send_signal("t", 2)).outcome == "deliver"
            await eventually(lambda: handled == [1, 2], timeout=10)
    assert f"releasing {rt.lease_key('t')!r} failed: simulated network error" in [
        r.getMessage() for r in caplog.records if r.name == "tenure.runtime"
    ]
    # No "release" announced for the session whose release failed; the thread
    # was taken over by another session.
    [wake] = _runtime_events(events, "wake")
    assert not [e for e in _runtime_events(events, "release") if e.run_id == wake.run_id]
    [takeover] = _runtime_events(events, "takeover")
    assert takeover.run_id != wake.run_id
