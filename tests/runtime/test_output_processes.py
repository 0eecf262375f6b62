"""Replies across real processes, with faults: SQLite, Redis and PostgreSQL.

Owners are ``_output_worker.py`` processes, killed (SIGKILL) or paused
(SIGSTOP past their TTL, then SIGCONT) for real; the reader is this process,
on a backend object of its own and a runtime that is never started (it reads,
it runs nothing).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import tenure
from tenure.runtime import OutputItem, ThreadRun, ThreadRuntime

from .test_runtime_processes import Spawner, Worker, url

__all__ = ["url"]  # the fixture, parametrized over the three shared backends

WORKER = Path(__file__).with_name("_output_worker.py")
THREAD = "conversation"


class OutputSpawner(Spawner):
    async def __call__(self, name: str, *options: str) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            self.url,
            name,
            *options,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = Worker(name, proc)
        self.workers.append(worker)
        await worker.wait(lambda: bool(worker.of("ready")))
        return worker


@pytest_asyncio.fixture
async def spawn(url: str) -> AsyncIterator[OutputSpawner]:
    spawner = OutputSpawner(url)
    try:
        yield spawner
    finally:
        await spawner.cleanup()


async def nothing(run: ThreadRun) -> None:
    async for _ in run.signals():
        pass


@pytest_asyncio.fixture
async def reader(url: str) -> AsyncIterator[ThreadRuntime]:
    async with tenure.from_url(url) as backend:
        runtime = ThreadRuntime(backend, nothing, output=True)
        try:
            yield runtime
        finally:
            await runtime.aclose()


class Follower:
    """Reads a thread's output in the background, reconnecting on demand."""

    def __init__(self, runtime: ThreadRuntime) -> None:
        self.runtime = runtime
        self.items: list[OutputItem] = []
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def connect(self) -> None:
        after = self.items[-1].position if self.items else 0
        self.task = asyncio.ensure_future(self._read(after))

    async def disconnect(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def _read(self, after: int) -> None:
        async for item in self.runtime.follow(THREAD, after=after):
            self.items.append(item)
            self.changed.set()

    async def until(self, predicate: Any, timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate(self.items):
                self.changed.clear()
                await self.changed.wait()


def assert_exactly_once_in_order(items: list[OutputItem]) -> None:
    assert [i.position for i in items] == list(range(1, len(items) + 1))


def finished_by_other(signal_id: str, run_id: str) -> Any:
    return lambda items: any(
        i.kind == "signal_finished" and i.signal_id == signal_id and i.run_id != run_id
        for i in items
    )


def tokens_of(run_id: str, count: int) -> Any:
    return lambda items: sum(1 for i in items if i.run_id == run_id and i.kind == "token") >= count


@pytest.mark.asyncio
async def test_a_paused_owner_resumed_after_a_takeover_lands_nothing_and_is_told(
    spawn: OutputSpawner, reader: ThreadRuntime
) -> None:
    old = await spawn("old", "--no-cancel")
    await spawn("new")
    follower = Follower(reader)
    follower.connect()
    sent = await old.send(THREAD, {"tokens": 10_000, "delay": 0.02})
    stale = sent["run_id"]
    assert sent["outcome"] == "wake"
    await follower.until(tokens_of(stale, 3))
    old.pause()  # mid-reply: it appends every 20 ms
    await follower.until(finished_by_other(sent["signal_id"], stale))
    old.resume()
    await old.wait(lambda: bool(old.of("fenced", run=stale)))
    # Whatever it tried after resuming went nowhere: the reply is the successor's.
    reply = await reader.wait_reply(
        tenure.runtime.SendResult("wake", stale, sent["signal_id"], THREAD, 0), timeout=30
    )
    await follower.disconnect()
    items = follower.items
    assert_exactly_once_in_order(items)
    first_new = next(i.position for i in items if i.run_id != stale)
    assert not [i for i in items if i.run_id == stale and i.position > first_new]
    landed = {d["pos"] for d in old.of("appended", run=stale)}
    assert max(landed) < first_new
    cut = [i for i in items if i.kind == "run_lost"]
    assert len(cut) == 1 and cut[0].data["run_id"] == stale
    assert cut[0].signal_id == sent["signal_id"]
    assert reply[-1].kind == "signal_finished" and reply[-1].run_id != stale


@pytest.mark.asyncio
async def test_an_owner_killed_mid_reply_and_a_reader_reconnecting_during_the_takeover(
    spawn: OutputSpawner, reader: ThreadRuntime
) -> None:
    dead = await spawn("dead")
    await spawn("heir")
    follower = Follower(reader)
    follower.connect()
    sent = await dead.send(THREAD, {"tokens": 10_000, "delay": 0.02})
    killed = sent["run_id"]
    await follower.until(tokens_of(killed, 3))
    await follower.disconnect()  # the reader goes away ...
    dead.kill()
    await asyncio.sleep(0.5)  # ... and comes back while the lease has not expired yet
    follower.connect()
    await follower.until(finished_by_other(sent["signal_id"], killed))
    await follower.disconnect()
    items = follower.items
    assert_exactly_once_in_order(items)
    kinds = [i.kind for i in items]
    cut = kinds.index("run_lost")
    assert items[cut].data["run_id"] == killed
    assert {i.run_id for i in items[:cut]} == {killed}
    assert kinds[cut + 1 : cut + 3] == ["run_started", "signal_taken"]
    assert kinds[cut + 3 :].index("signal_finished") == 3  # the heir's 3 tokens, then done
    # The sender's view: the partial reply, the cut, the successor's whole reply.
    reply = await reader.wait_reply(
        tenure.runtime.SendResult("wake", killed, sent["signal_id"], THREAD, 0), timeout=30
    )
    assert [i.position for i in reply] == [
        i.position for i in items if i.signal_id == sent["signal_id"]
    ]
    assert [i.kind for i in reply if i.run_id != killed][-4:] == ["token"] * 3 + ["signal_finished"]


@pytest.mark.asyncio
async def test_a_cancel_from_a_third_process_stops_the_run_and_a_late_one_stops_nothing(
    spawn: OutputSpawner, reader: ThreadRuntime
) -> None:
    owner = await spawn("owner")
    third = await spawn("third")
    follower = Follower(reader)
    follower.connect()
    sent = await owner.send(THREAD, {"tokens": 10_000, "delay": 0.02})
    first_run = sent["run_id"]
    await follower.until(tokens_of(first_run, 3))
    third._ids += 1
    assert third.proc.stdin is not None
    third.proc.stdin.write(
        f'{{"op": "cancel", "id": {third._ids}, "thread": "{THREAD}"}}\n'.encode()
    )
    await third.proc.stdin.drain()
    await owner.wait(lambda: bool(owner.of("run_end", run=first_run)))
    assert owner.of("run_end", run=first_run)[0]["how"] == "interrupted"
    reply = await reader.wait_reply(
        tenure.runtime.SendResult("wake", first_run, sent["signal_id"], THREAD, 0), timeout=30
    )
    assert [i.kind for i in reply][-2:] == ["cancel", "run_ended"]
    assert reply[-1].data == {"end": "interrupted"}
    # A cancel naming the first run, arriving while a later run holds the thread.
    again = await owner.send(THREAD, {"tokens": 30, "delay": 0.02})
    await follower.until(tokens_of(again["run_id"], 1) if again["run_id"] else lambda _: True)
    later = await reader.cancel(THREAD, run_id=first_run)
    assert later == first_run
    done = await reader.wait_reply(
        tenure.runtime.SendResult("wake", None, again["signal_id"], THREAD, 0), timeout=60
    )
    assert done[-1].kind == "signal_finished"
    assert sum(1 for i in done if i.kind == "token") == 30
    await follower.disconnect()
