"""Benchmark: what ``tenure.sync`` adds to a call, and threads contending on one key.

    .venv/bin/python benchmarks/sync.py [--seconds 3] [--redis redis://127.0.0.1:6379/0]

1. Overhead per operation: ``get_lease_owner`` and an acquire + release cycle,
   called from one thread through the facade, against the same async call
   awaited on its own loop; on memory and on Redis. The difference is what the
   facade adds (a hand-off to tenure's loop thread and back). The floor of any
   such hand-off on this machine is measured too: a bare
   ``call_soon_threadsafe`` + lock round trip between two threads.
2. Threads contending on one key: ``THREADS`` threads each loop on
   ``with tenure.sync.hold(..., wait=None)`` around a tiny critical section,
   against redis-py's blocking ``Lock`` doing the same (its default
   ``sleep=0.1`` between attempts, and ``sleep=0.001``). Rates are completed
   critical sections per second.

Cases alternate over rounds so that load on the machine hits each alike. The
shared Redis server is used with a key prefix of its own, deleted at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: the repository root first (benchmarks/redis.py shadows redis)
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
import tenure
import tenure.sync
from benchmarks._common import Figure, print_table, run, stamped

THREADS = 8
TTL_MS = 30_000
# (seconds per case, rounds)
FULL = (2.0, 3)
SHORT = (0.5, 2)


def per_op_sync(fn: Callable[[], Any], seconds: float) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process) per call of ``fn`` over ``seconds``."""
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    stop = start + seconds
    while time.perf_counter() < stop:
        for _ in range(50):
            fn()
        n += 50
    return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n


async def per_op_async(fn: Callable[[], Awaitable[Any]], seconds: float) -> tuple[float, float]:
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    stop = start + seconds
    while time.perf_counter() < stop:
        for _ in range(50):
            await fn()
        n += 50
    return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n


def handoff_floor(seconds: float) -> tuple[float, float]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def once() -> None:
        done = threading.Lock()
        done.acquire()
        loop.call_soon_threadsafe(done.release)
        done.acquire()

    try:
        return per_op_sync(once, seconds)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def overhead(url: str, options: dict[str, Any], seconds: float, rounds: int) -> dict[str, float]:
    """Mean seconds per call, wall and CPU (``<case> cpu``), per case."""
    totals: dict[str, list[float]] = {}

    def add(name: str, value: tuple[float, float]) -> None:
        totals.setdefault(name, []).append(value[0])
        totals.setdefault(f"{name} cpu", []).append(value[1])

    with tenure.sync.from_url(url, **options) as backend:
        backend.acquire_lease("bench-read", "someone", TTL_MS)

        def cycle_sync() -> None:
            backend.acquire_lease("bench-cycle", "me", TTL_MS)
            backend.release_lease("bench-cycle", "me")

        async def run_async() -> tuple[tuple[float, float], tuple[float, float]]:
            async with tenure.from_url(url, **options) as inner:

                async def read() -> None:
                    await inner.get_lease_owner("bench-read")

                async def cycle() -> None:
                    await inner.acquire_lease("bench-cycle-a", "me", TTL_MS)
                    await inner.release_lease("bench-cycle-a", "me")

                await inner.acquire_lease("bench-read", "someone", TTL_MS)
                return await per_op_async(read, seconds), await per_op_async(cycle, seconds)

        for _ in range(rounds):
            read_async, cycle_async = run(run_async())
            add("read async", read_async)
            add("cycle async", cycle_async)
            add("read sync", per_op_sync(lambda: backend.get_lease_owner("bench-read"), seconds))
            add("cycle sync", per_op_sync(cycle_sync, seconds))
            add("hand-off floor", handoff_floor(seconds))
    return {name: sum(v) / len(v) for name, v in totals.items()}


def contention(redis_url: str, prefix: str, seconds: float) -> dict[str, tuple[float, int, int]]:
    """Per case: (sections per second, fewest and most sections of one thread)."""
    rates: dict[str, list[float]] = {}
    spread: dict[str, list[int]] = {}
    key = f"{prefix}contended"

    def measure(name: str, section: Callable[[int], None]) -> None:
        stop = time.perf_counter() + seconds
        counts = [0] * THREADS

        def worker(i: int) -> None:
            while time.perf_counter() < stop:
                section(i)
                counts[i] += 1

        start = time.perf_counter()
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(worker, range(THREADS)))
        rates.setdefault(name, []).append(sum(counts) / (time.perf_counter() - start))
        spread.setdefault(name, []).extend(counts)

    client = redis.Redis.from_url(redis_url)
    shared = {"n": 0}

    def critical() -> None:
        shared["n"] += 1

    with tenure.sync.from_url(redis_url, prefix=prefix, quarantine=False) as backend:

        def with_tenure(i: int) -> None:
            with tenure.sync.hold(backend, "contended", f"t{i}", TTL_MS, wait=None):
                critical()

        def with_lock(sleep: float) -> Callable[[int], None]:
            def section(i: int) -> None:
                with client.lock(key, timeout=TTL_MS / 1000, sleep=sleep):
                    critical()

            return section

        for _ in range(2):
            measure("tenure.sync.hold", with_tenure)
            measure("redis-py Lock (sleep=0.1)", with_lock(0.1))
            measure("redis-py Lock (sleep=0.001)", with_lock(0.001))
    client.close()
    return {
        name: (sum(v) / len(v), min(spread[name]), max(spread[name])) for name, v in rates.items()
    }


def measure(seconds: float, rounds: int, redis_url: str) -> list[Figure]:
    found: list[Figure] = []
    prefix = f"tenure-bench-sync-{uuid.uuid4().hex[:8]}:"
    try:
        for name, url, options in (
            ("memory", "memory://", {}),
            ("redis", redis_url, {"prefix": prefix, "quarantine": False}),
        ):
            result = overhead(url, options, seconds, rounds)
            print(f"{name}: per operation, mean of {rounds} rounds (wall time; CPU time)")
            for what in ("read", "cycle"):
                calls = 2 if what == "cycle" else 1
                a, s = result[f"{what} async"], result[f"{what} sync"]
                ac, sc = result[f"{what} async cpu"], result[f"{what} sync cpu"]
                print(
                    f"  {what:5}  async {a * 1e6:7.1f} us   sync {s * 1e6:7.1f} us   added per call:"
                    f" {(s - a) * 1e6 / calls:6.1f} us wall, {(sc - ac) * 1e6 / calls:6.1f} us CPU"
                )
            floor, floor_cpu = result["hand-off floor"], result["hand-off floor cpu"]
            print(
                f"  bare thread hand-off floor {floor * 1e6:.1f} us wall, {floor_cpu * 1e6:.1f} us CPU"
            )
            # The goal is on the time added per call (acquire+release, per
            # call); the baseline column is the floor of any hand-off to a loop
            # thread and back on this machine, which no such facade can go under.
            added = (result["cycle sync"] - result["cycle async"]) / 2
            found.append(
                Figure(
                    name,
                    "time tenure.sync adds per call (acquire+release) vs a bare thread hand-off",
                    added * 1e6,
                    floor * 1e6,
                    "us",
                    added / floor,
                    ("<=", 30.0),
                    "tenure",
                )
            )
        print(
            f"{THREADS} threads contending on one Redis key: critical sections per second, "
            f"and the fewest / most one thread completed in a {seconds:g} s run"
        )
        rates = contention(redis_url, prefix, seconds)
        for name, (rate, low, high) in rates.items():
            print(f"  {name:28} {rate:8.0f}/s   per thread {low}-{high}")
        ours, theirs = rates["tenure.sync.hold"][0], rates["redis-py Lock (sleep=0.001)"][0]
        found.append(
            Figure(
                "redis",
                f"{THREADS} threads on one key, tenure.sync.hold vs redis-py Lock (sleep=0.001)",
                ours,
                theirs,
                "/s",
                ours / theirs,
            )
        )
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=prefix.replace(":", "\\:") + "*"))
        if keys:
            client.delete(*keys)
        client.close()
    return found


def figures(full: bool = False) -> list[Figure]:
    with stamped("sync"):
        return measure(*(FULL if full else SHORT), "redis://127.0.0.1:6379/0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=FULL[0])
    parser.add_argument("--rounds", type=int, default=FULL[1])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    with stamped("sync"):
        found = measure(args.seconds, args.rounds, args.redis)
    print_table(found)


if __name__ == "__main__":
    main()
