"""Names, idempotent sends and double-texting policies, in one process (memory
backend; the deduplication of signal ids on every backend).

The cross-process versions run in ``test_runtime_processes.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tenure
from tenure import Event, InvalidArgument, MemoryPubSub, ThreadRun, ThreadRuntime
from tenure.runtime._log import SIGNAL_TYPE
from tenure.runtime._names import ThreadNames
from tenure.testing import eventually

from ..conftest import TARGETS

names_text = st.text(min_size=1, max_size=40)


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def events_url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    """An isolated URL of each backend that carries events."""
    target = TARGETS[request.param]
    yield target.isolated_url(unique, tmp_path)
    if target.cleanup is not None:
        target.cleanup(unique)


@given(names_text, names_text, names_text, names_text)
def test_names_are_injective_and_read_back(ns_a: str, key_a: str, ns_b: str, key_b: str) -> None:
    try:
        a, b = ThreadNames(ns_a), ThreadNames(ns_b)
        name_a, name_b = a.name(key_a), b.name(key_b)
    except InvalidArgument:
        return  # a lone surrogate: refused before anything is named
    assert (name_a == name_b) == ((ns_a, key_a) == (ns_b, key_b))
    assert a.thread_of(name_a) == key_a
    if ns_a != ns_b:
        assert b.thread_of(name_a) is None


def test_the_reported_collision_is_gone() -> None:
    assert ThreadNames("app").name("v2:42") != ThreadNames("app:v2").name("42")


@given(names_text, names_text, names_text, names_text)
def test_control_topics_are_never_thread_names(
    ns_a: str, key_a: str, ns_b: str, key_b: str
) -> None:
    try:
        control = ThreadNames(ns_a).control(key_a)
        names_b = ThreadNames(ns_b)
        name_b = names_b.name(key_b)
    except InvalidArgument:
        return
    assert control != name_b
    assert names_b.thread_of(control) is None  # the sweep never takes it for a thread


@pytest.mark.asyncio
async def test_namespaces_never_see_each_others_signals() -> None:
    got: dict[str, list[Any]] = {"app": [], "app:v2": []}

    def handler(namespace: str) -> Any:
        async def handle(run: ThreadRun) -> None:
            async for signal in run.signals():
                got[namespace].append((signal.thread_key, signal.payload))

        return handle

    async with MemoryPubSub() as memory:
        a = ThreadRuntime(memory, handler("app"), namespace="app", idle_timeout=0.05)
        b = ThreadRuntime(memory, handler("app:v2"), namespace="app:v2", idle_timeout=0.05)
        async with a, b:
            await a.send_signal("v2:42", "for app")
            await b.send_signal("42", "for app:v2")
            await eventually(lambda: len(got["app"]) == 1 and len(got["app:v2"]) == 1)
            await asyncio.sleep(0.2)
    assert got == {"app": [("v2:42", "for app")], "app:v2": [("42", "for app:v2")]}


@pytest.mark.asyncio
async def test_a_retried_send_with_the_same_id_is_handled_once() -> None:
    handled: list[tuple[str, Any]] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append((signal.id, signal.payload))  # noqa: PERF401 - as each is handled

    async with (
        MemoryPubSub() as memory,
        ThreadRuntime(memory, handler, idle_timeout=0.05) as rt,
    ):
        first = await rt.send_signal("t", "hello", signal_id="msg-1")
        again = await rt.send_signal("t", "hello", signal_id="msg-1")
        await rt.send_signal("t", "next", signal_id="msg-2")
        assert first.signal_id == again.signal_id == "msg-1"
        await eventually(lambda: len(handled) >= 2)
        await asyncio.sleep(0.2)
    assert handled == [("msg-1", "hello"), ("msg-2", "next")]


@pytest.mark.asyncio
async def test_only_a_callers_signal_id_is_kept_for_deduplication(events_url: str) -> None:
    """A caller's id is kept, so a retried send stores nothing; a generated one
    is not (nobody could send it again), so such a send costs a plain publish.

    Seen through the backend's own deduplication: the same two ids published
    again straight to the thread's topic. Keeping the generated id too (as the
    runtime did) makes the second publish return the first signal, and fails.
    """
    handled: list[tuple[str, Any]] = []

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append((signal.id, signal.payload))  # noqa: PERF401 - as each is handled

    async with (
        tenure.events_of(tenure.from_url(events_url)) as backend,
        ThreadRuntime(backend, handler, idle_timeout=30) as rt,
    ):
        mine = await rt.send_signal("t", "kept", signal_id="caller-1")
        ours = await rt.send_signal("t", "not kept")
        assert mine.signal_id == "caller-1" and len(ours.signal_id) == 32
        await eventually(lambda: len(handled) == 2)

        def again(signal_id: str) -> Event:
            return Event(SIGNAL_TYPE, {"thread": "t", "payload": "again"}, None, signal_id)

        first = await backend.publish(rt.topic("t"), again("caller-1"))
        assert first.data["payload"] == "kept"  # deduplicated: the first one comes back
        stored = await backend.publish(rt.topic("t"), again(ours.signal_id))
        assert stored.data["payload"] == "again"  # stored anew: no record was kept
        await eventually(lambda: len(handled) == 3)
    assert handled == [
        ("caller-1", "kept"),
        (ours.signal_id, "not kept"),
        (ours.signal_id, "again"),
    ]


@pytest.mark.asyncio
async def test_a_bad_signal_id_is_refused() -> None:
    async def handler(run: ThreadRun) -> None:
        pass

    async with MemoryPubSub() as memory, ThreadRuntime(memory, handler) as rt:
        with pytest.raises(InvalidArgument, match="signal_id"):
            await rt.send_signal("t", 1, signal_id="")


@pytest.mark.asyncio
async def test_reject_answers_rejected_while_a_run_is_active_and_stores_nothing() -> None:
    handled: list[Any] = []
    busy = asyncio.Event()
    finish = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.append(signal.payload)
            busy.set()
            await finish.wait()

    async with MemoryPubSub() as memory:
        a = ThreadRuntime(memory, handler, policy="reject", idle_timeout=0.05)
        b = ThreadRuntime(memory, handler, policy="reject", idle_timeout=0.05)
        async with a, b:
            assert (await a.send_signal("t", 1)).outcome == "wake"
            await asyncio.wait_for(busy.wait(), 5)
            here = await a.send_signal("t", 2)  # the run is in this process
            there = await b.send_signal("t", 3)  # ... and seen from another one
            assert (here.outcome, there.outcome) == ("rejected", "rejected")
            finish.set()
            await eventually(lambda: not a.owned_threads())
            assert (await b.send_signal("t", 4)).outcome == "wake"
            await eventually(lambda: handled == [1, 4])
            await asyncio.sleep(0.2)
    assert handled == [1, 4]


@pytest.mark.asyncio
async def test_interrupt_cancels_the_active_run_and_starts_one_with_the_new_signal() -> None:
    seen: list[tuple[str, Any]] = []
    interrupted: list[bool] = []
    busy = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        try:
            async for signal in run.signals():
                seen.append((run.run_id, signal.payload))
                if signal.payload == "slow":
                    busy.set()
                    await asyncio.sleep(3600)
        except asyncio.CancelledError:
            interrupted.append(run.interrupted)
            raise

    async with MemoryPubSub() as memory:
        a = ThreadRuntime(memory, handler, policy="interrupt", idle_timeout=0.05)
        b = ThreadRuntime(memory, handler, policy="interrupt", idle_timeout=0.05)
        async with a, b:
            await a.send_signal("t", "slow")
            await asyncio.wait_for(busy.wait(), 5)
            await b.send_signal("t", "queued-behind")  # from another process: still routed
            await b.send_signal("t", "new")
            await eventually(lambda: any(p == "new" for _, p in seen))
            await asyncio.sleep(0.2)
    # Each newer signal interrupts the run before it; the newest runs to the end.
    assert interrupted and all(interrupted)
    runs = [run for run, _ in seen]
    assert seen[0][1] == "slow" and seen[-1][1] == "new"
    assert runs[-1] != runs[0]  # the new signal started a new run
    assert [p for _, p in seen].count("new") == 1


def test_an_unknown_policy_is_refused() -> None:
    async def handler(run: ThreadRun) -> None:
        pass

    with pytest.raises(InvalidArgument, match="policy"):
        ThreadRuntime(MemoryPubSub(), handler, policy="drop")  # type: ignore[arg-type]
