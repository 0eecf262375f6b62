"""Double-texting policies chosen per send: the rule travels with the signal,
coalesce, rollback (memory backend, several runtimes standing for processes).

The cross-process versions are in ``test_policies_processes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from tenure import (
    Event,
    InvalidArgument,
    MemoryPubSub,
    RuntimeEvent,
    Signal,
    ThreadRun,
    ThreadRuntime,
    from_url,
)
from tenure.runtime._log import INTERRUPT, SIGNAL_TYPE
from tenure.testing import eventually

OPTIONS: dict[str, Any] = {"idle_timeout": 0.05, "sweep_interval": 60}


class Blocking:
    """A handler that records what it takes and blocks on payloads named ``"slow"``."""

    def __init__(self) -> None:
        self.taken: list[tuple[str, Signal]] = []
        self.busy = asyncio.Event()
        self.go = asyncio.Event()
        self.interrupted: list[str] = []

    async def __call__(self, run: ThreadRun) -> None:
        try:
            async for signal in run.signals():
                self.taken.append((run.run_id, signal))
                if signal.payload == "slow":
                    self.busy.set()
                    await self.go.wait()
        except asyncio.CancelledError:
            if run.interrupted:
                self.interrupted.append(run.run_id)
            raise

    def payloads(self) -> list[Any]:
        return [signal.payload for _, signal in self.taken]


def of_kind(events: list[RuntimeEvent], kind: str) -> list[RuntimeEvent]:
    return [e for e in events if e.kind == kind]


@pytest.mark.asyncio
async def test_an_unknown_policy_of_a_send_is_refused_and_nothing_is_stored() -> None:
    handler = Blocking()
    async with MemoryPubSub() as memory, ThreadRuntime(memory, handler, **OPTIONS) as rt:
        with pytest.raises(InvalidArgument, match="policy"):
            await rt.send_signal("t", 1, policy="drop")  # type: ignore[arg-type]
        assert (await rt.send_signal("t", 2)).policy == "enqueue"
        await eventually(lambda: handler.payloads() == [2])


@pytest.mark.asyncio
async def test_a_send_s_policy_overrides_the_runtime_s_in_this_process() -> None:
    handler = Blocking()
    memory = MemoryPubSub()
    async with memory, ThreadRuntime(memory, handler, policy="interrupt", **OPTIONS) as rt:
        await rt.send_signal("t", "slow")
        await asyncio.wait_for(handler.busy.wait(), 5)
        waits = await rt.send_signal("t", "queued", policy="enqueue")
        assert (waits.outcome, waits.policy) == ("deliver", "enqueue")
        assert not handler.interrupted
        refused = await rt.send_signal("t", "refused", policy="reject")
        assert refused.outcome == "rejected"
        handler.go.set()
        await eventually(lambda: handler.payloads() == ["slow", "queued"])
    assert not handler.interrupted


@pytest.mark.asyncio
async def test_the_owner_applies_the_sender_s_policy_not_its_own_default() -> None:
    handler = Blocking()
    events: list[RuntimeEvent] = []
    async with MemoryPubSub() as memory:
        owner = ThreadRuntime(memory, handler, policy="enqueue", on_event=events.append, **OPTIONS)
        sender = ThreadRuntime(memory, handler, policy="enqueue", **OPTIONS)
        async with owner, sender:
            await owner.send_signal("t", "slow")
            await asyncio.wait_for(handler.busy.wait(), 5)
            sent = await sender.send_signal("t", "new", policy="interrupt")
            assert (sent.outcome, sent.policy) == ("deliver", "interrupt")
            await eventually(lambda: "new" in handler.payloads())
    assert len(handler.interrupted) == 1
    assert next(e.detail for e in of_kind(events, "run_end")) == "interrupted"


@pytest.mark.asyncio
async def test_coalesce_one_more_run_sees_every_signal_sent_meanwhile_in_order() -> None:
    handler = Blocking()
    events: list[RuntimeEvent] = []
    async with MemoryPubSub() as memory:
        owner = ThreadRuntime(memory, handler, on_event=events.append, **OPTIONS)
        other = ThreadRuntime(memory, handler, policy="coalesce", **OPTIONS)
        async with owner, other:
            await owner.send_signal("t", "slow")
            await asyncio.wait_for(handler.busy.wait(), 5)
            sent = [await other.send_signal("t", n) for n in range(4)]
            sent.append(await owner.send_signal("t", 4, policy="coalesce"))
            # The owner knows of every coalescing signal before the run ends.
            await eventually(lambda: len(of_kind(events, "coalescing")) == 5)
            # ... and settled the four, each into a newer one, while the run is busy.
            await eventually(lambda: len(of_kind(events, "coalesced")) == 4)
            (status,) = await owner.threads()
            assert (status.coalesced, status.skipped, status.discarded) == (4, 0, 0)
            handler.go.set()
            await eventually(lambda: len(handler.taken) == 2)
            await eventually(lambda: not owner.owned_threads())
    assert [s.outcome for s in sent] == ["deliver"] * 5
    last = handler.taken[1][1]
    assert last.payload == 4 and last.id == sent[-1].signal_id
    assert [s.payload for s in last.coalesced] == [0, 1, 2, 3]
    assert [s.id for s in last.coalesced] == [s.signal_id for s in sent[:4]]
    coalesced = of_kind(events, "coalesced")
    assert [e.signal_id for e in coalesced] == [s.signal_id for s in sent[:4]]
    # Each was settled into a newer one, the last into the signal that ran.
    assert coalesced[-1].detail == f"into {sent[-1].signal_id}"
    assert len(handler.taken) == 2


@pytest.mark.asyncio
async def test_coalesce_on_an_idle_thread_runs_the_signal_as_enqueue_would() -> None:
    handler = Blocking()
    memory = MemoryPubSub()
    async with memory, ThreadRuntime(memory, handler, policy="coalesce", **OPTIONS) as rt:
        assert (await rt.send_signal("t", 1)).outcome == "wake"
        await eventually(lambda: handler.payloads() == [1])
    assert handler.taken[0][1].coalesced == ()


@pytest.mark.asyncio
async def test_rollback_calls_the_hook_with_the_interrupted_run_before_the_next_run() -> None:
    handler = Blocking()
    order: list[tuple[str, str]] = []
    events: list[RuntimeEvent] = []

    async def on_rollback(thread_key: str, run_id: str) -> None:
        await asyncio.sleep(0)
        order.append(("rollback", run_id))

    async def recording(run: ThreadRun) -> None:
        order.append(("run", run.run_id))
        await handler(run)

    async with MemoryPubSub() as memory:
        owner = ThreadRuntime(
            memory, recording, on_rollback=on_rollback, on_event=events.append, **OPTIONS
        )
        sender = ThreadRuntime(memory, recording, **OPTIONS)
        async with owner, sender:
            await owner.send_signal("t", "slow")
            await asyncio.wait_for(handler.busy.wait(), 5)
            sent = await sender.send_signal("t", "redo", policy="rollback")
            assert sent.policy == "rollback"
            await eventually(lambda: "redo" in handler.payloads())
    first, second = handler.taken[0][0], handler.taken[1][0]
    assert handler.interrupted == [first]
    assert order == [("run", first), ("rollback", first), ("run", second)]
    assert [(e.run_id, e.detail) for e in of_kind(events, "rollback")] == [(first, "ok")]


@pytest.mark.asyncio
async def test_a_failing_rollback_hook_is_visible_and_the_next_run_still_starts() -> None:
    handler = Blocking()
    events: list[RuntimeEvent] = []

    def on_rollback(thread_key: str, run_id: str) -> None:
        raise RuntimeError("checkpoint store down")

    async with MemoryPubSub() as memory:
        rt = ThreadRuntime(
            memory, handler, on_rollback=on_rollback, on_event=events.append, **OPTIONS
        )
        async with rt:
            await rt.send_signal("t", "slow")
            await asyncio.wait_for(handler.busy.wait(), 5)
            await rt.send_signal("t", "redo", policy="rollback")
            await eventually(lambda: "redo" in handler.payloads())
    assert [e.detail for e in of_kind(events, "rollback")] == ["failed: RuntimeError"]


def test_on_rollback_must_be_callable() -> None:
    with pytest.raises(InvalidArgument, match="on_rollback"):
        ThreadRuntime(MemoryPubSub(), Blocking(), on_rollback=3)  # type: ignore[arg-type]


@pytest.mark.asyncio
@pytest.mark.parametrize("policy", ["rollback", "coalesce"])
async def test_a_late_request_never_affects_a_newer_signal(tmp_path: Path, policy: str) -> None:
    # A sender elsewhere stores A, then (a round trip later) the request of A's
    # policy, read by the owner on another subscription: it comes after A ran,
    # while B (sent after A) runs and C waits. It must neither roll back B nor
    # carry C off. D's request, read after A's, then acts as it should.
    taken: list[tuple[str, Signal]] = []
    rolled: list[str] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            taken.append((run.run_id, signal))
            if signal.payload == "B":
                # A rollback cancels B; a coalesce does not, so B ends on its own.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.Event().wait(), 1 if policy == "coalesce" else 60
                    )

    def on_rollback(thread_key: str, run_id: str) -> None:
        rolled.append(run_id)

    async with (
        from_url(f"sqlite:///{tmp_path / 'tenure.db'}") as sqlite,
        ThreadRuntime(sqlite, handler, idle_timeout=10, on_rollback=on_rollback) as rt,
    ):
        log: Any = sqlite
        await rt.send_signal("t", "start")

        async def sent_elsewhere(payload: str) -> Event:
            data = {"thread": "t", "payload": payload, "policy": policy}
            stored: Event = await log.publish(rt.topic("t"), Event(SIGNAL_TYPE, data))
            return stored

        async def request(signal: Event) -> None:
            data = {"signal": signal.id, "sent_at": signal.created_at, "policy": policy}
            await log.publish(rt.names.control("t"), Event(INTERRUPT, data))

        def payloads() -> list[Any]:
            return [s.payload for _, s in taken]

        a = await sent_elsewhere("A")
        await eventually(lambda: "A" in payloads())
        await sent_elsewhere("B")
        await eventually(lambda: "B" in payloads())
        await sent_elsewhere("C")
        await request(a)  # late: A ran already
        d = await sent_elsewhere("D")
        await request(d)
        await eventually(lambda: "D" in payloads())
    runs = {payload: run for run, s in taken for payload in [s.payload]}
    if policy == "rollback":
        assert payloads() == ["start", "A", "B", "D"]  # C, sent before D, was skipped
        assert rolled == [runs["B"]]
    else:
        # C was carried into D; B went on (it ends on its own timeout, not cancelled).
        assert payloads() == ["start", "A", "B", "D"]
        assert [s.payload for s in taken[-1][1].coalesced] == ["C"]
        assert rolled == []


class HeldOnStart:
    """A handler that records every signal it takes and holds on ``"start"`` until
    ``go`` is set; ``events`` collects the runtime's events."""

    def __init__(self) -> None:
        self.taken: list[Signal] = []
        self.go = asyncio.Event()
        self.events: list[RuntimeEvent] = []

    async def __call__(self, run: ThreadRun) -> None:
        async for signal in run.signals():
            self.taken.append(signal)
            if signal.payload == "start":
                await self.go.wait()

    def payloads(self) -> list[Any]:
        return [s.payload for s in self.taken]


async def stored_elsewhere(
    log: Any, rt: ThreadRuntime, payload: str, policy: str, stamped: float | None = None
) -> Event:
    """A signal stored by a sender in another process (``stamped``: its send time)."""
    data = {"thread": "t", "payload": payload, "policy": policy}
    stored: Event = await log.publish(rt.topic("t"), Event(SIGNAL_TYPE, data, created_at=stamped))
    return stored


async def requested_elsewhere(log: Any, rt: ThreadRuntime, signal_id: str, sent_at: float) -> None:
    """The request a coalescing sender in another process publishes after its signal."""
    data = {"signal": signal_id, "sent_at": sent_at, "policy": "coalesce"}
    await log.publish(rt.names.control("t"), Event(INTERRUPT, data))


@pytest.mark.asyncio
async def test_coalesce_follows_the_log_not_the_senders_clocks(tmp_path: Path) -> None:
    # Two senders elsewhere: X is stored first but stamped 5 s later than Y (a
    # sender's clock ahead, or a stamp taken before a slow insert). The owner
    # learns of both while busy. The last in the log (Y) runs, with X carried
    # into it: one further run, never X alone and then Y.
    handler = HeldOnStart()
    async with (
        from_url(f"sqlite:///{tmp_path / 'tenure.db'}") as sqlite,
        ThreadRuntime(sqlite, handler, idle_timeout=10, on_event=handler.events.append) as rt,
    ):
        await rt.send_signal("t", "start")
        await eventually(lambda: handler.payloads() == ["start"])
        now = time.time()
        x = await stored_elsewhere(sqlite, rt, "X", "coalesce", stamped=now + 5)
        y = await stored_elsewhere(sqlite, rt, "Y", "coalesce", stamped=now)
        for signal in (y, x):  # the requests, in either order
            await requested_elsewhere(sqlite, rt, signal.id or "", signal.created_at or 0.0)
        await eventually(lambda: len(of_kind(handler.events, "coalescing")) == 2)
        handler.go.set()
        await eventually(lambda: len(handler.taken) == 2)
        await asyncio.sleep(0.3)  # nothing else runs
    assert handler.payloads() == ["start", "Y"]
    assert [s.payload for s in handler.taken[1].coalesced] == ["X"]
    assert [(e.signal_id, e.detail) for e in of_kind(handler.events, "coalesced")] == [
        (x.id, f"into {y.id}")
    ]


@pytest.mark.asyncio
async def test_a_coalescing_signal_that_never_comes_does_not_hold_the_others(
    tmp_path: Path,
) -> None:
    # The owner learns of a coalescing signal that another owner had taken (it
    # never reaches this one). The signals read meanwhile are carried while the
    # owner waits for it, then run: the newest with the others.
    handler = HeldOnStart()
    async with (
        from_url(f"sqlite:///{tmp_path / 'tenure.db'}") as sqlite,
        ThreadRuntime(sqlite, handler, idle_timeout=0.5, on_event=handler.events.append) as rt,
    ):
        await rt.send_signal("t", "start")
        await eventually(lambda: handler.payloads() == ["start"])
        await requested_elsewhere(sqlite, rt, "taken-elsewhere", time.time())
        for payload in ("A", "B"):
            await stored_elsewhere(sqlite, rt, payload, "enqueue")
        await eventually(lambda: len(of_kind(handler.events, "coalescing")) == 1)
        handler.go.set()
        await eventually(lambda: len(handler.taken) == 2, timeout=10)
        await eventually(lambda: not rt.owned_threads(), timeout=10)
    assert handler.payloads() == ["start", "B"]
    assert [s.payload for s in handler.taken[1].coalesced] == ["A"]
