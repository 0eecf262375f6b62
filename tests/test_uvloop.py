"""tenure on uvloop (the ``tenure[fast]`` extra): the application runs its loop, tenure follows.

Each backend that reaches across threads or sockets (SQLite's worker thread and
change polling, Redis's pipelined connection, stream readers and release
listener) runs its lease and event basics, a woken waiter included, and a
thread runtime's signal round trip between two runtimes, inside
``asyncio.Runner(loop_factory=uvloop.new_event_loop)`` or ``uvloop.run``, on
real servers (the shared Redis under a prefix of the test's own, removed after).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

import tenure
from tenure import AcquireResult, Event, RefusalReason, ThreadRun, ThreadRuntime
from tenure.testing import eventually
from tests.support.targets import targets
from tests.support.waiting import until_parked

T = TypeVar("T")
TTL_MS = 10_000


@pytest.fixture(params=["memory", "sqlite", "redis"])
def url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    target = targets()[request.param]
    yield target.isolated_url(unique, tmp_path)
    if target.cleanup is not None:
        target.cleanup(unique)


def on_uvloop(main: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


async def _leases_and_events(url: str) -> None:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
    async with tenure.from_url(url) as backend:
        first = await backend.acquire_lease("key", "a", TTL_MS)
        assert first.acquired and first.owner == "a" and first.token is not None
        assert await backend.acquire_lease("key", "b", TTL_MS) == AcquireResult(
            False, "a", None, reason=RefusalReason.HELD
        )
        assert await backend.renew_lease("key", "a", TTL_MS)
        assert await backend.transfer_lease("key", "a", "b", TTL_MS)
        record = await backend.get_lease("key")
        assert record is not None and record.owner == "b" and record.token > first.token

        waiter = asyncio.create_task(backend.wait_lease_released("key", 10))
        await until_parked(backend, "key")
        await backend.release_lease("key", "b")
        assert await asyncio.wait_for(waiter, 10)
        assert await backend.get_lease_owner("key") is None

        events = tenure.events_of(backend)
        got: list[Any] = []

        async def on_event(event: Event) -> None:
            got.append(event.data)

        await events.subscribe("topic", on_event, group="g")
        for i in range(3):
            await events.publish("topic", Event("t", i))
        await eventually(lambda: len(got) == 3)
        assert sorted(got) == [0, 1, 2]
        await events.unsubscribe("topic", on_event)


def test_leases_and_events_on_uvloop(url: str) -> None:
    on_uvloop(_leases_and_events(url))


async def _signal_round_trip(url: str) -> None:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
    handled: list[tuple[str, Any]] = []

    def handler(name: str) -> Any:
        async def handle(run: ThreadRun) -> None:
            async for signal in run.signals():  # the run stays open: record each as it comes
                handled.append((name, signal.payload))  # noqa: PERF401

        return handle

    one = tenure.from_url(url)
    # memory:// is one process's memory: both runtimes share the instance.
    two = one if url.startswith("memory:") else tenure.from_url(url)
    try:
        async with (
            ThreadRuntime(one, handler("one"), process_id="one", idle_timeout=30) as owner,
            ThreadRuntime(two, handler("two"), process_id="two", idle_timeout=30) as other,
        ):
            woke = await owner.send_signal("thread", "first")
            assert woke.outcome == "wake"
            await eventually(lambda: ("one", "first") in handled)
            # Sent through the other runtime: forwarded to the owner's open run.
            routed = await other.send_signal("thread", "second")
            assert routed.outcome == "deliver"
            await eventually(lambda: ("one", "second") in handled)
            assert handled == [("one", "first"), ("one", "second")]
    finally:
        await one.aclose()
        if two is not one:
            await two.aclose()


def test_thread_runtime_signal_round_trip_on_uvloop(url: str) -> None:
    uvloop.run(_signal_round_trip(url))
