"""Child processes for the multi-process SQLite tests: ``python _child.py MODE DB ARGS...``.

Each mode prints one JSON document per line on stdout (flushed at once), so
the parent sees what was committed before it kills the child.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tenure import Event
from tenure.backends.sqlite import SqlitePubSub
from tenure.testing import eventually


def say(**doc: Any) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def wait_for_go(db: str) -> None:
    """Start together with the other children: spin until the parent's go-file appears."""
    go = Path(db + ".go")
    while not go.exists():
        time.sleep(0.001)


async def rounds(db: str, owner: str, count: int) -> None:
    """Try to win each of ``count`` keys once; report every outcome."""
    async with SqlitePubSub(db) as backend:
        await backend.get_lease_owner("warm-up")
        say(ready=True)
        wait_for_go(db)
        for r in range(count):
            res = await backend.acquire_lease(f"round-{r}", owner, 60_000)
            say(round=r, acquired=res.acquired, owner=res.owner, token=res.token)


async def mutex(db: str, owner: str, seconds: float) -> None:
    """Contend for one key; report each holding window on the host's monotonic clock."""
    async with SqlitePubSub(db) as backend:
        await backend.get_lease_owner("warm-up")
        say(ready=True)
        wait_for_go(db)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            res = await backend.acquire_lease("mutex", owner, 60_000)
            if not res.acquired:
                continue
            start_ns = time.monotonic_ns()
            await asyncio.sleep(0.001)
            end_ns = time.monotonic_ns()
            await backend.release_lease("mutex", owner)
            say(token=res.token, start=start_ns, end=end_ns)


async def writer(db: str, topic: str) -> None:
    """Write leases, events and raw batches until killed; report each commit after it returns."""

    def raw_batches() -> None:
        conn = sqlite3.connect(db, isolation_level=None, timeout=30)
        conn.execute("PRAGMA synchronous = NORMAL")
        batch = 0
        while True:
            batch += 1
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO scratch (batch, n, pad) VALUES (?, ?, ?)",
                [(batch, n, os.urandom(512)) for n in range(200)],
            )
            say(raw_in_txn=batch)
            time.sleep(0.005)  # hold the transaction open: the kill often lands here
            conn.execute("COMMIT")
            say(raw_committed=batch)
            # SQLite's write lock has no queue: without a pause this thread can
            # take it back at once, again and again, and starve the backend's
            # writer past its busy timeout (what this test checks is a kill).
            time.sleep(0.01)

    threading.Thread(target=raw_batches, daemon=True).start()
    async with SqlitePubSub(db) as backend:
        i = 0
        while True:
            i += 1
            res = await backend.acquire_lease(f"w-{i}", "writer", 600_000)
            say(lease=f"w-{i}", token=res.token)
            sent = await backend.publish(topic, Event(type="w", data=i))
            say(event=sent.id)


async def subscriber(db: str, topic: str, group: str, mode: str, vt: float) -> None:
    """Subscribe (``group`` '-' for fan-out); print each event; ``hang`` never acknowledges."""

    async def callback(event: Event) -> None:
        say(id=event.id, data=event.data, attempt=event.attempt, pid=os.getpid())
        if mode == "hang":
            await asyncio.sleep(3600)

    async with SqlitePubSub(db, visibility_timeout=vt) as backend:
        await backend.subscribe(topic, callback, group=None if group == "-" else group)
        say(ready=True)
        await asyncio.Event().wait()


async def holder(db: str, key: str) -> None:
    """Hold ``key`` until a line arrives on stdin, then release it."""
    async with SqlitePubSub(db) as backend:
        res = await backend.acquire_lease(key, "child", 60_000)
        say(held=res.acquired, token=res.token)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await backend.release_lease(key, "child")
        say(released=True)


async def waiter(db: str, key: str, poll_interval: str) -> None:
    """Wait once for a release of ``key``; report when parked (with the socket) and the outcome."""
    async with SqlitePubSub(db, poll_interval=float(poll_interval)) as backend:
        waiting = asyncio.create_task(backend.wait_lease_released(key, timeout=60))
        await eventually(lambda: backend._waiters.parked(key) == 1, timeout=30)
        say(parked=True, socket=backend._worker.wake.path)
        say(woken=await waiting)


async def forking_waiter(db: str, key: str) -> None:
    """Wait for ``key`` (listening), then fork a child that sleeps; report its pid."""
    async with SqlitePubSub(db, poll_interval=3600) as backend:
        waiting = asyncio.create_task(backend.wait_lease_released(key, timeout=60))
        await eventually(lambda: backend._waiters.parked(key) == 1, timeout=30)
        pid = os.fork()
        if pid == 0:  # the forked child: outlives its parent, does nothing
            quiet = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1):  # the parent's pipes close when the parent dies
                os.dup2(quiet, fd)
            signal.pause()
        say(parked=True, socket=backend._worker.wake.path, forked=pid)
        await waiting


async def publisher(db: str, topic: str) -> None:
    """Publish one event on ``topic`` for each line read on stdin; report its id."""
    async with SqlitePubSub(db) as backend:
        say(ready=True)
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, sys.stdin.readline):
            sent = await backend.publish(topic, Event(type="p", data=None))
            say(published=sent.id)


def lock_and_stop(db: str) -> None:
    """Take the write lock, then stop this process; commit when continued."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE tenure_meta SET value = value WHERE name = 'token'")
    say(locked=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    conn.execute("COMMIT")
    say(committed=True)


def main() -> None:
    mode, db, *args = sys.argv[1:]
    if mode == "rounds":
        asyncio.run(rounds(db, args[0], int(args[1])))
    elif mode == "mutex":
        asyncio.run(mutex(db, args[0], float(args[1])))
    elif mode == "writer":
        asyncio.run(writer(db, args[0]))
    elif mode == "subscriber":
        asyncio.run(subscriber(db, args[0], args[1], args[2], float(args[3])))
    elif mode == "holder":
        asyncio.run(holder(db, args[0]))
    elif mode == "waiter":
        asyncio.run(waiter(db, args[0], args[1]))
    elif mode == "forking-waiter":
        asyncio.run(forking_waiter(db, args[0]))
    elif mode == "publisher":
        asyncio.run(publisher(db, args[0]))
    elif mode == "lock-and-stop":
        lock_and_stop(db)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
