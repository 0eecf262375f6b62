"""Replies on the backends that share a thread's output between processes.

Two backend objects on one URL stand for two processes here (the owner and a
reader); ``test_output_processes.py`` uses real ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import tenure
from tenure import Fenced, OutputTruncated
from tenure.runtime import OutputItem, Retention, ThreadRun, ThreadRuntime

from ..conftest import TARGETS

OUTPUT_BACKENDS = ["sqlite", "redis", "postgres"]


@pytest.fixture(params=OUTPUT_BACKENDS)
def url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    target = TARGETS[request.param]
    yield target.isolated_url(unique, tmp_path)
    if target.cleanup is not None:
        target.cleanup(unique)


async def echo(run: ThreadRun) -> None:
    async for signal in run.signals():
        for word in str(signal.payload).split():
            await run.append(word)


async def idle(run: ThreadRun) -> None:
    async for _ in run.signals():
        pass


@pytest.mark.asyncio
async def test_a_reader_elsewhere_gets_the_reply_and_resumes(url: str) -> None:
    owner_backend = tenure.from_url(url)
    reader_backend = tenure.from_url(url)
    async with (
        owner_backend,
        reader_backend,
        ThreadRuntime(owner_backend, echo, output=True, idle_timeout=0.2) as owner,
        ThreadRuntime(reader_backend, idle, output=True, idle_timeout=0.2) as reader,
    ):
        sent = await owner.send_signal("t1", "one two three")
        items = await reader.wait_reply(sent, timeout=20)
        assert [i.kind for i in items] == [
            "signal_taken",
            "token",
            "token",
            "token",
            "signal_finished",
        ]
        assert [i.data for i in items if i.kind == "token"] == ["one", "two", "three"]
        assert {i.run_id for i in items} == {sent.run_id}
        seen: list[OutputItem] = []
        async for item in reader.follow("t1"):
            seen.append(item)
            if item.kind == "token":
                break
        async for item in reader.follow("t1", after=seen[-1].position):
            seen.append(item)
            if item.kind == "signal_finished":
                break
        assert [i.position for i in seen] == list(range(1, len(seen) + 1))
        assert seen[0].kind == "run_started" and seen[0].data["token"] == seen[0].token


@pytest.mark.asyncio
async def test_a_stale_writer_is_fenced_atomically(url: str) -> None:
    started = asyncio.Event()
    go_on = asyncio.Event()
    tried = asyncio.Event()
    outcome: list[BaseException] = []

    async def stale(run: ThreadRun) -> None:
        async for _ in run.signals():
            started.set()
            await go_on.wait()
            try:
                await run.append("late")
            except Fenced as exc:
                outcome.append(exc)
            tried.set()
            return

    backend = tenure.from_url(url)
    other = tenure.from_url(url)
    async with (
        backend,
        other,
        ThreadRuntime(backend, stale, output=True, idle_timeout=0.2, cancel_on_loss=False) as rt,
    ):
        await rt.send_signal("t1", "x")
        await asyncio.wait_for(started.wait(), 20)
        head = await rt._replies().head("t1")
        key = rt.lease_key("t1")
        record = await other.get_lease(key)
        assert record is not None
        assert await other.revoke_lease(key, record.token)
        assert (await other.acquire_lease(key, "successor", 60_000)).acquired
        go_on.set()
        await asyncio.wait_for(tried.wait(), 20)
        assert isinstance(outcome[0], Fenced)
        assert await rt._replies().head("t1") == head
        await other.release_lease(key, "successor")


@pytest.mark.asyncio
async def test_retention_by_count_tells_a_late_reader(url: str) -> None:
    async def chatty(run: ThreadRun) -> None:
        async for _ in run.signals():
            await run.append_many(list(range(30)))

    backend = tenure.from_url(url)
    async with (
        backend,
        ThreadRuntime(backend, chatty, output=Retention(max_items=10), idle_timeout=0.2) as rt,
    ):
        sent = await rt.send_signal("t1", "x")
        with pytest.raises(OutputTruncated) as caught:
            await rt.wait_reply(sent, timeout=20)
        assert caught.value.first > 1
        head = await rt._replies().head("t1")
        tail = []
        async for item in rt.follow("t1", after=head - 3):
            tail.append(item.position)
            if item.position == head:
                break
        assert tail == [head - 2, head - 1, head]


@pytest.mark.asyncio
async def test_retention_by_age_drops_the_aged_items_and_keeps_the_rest(url: str) -> None:
    """Items older than ``max_age`` go at the next append, the newest never; those
    still young are all kept, and a reader behind the cut is told where it is."""

    def words(items: list[OutputItem]) -> list[object]:
        return [item.data for item in items if item.kind == "token"]

    backend = tenure.from_url(url)
    async with (
        backend,
        ThreadRuntime(backend, echo, output=Retention(max_age=0.6), idle_timeout=0.2) as rt,
    ):
        sent = await rt.send_signal("t1", "a b c")
        assert words(await rt.wait_reply(sent, timeout=20)) == ["a", "b", "c"]
        await asyncio.sleep(1.2)  # the first session's items (its end too) age
        aged = await rt._replies().head("t1")
        sent = await rt.send_signal("t1", "d e")
        assert words(await rt.wait_reply(sent, timeout=20)) == ["d", "e"]
        sent = await rt.send_signal("t1", "f")
        assert words(await rt.wait_reply(sent, timeout=20)) == ["f"]
        head = await rt._replies().head("t1")
        with pytest.raises(OutputTruncated) as caught:
            await asyncio.wait_for(anext(aiter(rt.follow("t1", after=0))), 10)
        assert caught.value.first == aged + 1
        kept = []
        async for item in rt.follow("t1", after=aged):
            kept.append(item)
            if item.position == head:
                break
        assert [item.position for item in kept] == list(range(aged + 1, head + 1))
        assert words(kept) == ["d", "e", "f"]
