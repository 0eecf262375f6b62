"""A runtime renews the leases of its threads together, once per renew interval, each
lease still lost at its own renew deadline: refused alone, or lost at its own deadline
when the call that renews them all hangs (a paused private ``redis-server``).

The lease provider is the real backend behind ``Counting``, which counts the calls
the runtime makes (one ``renew_owned`` for all, or one ``renew_lease`` per thread).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tenure import BackendUnavailable, MemoryPubSub, RuntimeEvent, ThreadRun, ThreadRuntime
from tenure.backends.redis import RedisStreamsPubSub
from tenure.testing import eventually

from ..hold.support import Counting
from ..support.redis_server import RedisServer


class _Threads:
    """A handler whose runs take one signal and wait; when each run started, ended and
    was told its lease was lost (monotonic times, by run id)."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.lost: dict[str, tuple[float, str]] = {}

    async def handler(self, run: ThreadRun) -> None:
        async for _ in run.signals():
            self.started[run.run_id] = time.monotonic()
            try:
                await asyncio.sleep(3600)
            finally:
                self.ended[run.run_id] = time.monotonic()

    def on_event(self, event: RuntimeEvent) -> None:
        if event.kind == "lost" and event.run_id is not None:
            self.lost[event.run_id] = (time.monotonic(), event.detail or "")

    def runtime(self, backend: Any, lease_provider: Any, ttl_ms: int) -> ThreadRuntime:
        """A runtime on ``backend`` whose runs are these threads' and whose losses they note."""
        return ThreadRuntime(
            backend,
            self.handler,
            lease_provider=lease_provider,
            ttl_ms=ttl_ms,
            idle_timeout=3600,
            on_event=self.on_event,
        )


@pytest.mark.asyncio
async def test_the_leases_of_every_live_thread_are_renewed_in_one_call_per_interval() -> None:
    threads = _Threads()
    async with MemoryPubSub() as memory:
        counting = Counting(memory)
        rt = threads.runtime(memory, counting, ttl_ms=1500)
        async with rt:
            for i in range(20):
                await rt.send_signal(f"t{i}", i)
            await eventually(lambda: len(threads.started) == 20)
            before = counting.calls["renew_owned"]
            # Six renew intervals (500 ms each) once every thread is live.
            await eventually(lambda: counting.calls["renew_owned"] >= before + 6, timeout=10)
            assert counting.calls["renew_lease"] == 0
            assert not threads.ended  # every thread kept its lease
            renewed = counting.calls["renew_owned"]
            # One call per interval, not one per thread: the 20 threads started at
            # different times fell into step within an interval or two.
            assert renewed <= before + 8, renewed


@pytest.mark.asyncio
async def test_a_lease_refused_in_the_batch_is_lost_alone() -> None:
    threads = _Threads()
    with RedisServer(persistence=True) as server:
        backend = RedisStreamsPubSub.from_url(server.url)
        counting = Counting(backend)
        try:
            rt = threads.runtime(backend, counting, ttl_ms=1500)
            async with rt:
                for i in range(4):
                    await rt.send_signal(f"t{i}", i)
                await eventually(lambda: len(threads.started) == 4)
                leases = [(key, record) async for key, record in backend.scan_leases()]
                assert len(leases) == 4
                victim_key, victim = leases[0]
                victim_run = victim.owner.rpartition("/")[2]
                # Revoked: its next renewal, in the same call as the others', is refused.
                assert await backend.revoke_lease(victim_key)
                await eventually(lambda: victim_run in threads.lost, timeout=5)
                assert "refused" in threads.lost[victim_run][1]
                calls = counting.calls["renew_owned"]
                # The others' leases go on being renewed together, two more intervals.
                await eventually(lambda: counting.calls["renew_owned"] >= calls + 2, timeout=5)
                assert counting.calls["renew_lease"] == 0
                assert set(threads.lost) == {victim_run}
                assert set(threads.ended) == {victim_run}
                for key, record in leases[1:]:
                    now = await backend.get_lease(key)
                    assert now is not None and now.owner == record.owner
        finally:
            await backend.aclose()


@pytest.mark.asyncio
async def test_a_hung_batch_loses_each_lease_at_its_own_deadline_before_its_ttl() -> None:
    """Two threads started 0.8 s apart share one renewal call (the second one's is
    sent early to join it); the server is paused before that call, so it hangs.
    Each run ends at its own renew deadline: the first thread's loss does not take
    the second, and neither runs once its lease could expire on the server."""
    ttl_ms = 6000  # renew every 2 s, lost 4 s after the last renewal was sent
    threads = _Threads()
    with RedisServer(persistence=True) as server:
        backend = RedisStreamsPubSub.from_url(server.url, socket_timeout=30)
        counting = Counting(backend)
        try:
            rt = threads.runtime(backend, counting, ttl_ms=ttl_ms)
            async with rt:
                await rt.send_signal("first", 1)
                await eventually(lambda: len(threads.started) == 1)
                await asyncio.sleep(0.8)
                await rt.send_signal("second", 2)
                await eventually(lambda: len(threads.started) == 2)
                # When each lease expires on the server: no run may outlive it.
                expires: dict[str, float] = {}
                async for _, record in backend.scan_leases():
                    sent = time.monotonic()
                    expires[record.owner.rpartition("/")[2]] = sent + record.ttl_ms / 1000
                first, second = sorted(expires, key=expires.__getitem__)
                assert counting.calls["renew_owned"] == 0, "paused too late: renewed already"
                assert expires[second] - expires[first] > 0.4
                server.pause()
                try:
                    await eventually(lambda: len(threads.ended) == 2, timeout=15)
                finally:
                    server.resume()
                # One call for both, and it hung.
                assert counting.calls["renew_owned"] >= 1
                assert counting.calls["renew_lease"] == 0
        finally:
            await backend.aclose()
    for run in (first, second):
        assert "renew deadline" in threads.lost[run][1]
        assert threads.ended[run] < expires[run]
    # Each at its own deadline: the second outlived the first's.
    assert threads.lost[second][0] - threads.lost[first][0] > 0.2


class FailingBatches:
    """A backend whose ``renew_owned`` raises while ``failing`` (a connection that
    resets on every call); notes the size of each batch it was asked to renew."""

    def __init__(self, inner: MemoryPubSub) -> None:
        self.inner = inner
        self.failing = True
        self.batches: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def renew_owned(self, leases: list[tuple[str, str]], ttl_ms: int) -> list[bool]:
        self.batches.append(len(leases))
        if self.failing:
            raise BackendUnavailable("simulated network error") from OSError("connection reset")
        return await self.inner.renew_owned(leases, ttl_ms)


@pytest.mark.asyncio
async def test_a_failing_batch_is_retried_and_each_lease_lost_at_its_own_deadline() -> None:
    """Two threads started 0.3 s apart share one renewal call, which fails every
    time: it is retried, and each run ends at its own renew deadline (2 s after its
    own grant), the error named; the first loss does not take the second lease."""
    threads = _Threads()
    async with MemoryPubSub() as memory:
        failing = FailingBatches(memory)
        rt = threads.runtime(memory, failing, ttl_ms=3000)
        async with rt:
            await rt.send_signal("first", 1)
            await eventually(lambda: len(threads.started) == 1)
            await asyncio.sleep(0.3)
            await rt.send_signal("second", 2)
            # The sweep runs each thread again once it is lost: the first two runs count.
            await eventually(lambda: len(threads.ended) >= 2, timeout=10)
    assert failing.batches[0] == 2, failing.batches  # one call for both
    assert len(failing.batches) > 2  # retried
    first, second = list(threads.started)[:2]
    for run in (first, second):
        reason = threads.lost[run][1]
        assert "renew deadline" in reason and "simulated network error" in reason
    # Each at its own deadline: the second outlived the first's.
    assert threads.lost[second][0] - threads.lost[first][0] > 0.1
