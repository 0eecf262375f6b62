"""The ``debounce`` policy on the memory backend: a run takes the thread's signals
only once none came for the window, all of them together.

Two runtimes on one backend stand for two processes (the sender's signals then
reach the owner through the log and its control requests). The cross-process
versions, with skewed senders' clocks, are in ``test_policies_processes.py``.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from tenure import Debounce, Event, InvalidArgument, MemoryPubSub, RuntimeEvent, ThreadRuntime
from tenure.runtime._log import INTERRUPT
from tenure.testing import eventually

from ._policy_support import owner_and_other
from .test_policies import OPTIONS, Blocking, of_kind

WINDOW = 0.3


@pytest.mark.parametrize("window", [0, -1, math.nan, math.inf, 3601, "1", True, None])
def test_a_bad_window_is_refused(window: Any) -> None:
    with pytest.raises(InvalidArgument, match="debounce window"):
        Debounce(window)


@pytest.mark.asyncio
async def test_debounce_without_a_window_is_refused_before_anything_is_stored() -> None:
    handler = Blocking()
    async with MemoryPubSub() as memory, ThreadRuntime(memory, handler, **OPTIONS) as rt:
        with pytest.raises(InvalidArgument, match=r"Debounce\(seconds\)"):
            await rt.send_signal("t", 1, policy="debounce")
        with pytest.raises(InvalidArgument, match="Debounce"):
            ThreadRuntime(memory, handler, policy="debounce", **OPTIONS)
        await asyncio.sleep(0.1)
        assert handler.taken == []
        assert (await rt.send_signal("t", 2, policy=Debounce(0.01))).policy == "debounce"
        await eventually(lambda: handler.payloads() == [2])


class Timed(Blocking):
    """Also records when (time.monotonic()) each signal was taken."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    async def __call__(self, run: Any) -> None:
        async for signal in run.signals():
            self.taken.append((run.run_id, signal))
            self.at.append(time.monotonic())
            if signal.payload == "slow":
                self.busy.set()
                await self.go.wait()


async def burst(rt: ThreadRuntime, count: int, gap: float) -> tuple[list[str], float]:
    """``count`` debounced sends ``gap`` s apart: their ids, and when the last one began."""
    ids: list[str] = []
    began = 0.0
    for n in range(count):
        if n:
            await asyncio.sleep(gap)
        began = time.monotonic()
        sent = await rt.send_signal("t", n, policy=Debounce(WINDOW))
        ids.append(sent.signal_id)
    return ids, began


@pytest.mark.asyncio
@pytest.mark.parametrize("sender_is_owner", [True, False], ids=["same-runtime", "other-runtime"])
async def test_an_idle_thread_runs_once_a_burst_is_quiet_with_every_signal(
    sender_is_owner: bool,
) -> None:
    handler = Timed()
    events: list[RuntimeEvent] = []
    async with owner_and_other(handler, events) as (owner, other):
        first = await owner.send_signal("t", "start", policy=Debounce(WINDOW))
        assert first.outcome == "wake"
        ids, last_began = await burst(owner if sender_is_owner else other, 5, WINDOW / 5)
        await eventually(lambda: len(handler.taken) == 1, timeout=10)
        await asyncio.sleep(2 * WINDOW)
    assert len(handler.taken) == 1
    (_, signal) = handler.taken[0]
    assert signal.id == ids[-1]
    assert [s.id for s in signal.coalesced] == [first.signal_id, *ids[:-1]]
    assert [s.payload for s in signal.coalesced] == ["start", 0, 1, 2, 3]
    # A lower bound, not a timing race: the owner heard of the last signal after
    # its send began, and waited a whole window from then.
    assert handler.at[0] >= last_began + WINDOW
    coalesced = of_kind(events, "coalesced")
    assert [e.signal_id for e in coalesced] == [first.signal_id, *ids[:-1]]
    assert {e.detail for e in coalesced} == {f"into {ids[-1]}"}


@pytest.mark.asyncio
async def test_signals_further_apart_than_the_window_run_apart() -> None:
    handler = Timed()
    async with MemoryPubSub() as memory, ThreadRuntime(memory, handler, **OPTIONS) as rt:
        await rt.send_signal("t", "a", policy=Debounce(0.05))
        await eventually(lambda: handler.payloads() == ["a"])
        await rt.send_signal("t", "b", policy=Debounce(0.05))
        await eventually(lambda: handler.payloads() == ["a", "b"])
    assert [s.coalesced for _, s in handler.taken] == [(), ()]


@pytest.mark.asyncio
async def test_while_a_run_is_busy_a_burst_waits_and_is_handed_over_together() -> None:
    handler = Timed()
    events: list[RuntimeEvent] = []
    async with owner_and_other(handler, events) as (owner, other):
        await owner.send_signal("t", "slow")
        await asyncio.wait_for(handler.busy.wait(), 5)
        ids, _ = await burst(other, 4, 0.0)
        assert await owner.threads()
        handler.go.set()
        await eventually(lambda: len(handler.taken) == 2, timeout=10)
        await asyncio.sleep(2 * WINDOW)
    assert len(handler.taken) == 2
    _, signal = handler.taken[1]
    assert [signal.id, *(s.id for s in signal.coalesced)] == [ids[-1], *ids[:-1]]
    assert len(of_kind(events, "coalesced")) == 3


@pytest.mark.asyncio
async def test_a_signal_sent_otherwise_after_a_debounced_one_waits_its_turn() -> None:
    handler = Timed()
    async with MemoryPubSub() as memory, ThreadRuntime(memory, handler, **OPTIONS) as rt:
        await rt.send_signal("t", "slow")
        await asyncio.wait_for(handler.busy.wait(), 5)
        await rt.send_signal("t", "d1", policy=Debounce(WINDOW))
        await rt.send_signal("t", "d2", policy=Debounce(WINDOW))
        await rt.send_signal("t", "e", policy="enqueue")
        handler.go.set()
        await eventually(lambda: len(handler.taken) == 3, timeout=10)
    assert handler.payloads() == ["slow", "d2", "e"]
    assert [s.payload for s in handler.taken[1][1].coalesced] == ["d1"]


@pytest.mark.asyncio
async def test_a_request_about_a_signal_that_never_comes_delays_the_burst_only_a_while() -> None:
    # A request names a debounced signal this owner will never read (one a
    # previous owner read, say): the held signals go to a run without it, after
    # the window and at most max(window, 1 s) more, instead of waiting forever.
    handler = Timed()
    async with MemoryPubSub() as memory, ThreadRuntime(memory, handler, **OPTIONS) as rt:
        first = await rt.send_signal("t", "a", policy=Debounce(0.1))
        second = await rt.send_signal("t", "b", policy=Debounce(0.1))
        ghost = {"signal": "ghost", "sent_at": time.time(), "policy": "debounce", "window": 0.1}
        await memory.publish(rt.names.control("t"), Event(INTERRUPT, ghost))
        await eventually(lambda: bool(handler.taken), timeout=10)
    ((_, signal),) = handler.taken
    assert (signal.id, [s.id for s in signal.coalesced]) == (second.signal_id, [first.signal_id])
