"""SQLite backend benchmark: tenure against raw sqlite3 doing the same writes, in the same run.

Usage: ``python benchmarks/sqlite.py [--cycles N] [--seconds S]``

1. Sequential acquire+release cycles. The baseline issues the same statements
   (BEGIN IMMEDIATE, the lease read, the token bump, the insert, COMMIT; then
   BEGIN IMMEDIATE, the delete, COMMIT) with the same driver and pragmas (WAL,
   synchronous=NORMAL, busy_timeout), run the same way: on one dedicated thread
   with its own connection, awaited from the event loop. A raw run called
   directly on the loop thread (no hand-off) is printed for context.
2. Four processes contending on the same 100 keys (acquire, release when won),
   tenure and raw, each for ``--seconds``.
3. ``renew_leases`` of 10,000 keys in one call.
4. Cross-process delivery latency (publisher in a child process) and the CPU
   used by an idle subscriber.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tenure import Event
from tenure.backends.sqlite import SqlitePubSub

TTL_MS = 30_000


class RawLeases:
    """The same writes as tenure's acquire and release, without tenure."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(
            path, timeout=5.0, isolation_level=None, check_same_thread=False
        )
        self.conn.execute("PRAGMA busy_timeout = 5000")
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")

    def acquire(self, key: bytes, owner: bytes, ttl_ms: int) -> int | None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        now = time.time()
        row = conn.execute(
            "SELECT owner, token, deadline FROM tenure_leases WHERE key = ?", (key,)
        ).fetchone()
        token: int | None
        if row is not None and row[2] > now:
            token = row[1] if row[0] == owner else None
            if token is not None:
                conn.execute(
                    "UPDATE tenure_leases SET deadline = ? WHERE key = ?",
                    (now + ttl_ms / 1000, key),
                )
        else:
            token = conn.execute(
                "UPDATE tenure_meta SET value = value + 1 WHERE name = 'token' RETURNING value"
            ).fetchone()[0]
            conn.execute(
                "INSERT OR REPLACE INTO tenure_leases (key, owner, token, deadline) VALUES (?, ?, ?, ?)",
                (key, owner, token, now + ttl_ms / 1000),
            )
        conn.execute("COMMIT")
        return token

    def release(self, key: bytes, owner: bytes) -> bool:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        n = conn.execute(
            "DELETE FROM tenure_leases WHERE key = ? AND owner = ? AND deadline > ?",
            (key, owner, time.time()),
        ).rowcount
        conn.execute("COMMIT")
        return n == 1


class OnThread:
    """Run callables on one dedicated thread, awaited from the loop (as tenure does)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        while True:
            item = self.jobs.get()
            if item is None:
                return
            fn, args, fut, loop = item
            try:
                result = fn(*args)
            except BaseException as exc:
                loop.call_soon_threadsafe(_settle, fut, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, fut, result, None)

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self.jobs.put((fn, args, fut, loop))
        return fut

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join()


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(result)
        else:
            fut.set_exception(exc)


async def sequential(path: str, cycles: int, rounds: int) -> None:
    async with SqlitePubSub(path) as backend:
        await backend.get_lease_owner("warm-up")  # creates the schema
        raw = RawLeases(path)
        runner = OnThread()
        keys = [f"seq-{i}" for i in range(100)]
        bkeys = [k.encode() for k in keys]

        async def run_tenure() -> float:
            start = time.perf_counter()
            for i in range(cycles):
                key = keys[i % 100]
                await backend.acquire_lease(key, "bench", TTL_MS)
                await backend.release_lease(key, "bench")
            return cycles / (time.perf_counter() - start)

        async def run_raw() -> float:
            start = time.perf_counter()
            for i in range(cycles):
                key = bkeys[i % 100]
                await runner.run(raw.acquire, key, b"bench", TTL_MS)
                await runner.run(raw.release, key, b"bench")
            return cycles / (time.perf_counter() - start)

        async def run_raw_inline() -> float:
            start = time.perf_counter()
            for i in range(cycles):
                key = bkeys[i % 100]
                raw.acquire(key, b"bench", TTL_MS)
                raw.release(key, b"bench")
            return cycles / (time.perf_counter() - start)

        rates: dict[str, list[float]] = {"tenure": [], "raw": [], "raw-inline": []}
        ratios: list[float] = []
        await run_tenure()
        await run_raw()  # warm-up of both paths
        # Short runs in alternating order, so that load from other work on the
        # machine hits both alike; the ratio is taken within each pair.
        for i in range(rounds):
            if i % 2:
                raw_rate = await run_raw()
                tenure_rate = await run_tenure()
            else:
                tenure_rate = await run_tenure()
                raw_rate = await run_raw()
            rates["tenure"].append(tenure_rate)
            rates["raw"].append(raw_rate)
            ratios.append(tenure_rate / raw_rate)
            rates["raw-inline"].append(run_raw_inline_sync(raw, bkeys, cycles))
        runner.stop()
        raw.conn.close()
    med = {name: statistics.median(v) for name, v in rates.items()}
    print(f"sequential acquire+release cycles ({rounds} pairs of runs of {cycles} cycles, median):")
    print(f"  tenure SqlitePubSub         {med['tenure']:9.0f} cycles/s")
    print(f"  raw sqlite3, on a thread    {med['raw']:9.0f} cycles/s   (baseline)")
    print(f"  raw sqlite3, on the loop    {med['raw-inline']:9.0f} cycles/s   (context only)")
    print(
        f"  ratio tenure / baseline     {statistics.median(ratios):9.2f}   "
        f"(median of per-pair ratios; goal >= 0.80; pairs min {min(ratios):.2f} max {max(ratios):.2f})"
    )


def run_raw_inline_sync(raw: RawLeases, bkeys: list[bytes], cycles: int) -> float:
    start = time.perf_counter()
    for i in range(cycles):
        key = bkeys[i % 100]
        raw.acquire(key, b"bench", TTL_MS)
        raw.release(key, b"bench")
    return cycles / (time.perf_counter() - start)


# -- four contending processes -------------------------------------------------------------


def wait_for_file(path: str) -> None:
    """Start together with the other workers (blocking on purpose: nothing else runs yet)."""
    while not os.path.exists(path):
        time.sleep(0.001)


async def contend_worker(kind: str, path: str, owner: str, seconds: float, go: str) -> None:
    rng = random.Random(owner)
    keys = [f"hot-{i}" for i in range(100)]
    ops = wins = 0
    if kind == "tenure":
        async with SqlitePubSub(path) as backend:
            await backend.get_lease_owner("warm-up")
            wait_for_file(go)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                key = keys[rng.randrange(100)]
                res = await backend.acquire_lease(key, owner, TTL_MS)
                ops += 1
                if res.acquired:
                    wins += 1
                    await backend.release_lease(key, owner)
                    ops += 1
    else:
        raw = RawLeases(path)
        runner = OnThread()
        bkeys = [k.encode() for k in keys]
        bowner = owner.encode()
        wait_for_file(go)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            bkey = bkeys[rng.randrange(100)]
            token = await runner.run(raw.acquire, bkey, bowner, TTL_MS)
            ops += 1
            if token is not None:
                wins += 1
                await runner.run(raw.release, bkey, bowner)
                ops += 1
        runner.stop()
        raw.conn.close()
    print(json.dumps({"ops": ops, "wins": wins}))


def contend(path: str, kind: str, seconds: float) -> tuple[float, int]:
    go = f"{path}.{kind}.go"
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", kind, path, f"{kind}-{i}", str(seconds), go],
            stdout=subprocess.PIPE,
        )
        for i in range(4)
    ]
    time.sleep(1.0)  # let every worker open the file
    Path(go).touch()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 60)
        results.append(json.loads(out))
    ops = sum(r["ops"] for r in results)
    wins = sum(r["wins"] for r in results)
    return ops / seconds, wins


# -- batch renew, delivery latency, idle CPU ---------------------------------------------------


async def batch_renew(path: str) -> None:
    async with SqlitePubSub(path) as backend:
        keys = [f"many-{i}" for i in range(10_000)]
        for key in keys:
            await backend.acquire_lease(key, "holder", TTL_MS)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            ok = await backend.renew_leases(keys, "holder", TTL_MS)
            times.append(time.perf_counter() - start)
            assert all(ok)
    print(
        f"renew_leases of 10,000 keys in one call: median {statistics.median(times) * 1000:.1f} ms"
    )


async def publisher_worker(path: str, count: int) -> None:
    async with SqlitePubSub(path) as backend:
        for i in range(count):
            await backend.publish("latency", Event(type="ping", data=i))
            await asyncio.sleep(0.02)


async def idle_cpu(path: str, poll_interval: float | None) -> None:
    async def on_event(event: Event) -> None:
        pass

    options: dict[str, Any] = {} if poll_interval is None else {"poll_interval": poll_interval}
    async with SqlitePubSub(path, **options) as backend:
        if poll_interval is not None:
            await backend.subscribe("idle", on_event)
        await asyncio.sleep(0.5)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(5.0)
        cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    what = (
        "no subscriber (process baseline)"
        if poll_interval is None
        else (f"idle subscriber, poll_interval={poll_interval} s")
    )
    print(f"CPU of the whole process, {what}: {cpu * 100:.2f}% of one core")


async def latency(path: str) -> None:
    latencies: list[float] = []
    count = 200
    all_in = asyncio.Event()

    async def on_event(event: Event) -> None:
        assert event.created_at is not None
        latencies.append(time.time() - event.created_at)
        if len(latencies) >= count:
            all_in.set()

    async with SqlitePubSub(path) as backend:
        await backend.subscribe("latency", on_event)
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--publisher", path, str(count)
        )
        await child.wait()
        await backend.flush()
        try:
            await asyncio.wait_for(all_in.wait(), 5)
        except TimeoutError:
            print(f"  only {len(latencies)} of {count} events arrived")
        await backend.unsubscribe("latency", on_event)
    lat = sorted(x * 1000 for x in latencies)
    p50 = lat[len(lat) // 2]
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(
        f"cross-process delivery (default poll_interval), {len(lat)} events: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"max {lat[-1]:.1f} ms"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, path, owner, seconds, go = sys.argv[2:7]
        asyncio.run(contend_worker(kind, path, owner, float(seconds), go))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--publisher":
        asyncio.run(publisher_worker(sys.argv[2], int(sys.argv[3])))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    print(
        f"sqlite {sqlite3.sqlite_version}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "bench.db")
        asyncio.run(sequential(path, args.cycles, args.rounds))
        print(f"four processes contending on the same 100 keys, {args.seconds:.0f} s each:")
        rates = {}
        for kind in ("tenure", "raw"):
            rate, wins = contend(path, kind, args.seconds)
            rates[kind] = rate
            label = "tenure SqlitePubSub" if kind == "tenure" else "raw sqlite3, on a thread"
            print(f"  {label:26s}  {rate:9.0f} lease ops/s  ({wins} grants)")
        print(f"  ratio tenure / baseline     {rates['tenure'] / rates['raw']:9.2f}")
        asyncio.run(batch_renew(path))
        asyncio.run(latency(str(Path(tmp) / "latency.db")))
        for interval in (None, 0.01, 0.005):
            asyncio.run(idle_cpu(str(Path(tmp) / "idle.db"), interval))


if __name__ == "__main__":
    main()
