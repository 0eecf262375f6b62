"""Wake-ups between processes sharing one file (sqlite/_wake.py), with real processes and sockets.

An instance created with ``poll_interval=3600`` polls once an hour, so a waiter
of it that wakes within the test's timeout was woken by a datagram. Lease
waiters have no other timer; subscribers do (the maintenance tick), so event
wake-ups are checked on a listener's datagrams as well.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from pathlib import Path

import pytest

from tenure import Event
from tenure.backends.sqlite import SqlitePubSub
from tenure.backends.sqlite._wake import _QUEUE_LENGTH, FREED, PUBLISHED, WakeChannel
from tenure.testing import eventually

from ..support.waiting import until_parked
from .conftest import Child, Spawner

NO_POLL = "3600"  # seconds: no safety poll within a test


def sockets(db: str) -> set[str]:
    wake_dir = Path(db + ".tenure-wake")
    return {str(p) for p in wake_dir.iterdir()} if wake_dir.exists() else set()


async def parked_waiter(spawn: Spawner, db: str, key: str, poll: str = NO_POLL) -> Child:
    child = await spawn("waiter", db, key, poll)
    doc = await child.line()
    assert doc["parked"] is True
    assert doc["socket"] in sockets(db)
    return child


async def hold(backend: SqlitePubSub, key: str) -> None:
    assert (await backend.acquire_lease(key, "parent", 60_000)).acquired


async def child_holding(spawn: Spawner, db: str, key: str) -> Child:
    holder = await spawn("holder", db, key)
    assert (await holder.line())["held"] is True
    return holder


async def child_releases(holder: Child) -> None:
    await holder.write("release\n")
    assert await holder.line() == {"released": True}


async def parked_here(backend: SqlitePubSub, key: str) -> asyncio.Task[bool]:
    waiting = asyncio.create_task(backend.wait_lease_released(key, timeout=60))
    await until_parked(backend, key)
    return waiting


@pytest.mark.asyncio
async def test_a_release_in_another_process_wakes_a_waiter_through_its_socket(
    spawn: Spawner, db: str
) -> None:
    holder = await child_holding(spawn, db, "k")
    async with SqlitePubSub(db, poll_interval=float(NO_POLL)) as backend:
        waiting = await parked_here(backend, "k")
        mine = backend._worker.wake.path
        assert mine in sockets(db)
        await child_releases(holder)
        assert await waiting is True
    assert mine not in sockets(db)  # closing removes the socket


@pytest.mark.asyncio
async def test_a_publish_in_another_process_rings_and_reaches_the_subscriber(
    spawn: Spawner, db: str
) -> None:
    got: list[Event] = []
    rung: list[bytes] = []

    async def on_event(event: Event) -> None:
        got.append(event)

    async with SqlitePubSub(db, poll_interval=float(NO_POLL)) as backend:
        await backend.subscribe("t", on_event)
        listener = WakeChannel(db)  # a second listener, to see the datagram itself
        assert listener.listen(rung.extend)
        try:
            publisher = await spawn("publisher", db, "t")
            assert await publisher.line() == {"ready": True}
            await publisher.write("one\n")
            sent = (await publisher.line())["published"]
            await eventually(lambda: [e.id for e in got] == [sent], timeout=30)
            assert rung == [bytes((PUBLISHED,)) + b"t"]
        finally:
            listener.close()


@pytest.mark.asyncio
async def test_eight_processes_are_all_woken_by_one_release(spawn: Spawner, db: str) -> None:
    async with SqlitePubSub(db) as backend:
        await hold(backend, "k")
        children = [await spawn("waiter", db, "k", NO_POLL) for _ in range(8)]
        for child in children:
            assert (await child.line())["parked"] is True
        await backend.release_lease("k", "parent")
        for child in children:
            assert await child.line() == {"woken": True}


@pytest.mark.asyncio
async def test_a_sender_finds_a_socket_bound_after_its_last_send(spawn: Spawner, db: str) -> None:
    async with SqlitePubSub(db) as backend:
        await hold(backend, "k1")
        await hold(backend, "k2")
        first = await parked_waiter(spawn, db, "k1")
        await backend.release_lease("k1", "parent")  # lists the directory: one socket
        assert await first.line() == {"woken": True}
        second = await parked_waiter(spawn, db, "k2")  # bound after that listing
        await backend.release_lease("k2", "parent")
        assert await second.line() == {"woken": True}


@pytest.mark.asyncio
async def test_a_forged_or_garbled_datagram_costs_a_look_and_decides_nothing(
    spawn: Spawner, db: str
) -> None:
    holder = await child_holding(spawn, db, "k")
    async with SqlitePubSub(db, poll_interval=float(NO_POLL)) as backend:
        forger = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            waiting = await parked_here(backend, "k")
            target = backend._worker.wake.path
            forger.sendto(b"?garbage", target)  # not understood: a look, which finds k held
            forger.sendto(bytes((FREED,)) + b"k", target)  # a lie: wakes the waiter to look
            assert await waiting is True
            assert not (await backend.acquire_lease("k", "parent", 1000)).acquired
        finally:
            forger.close()
        await child_releases(holder)
        assert (await backend.acquire_lease("k", "parent", 1000)).acquired


@pytest.mark.asyncio
async def test_the_socket_of_a_killed_process_is_removed_and_the_others_still_woken(
    spawn: Spawner, db: str
) -> None:
    async with SqlitePubSub(db) as backend:
        await hold(backend, "k")
        killed = await parked_waiter(spawn, db, "k")
        stale = sockets(db)
        killed.send(signal.SIGKILL)
        await killed.wait()
        assert stale <= sockets(db)  # SIGKILL leaves the socket file behind
        alive = await parked_waiter(spawn, db, "k")
        await backend.release_lease("k", "parent")  # sends before it returns
        assert not stale & sockets(db)
        assert await alive.line() == {"woken": True}


@pytest.mark.asyncio
async def test_the_socket_of_a_killed_process_is_removed_while_its_forked_child_lives(
    spawn: Spawner, db: str
) -> None:
    async with SqlitePubSub(db) as backend:
        await hold(backend, "k")
        parent = await spawn("forking-waiter", db, "k")
        doc = await parent.line()
        try:
            parent.send(signal.SIGKILL)
            await parent.wait()
            assert doc["socket"] in sockets(db)
            await backend.release_lease("k", "parent")
            assert doc["socket"] not in sockets(db)  # refused: the child kept no copy open
        finally:
            os.kill(doc["forked"], signal.SIGKILL)


@pytest.mark.asyncio
async def test_a_release_dropped_by_a_full_queue_is_found_when_the_receiver_reads_again(
    spawn: Spawner, db: str
) -> None:
    others = [f"other-{i}" for i in range(_QUEUE_LENGTH + 10)]
    async with SqlitePubSub(db) as backend:
        for key in [*others, "k"]:
            await hold(backend, key)
        child = await parked_waiter(spawn, db, "k")
        child.send(signal.SIGSTOP)  # its queue fills up; the later sends fail
        try:
            for key in [*others, "k"]:
                await backend.release_lease(key, "parent")
        finally:
            child.send(signal.SIGCONT)
        assert await child.line() == {"woken": True}


@pytest.mark.asyncio
async def test_a_socket_removed_behind_its_back_is_covered_by_the_safety_poll_and_bound_again(
    spawn: Spawner, db: str
) -> None:
    holder = await child_holding(spawn, db, "k")
    async with SqlitePubSub(db) as backend:
        waiting = await parked_here(backend, "k")
        lost = backend._worker.wake.path
        os.unlink(lost)  # the release's datagram now goes nowhere
        await child_releases(holder)
        assert await waiting is True
        await eventually(lambda: backend._worker.wake.path in sockets(db), timeout=30)
        assert backend._worker.wake.path != lost


@pytest.mark.asyncio
@pytest.mark.parametrize("cause", ["path-too-long", "directory-is-a-file"])
async def test_without_sockets_waiters_are_woken_by_polling_and_the_log_says_so_once(
    spawn: Spawner, short_tmp: Path, caplog: pytest.LogCaptureFixture, cause: str
) -> None:
    if cause == "path-too-long":
        folder = short_tmp / ("d" * max(1, 110 - len(str(short_tmp))))
        folder.mkdir()
        db = str(folder / "shared.db")
    else:
        db = str(short_tmp / "shared.db")
        Path(db + ".tenure-wake").write_text("in the way")  # noqa: ASYNC240 - one tiny file
    holder = await child_holding(spawn, db, "k")
    with caplog.at_level(logging.WARNING, logger="tenure.sqlite"):
        async with SqlitePubSub(db) as first, SqlitePubSub(db) as second:
            waiting = [await parked_here(b, "k") for b in (first, second)]
            await child_releases(holder)
            assert await asyncio.gather(*waiting) == [True, True]
    said = [r for r in caplog.records if "no wake-up sockets" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert (cause == "path-too-long") == ("bytes" in said[0].getMessage())
