"""The ``discard`` policy (Mastra's ``ifActive: discard``) on the memory backend:
a signal the owner hears of while a run handles one is stored, then settled
unrun and said so; otherwise it runs.

Two runtimes on one backend stand for two processes. The owner killed while
such signals wait is in ``test_policies_processes.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from tenure import RuntimeEvent
from tenure.testing import eventually

from ._policy_support import owner_and_other
from .test_policies import Blocking, of_kind


@pytest.mark.asyncio
@pytest.mark.parametrize("sender_is_owner", [True, False], ids=["same-runtime", "other-runtime"])
async def test_a_signal_sent_while_a_run_is_busy_is_discarded_visibly(
    sender_is_owner: bool,
) -> None:
    handler = Blocking()
    events: list[RuntimeEvent] = []
    async with owner_and_other(handler, events) as (owner, other):
        await owner.send_signal("t", "slow")
        await asyncio.wait_for(handler.busy.wait(), 5)
        sender = owner if sender_is_owner else other
        sent = [await sender.send_signal("t", n, policy="discard") for n in range(3)]
        assert {(s.outcome, s.policy) for s in sent} == {("deliver", "discard")}
        await eventually(lambda: len(of_kind(events, "discarded")) == 3)
        (status,) = await owner.threads()
        assert status.discarded == 3
        kept = await sender.send_signal("t", "after", policy="enqueue")
        handler.go.set()
        await eventually(lambda: handler.payloads() == ["slow", "after"])
        await asyncio.sleep(0.2)
        assert not (await owner.thread_status("t")).pending
    assert handler.payloads() == ["slow", "after"]
    assert [e.signal_id for e in of_kind(events, "discarded")] == [s.signal_id for s in sent]
    assert kept.signal_id not in {e.signal_id for e in of_kind(events, "discarded")}


@pytest.mark.asyncio
async def test_a_discard_signal_to_an_idle_thread_or_an_idle_run_runs() -> None:
    handler = Blocking()
    events: list[RuntimeEvent] = []
    async with owner_and_other(handler, events, idle_timeout=1.0) as (owner, other):
        woke = await other.send_signal("t", "first", policy="discard")
        assert woke.outcome == "wake"
        await eventually(lambda: handler.payloads() == ["first"])
        # The run waits for its next signal, handling none: not busy.
        again = await owner.send_signal("t", "second", policy="discard")
        assert again.outcome == "deliver"
        await eventually(lambda: handler.payloads() == ["first", "second"])
    assert of_kind(events, "discarded") == []
