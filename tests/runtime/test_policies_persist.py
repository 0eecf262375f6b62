"""The ``persist`` policy (Mastra's ``ifIdle: persist``): a signal stored without
waking an idle thread; the next send that wakes it runs the persisted ones first.

On every backend that carries signals (memory, SQLite file, Redis, PostgreSQL),
with two runtimes on one backend standing for two processes, both sweeping
often. The owner killed while persisted signals wait is in
``test_policies_processes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

import tenure
from tenure import Capability, MemoryPubSub, RuntimeEvent, Signal, ThreadRun, ThreadRuntime
from tenure.runtime._identity import is_opening
from tenure.testing import eventually

from .test_policies import Blocking, of_kind

# Sweeps every 50 ms: a persisted signal that a sweep would run would run soon.
FAST: dict[str, Any] = {"idle_timeout": 0.05, "sweep_interval": 0.05, "ttl_ms": 2000}
# Long enough for several sweeps of both runtimes.
SWEEPS = 0.6


class Backends:
    """Backend objects of one URL: one shared by every runtime on memory://, whose
    signals live in that object; a new one per runtime otherwise."""

    def __init__(self, url: str, stack: contextlib.AsyncExitStack) -> None:
        self._url = url
        self._stack = stack
        self._memory: MemoryPubSub | None = None

    async def new(self) -> Any:
        if self._url.startswith("memory:"):
            if self._memory is None:
                self._memory = await self._stack.enter_async_context(MemoryPubSub())
            return self._memory
        return await self._stack.enter_async_context(tenure.from_url(self._url))


@contextlib.asynccontextmanager
async def backends(url: str) -> AsyncIterator[Backends]:
    async with contextlib.AsyncExitStack() as stack:
        yield Backends(url, stack)


class Recording:
    """A handler that records what each run takes, in order."""

    def __init__(self) -> None:
        self.taken: list[tuple[str, Signal]] = []

    async def __call__(self, run: ThreadRun) -> None:
        async for signal in run.signals():
            self.taken.append((run.run_id, signal))

    def payloads(self) -> list[Any]:
        return [signal.payload for _, signal in self.taken]


async def drained(rt: ThreadRuntime, thread_key: str) -> None:
    """Wait until ``thread_key`` has no unfinished signal (fail after 10 s)."""
    for _ in range(500):
        if not (await rt.thread_status(thread_key)).pending:
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"thread {thread_key!r} still has unfinished signals")


@pytest.mark.asyncio
async def test_a_persisted_signal_waits_stored_and_the_next_waking_send_runs_it_first(
    signals_url: str,
) -> None:
    handler = Recording()
    events: list[RuntimeEvent] = []
    async with backends(signals_url) as made:
        owner = ThreadRuntime(await made.new(), handler, on_event=events.append, **FAST)
        other = ThreadRuntime(await made.new(), handler, on_event=events.append, **FAST)
        async with owner, other:
            first = await owner.send_signal("t", "p1", policy="persist")
            second = await other.send_signal("t", "p2", policy="persist")
            for sent in (first, second):
                assert (sent.outcome, sent.run_id, sent.policy) == ("persisted", None, "persist")
            # Both runtimes sweep every 50 ms and see the thread's unfinished signals.
            await asyncio.sleep(SWEEPS)
            assert handler.taken == []
            status = await owner.thread_status("t")
            assert status.pending
            # No run holds it; a sweep's session may be looking, asleep ("opening").
            assert status.owner is None or is_opening(status.owner)
            assert of_kind(events, "takeover") == of_kind(events, "wake") == []

            woke = await other.send_signal("t", "now")
            assert woke.outcome == "wake"
            await eventually(lambda: handler.payloads() == ["p1", "p2", "now"])
            # The persisted ones first, in log order.
            assert [s.id for _, s in handler.taken] == [
                first.signal_id,
                second.signal_id,
                woke.signal_id,
            ]
            await drained(owner, "t")


@pytest.mark.asyncio
async def test_persisted_signals_survive_a_restart_and_run_at_the_next_wake(
    signals_url: str,
) -> None:
    handler = Recording()
    async with backends(signals_url) as made:
        async with ThreadRuntime(await made.new(), handler, **FAST) as before:
            kept = [await before.send_signal("t", n, policy="persist") for n in range(3)]
            await asyncio.sleep(SWEEPS)
        assert handler.taken == []
        async with ThreadRuntime(await made.new(), handler, **FAST) as after:
            await asyncio.sleep(SWEEPS)  # its sweeps find them: they stay stored
            assert handler.taken == []
            assert (await after.thread_status("t")).pending
            woke = await after.send_signal("t", "wake")
            await eventually(lambda: len(handler.taken) == 4)
    assert [s.id for _, s in handler.taken] == [s.signal_id for s in kept] + [woke.signal_id]
    assert handler.payloads() == [0, 1, 2, "wake"]


@pytest.mark.asyncio
async def test_a_persist_send_retried_with_its_id_stores_it_once(signals_url: str) -> None:
    handler = Recording()
    async with backends(signals_url) as made:
        owner = ThreadRuntime(await made.new(), handler, **FAST)
        other = ThreadRuntime(await made.new(), handler, **FAST)
        async with owner, other:
            first = await owner.send_signal("t", "once", signal_id="m-1", policy="persist")
            again = await other.send_signal("t", "once", signal_id="m-1", policy="persist")
            assert first.signal_id == again.signal_id == "m-1"
            assert again.outcome == "persisted"
            await asyncio.sleep(SWEEPS)
            assert handler.taken == []
            woke = await owner.send_signal("t", "next")
            await eventually(lambda: "next" in handler.payloads())
            await asyncio.sleep(SWEEPS)
    assert [s.id for _, s in handler.taken] == ["m-1", woke.signal_id]


@pytest.mark.asyncio
@pytest.mark.parametrize("sender_is_owner", [True, False], ids=["same-runtime", "other-runtime"])
async def test_a_signal_persisted_while_a_run_is_active_is_taken_in_order(
    signals_url: str, sender_is_owner: bool
) -> None:
    handler = Blocking()
    async with backends(signals_url) as made:
        owner = ThreadRuntime(await made.new(), handler, **FAST)
        other = ThreadRuntime(await made.new(), handler, **FAST)
        async with owner, other:
            await owner.send_signal("t", "slow")
            await asyncio.wait_for(handler.busy.wait(), 10)
            sender = owner if sender_is_owner else other
            persisted = await sender.send_signal("t", "p", policy="persist")
            assert persisted.outcome == "persisted"
            queued = await sender.send_signal("t", "q")
            assert queued.outcome == "deliver"
            handler.go.set()
            await eventually(lambda: handler.payloads() == ["slow", "p", "q"])
            await asyncio.sleep(SWEEPS)
    assert handler.payloads() == ["slow", "p", "q"]


class CountedLeases:
    """The memory backend's leases, counting how often each key is granted."""

    capabilities = Capability.RECORD

    def __init__(self, inner: MemoryPubSub) -> None:
        self.inner = inner
        self.granted: Counter[str] = Counter()

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> tenure.AcquireResult:
        result = await self.inner.acquire_lease(key, owner, ttl_ms)
        if result.acquired:
            self.granted[key] += 1
        return result

    async def get_lease_owner(self, key: str) -> str | None:
        return await self.inner.get_lease_owner(key)

    async def get_lease(self, key: str) -> tenure.LeaseRecord | None:
        return await self.inner.get_lease(key)

    async def release_lease(self, key: str, owner: str) -> None:
        await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)


@pytest.mark.asyncio
async def test_the_sweep_looks_at_a_thread_left_with_persisted_signals_ever_less_often() -> None:
    handler = Recording()
    async with MemoryPubSub() as memory:
        leases = CountedLeases(memory)
        options = {**FAST, "sweep_interval": 0.02}
        async with ThreadRuntime(memory, handler, lease_provider=leases, **options) as rt:
            await rt.send_signal("t", "kept", policy="persist")
            # About 50 sweeps; a look at the thread is a session, and a lease granted.
            await asyncio.sleep(1.0)
            looks = leases.granted[rt.topic("t")]
            assert 2 <= looks <= 15, looks
            assert handler.taken == []
            await rt.send_signal("t", "wake")
            await eventually(lambda: handler.payloads() == ["kept", "wake"])
