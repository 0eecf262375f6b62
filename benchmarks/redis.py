"""Benchmark: tenure's Redis leases against raw redis-py, in one run on one server.

    .venv/bin/python benchmarks/redis.py [--seconds 5] [--url redis://127.0.0.1:6379/0]

Without ``--url`` a private ``redis-server`` is started on a free port (so
other users of a shared server neither disturb nor are disturbed). Cases, all
acquire + release cycles:

1. sequential, one connection: tenure (two scripts, two round trips) vs raw
   redis-py asyncio ``SET NX PX`` + ``DEL`` (two round trips, no ownership
   check on release) vs redis-py's asyncio ``Lock`` (``SET NX PX`` + a release
   script);
2. 64 concurrent tasks on 64 keys: tenure vs the raw commands;
3. tenure's pipelined lease connection (``_pipe``, written below redis-py's
   client) vs the same backend sending through redis-py's public client and
   pool (``execute_command``; ``pipeline()`` for batches), sequentially and
   with 64 tasks: what justifies the private-API transport;
4. ``renew_leases`` of 10,000 held keys (one pipelined round trip), on both
   transports.

Cases alternate in several rounds so that load changes on the machine hit all
of them alike; each rate is total cycles / total time. Goals: tenure >= 1.0x
raw and >= 1.2x Lock sequentially, >= 0.9x raw concurrently.

The tenure backend runs with its defaults (quarantine on; ``max_ttl_ms`` is
the benchmark's TTL, so that a fresh private server needs only that long to
count as not new): its key's fencing counter is created first, as in any
long-running deployment, so the timed path is the ordinary one.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: the repository root first (this module would shadow redis)
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from benchmarks._common import Figure, interleave, print_table, run, stamped
from tenure.backends.redis import RedisStreamsPubSub

TTL_MS = 10_000
CONCURRENCY = 64
# (seconds per case, rounds)
FULL = (5.0, 5)
SHORT = (1.0, 4)

Cycle = Callable[[int], Awaitable[None]]


async def run_for(cycle: Cycle, seconds: float, tasks: int) -> tuple[float, float]:
    """Run ``cycle(task_index)`` in ``tasks`` tasks for ``seconds``; (cycles, elapsed)."""
    stop = time.perf_counter() + seconds
    counts = [0] * tasks

    async def worker(i: int) -> None:
        n = 0
        while time.perf_counter() < stop:
            for _ in range(20):
                await cycle(i)
            n += 20
        counts[i] = n

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    return sum(counts), time.perf_counter() - start


async def measure(url: str, seconds: float, rounds: int) -> list[Figure]:
    raw = aioredis.Redis.from_url(url)
    # A server younger than max_ttl_ms (and without appendfsync always) cannot
    # tell a first use from a state loss, and quarantines: let a fresh private
    # server age past it, so the timed backend runs with its defaults.
    # (The quarantine lasts max_ttl_ms + 1 s + 1 %.)
    age = TTL_MS / 1000 * 1.01 + 2 - (await raw.info("server"))["uptime_in_seconds"]
    if age > 0:
        print(f"waiting {age:.0f} s for the server to age past its quarantine")
        await asyncio.sleep(age)
    warm = RedisStreamsPubSub.from_url(url, prefix="bench:", max_ttl_ms=TTL_MS)
    backend = RedisStreamsPubSub.from_url(url, prefix="bench:", max_ttl_ms=TTL_MS)
    # The same backend on redis-py's public path: what the transport is compared with.
    pooled = RedisStreamsPubSub.from_url(url, prefix="bench:", max_ttl_ms=TTL_MS)
    pooled._conn.pipe = None
    conc_keys = [f"conc-{i}" for i in range(CONCURRENCY)]
    for key in ["seq", *conc_keys]:
        assert (await warm.acquire_lease(key, "warmup", TTL_MS)).acquired
        await warm.release_lease(key, "warmup")
    await warm.aclose()
    locks = [raw.lock("bench-lock", timeout=TTL_MS / 1000)]

    async def tenure_seq(i: int) -> None:
        result = await backend.acquire_lease("seq", "me", TTL_MS)
        assert result.acquired
        await backend.release_lease("seq", "me")

    async def tenure_conc(i: int) -> None:
        key = conc_keys[i]
        result = await backend.acquire_lease(key, "me", TTL_MS)
        assert result.acquired
        await backend.release_lease(key, "me")

    async def pooled_seq(i: int) -> None:
        result = await pooled.acquire_lease("seq", "me", TTL_MS)
        assert result.acquired
        await pooled.release_lease("seq", "me")

    async def pooled_conc(i: int) -> None:
        key = conc_keys[i]
        result = await pooled.acquire_lease(key, "me", TTL_MS)
        assert result.acquired
        await pooled.release_lease(key, "me")

    async def raw_cycle(i: int) -> None:
        key = b"bench-raw:" + str(i).encode()
        assert await raw.set(key, b"me", nx=True, px=TTL_MS)
        await raw.delete(key)

    async def lock_cycle(i: int) -> None:
        lock = locks[0]
        assert await lock.acquire(blocking=False)
        await lock.release()

    cases: dict[str, tuple[Cycle, int]] = {
        "sequential tenure": (tenure_seq, 1),
        "sequential raw SET NX PX + DEL": (raw_cycle, 1),
        "sequential redis-py asyncio Lock": (lock_cycle, 1),
        "sequential tenure, redis-py pool": (pooled_seq, 1),
    }
    conc_cases: dict[str, tuple[Cycle, int]] = {
        f"{CONCURRENCY} tasks tenure": (tenure_conc, CONCURRENCY),
        f"{CONCURRENCY} tasks raw SET NX PX + DEL": (raw_cycle, CONCURRENCY),
        f"{CONCURRENCY} tasks tenure, redis-py pool": (pooled_conc, CONCURRENCY),
    }
    # Warm up every path (connections, script cache) before timing.
    for cycle, tasks in [*cases.values(), *conc_cases.values()]:
        await run_for(cycle, 0.2, tasks)
    per_round = seconds / rounds

    def timed(cycle: Cycle, tasks: int) -> Callable[[], Awaitable[tuple[float, float]]]:
        return lambda: run_for(cycle, per_round, tasks)

    result = await interleave(
        {name: timed(*case) for name, case in [*cases.items(), *conc_cases.items()]}, rounds
    )
    print(f"redis-server at {url.split('@')[-1]}, {seconds:g} s per case in {rounds} rounds")
    for name in result.work:
        print(f"  {name:<40} {result.rate(name):>10,.0f} cycles/s")
    seq, raw_name, lock_name = (
        "sequential tenure",
        "sequential raw SET NX PX + DEL",
        "sequential redis-py asyncio Lock",
    )
    conc, conc_raw = f"{CONCURRENCY} tasks tenure", f"{CONCURRENCY} tasks raw SET NX PX + DEL"
    found = [
        Figure(
            "redis",
            "sequential acquire+release vs raw SET NX PX + DEL",
            result.rate(seq),
            result.rate(raw_name),
            "cycles/s",
            result.ratio(seq, raw_name),
            (">=", 1.0),
        ),
        Figure(
            "redis",
            "sequential acquire+release vs redis-py asyncio Lock",
            result.rate(seq),
            result.rate(lock_name),
            "cycles/s",
            result.ratio(seq, lock_name),
            (">=", 1.2),
        ),
        Figure(
            "redis",
            f"{CONCURRENCY} tasks on {CONCURRENCY} keys vs raw",
            result.rate(conc),
            result.rate(conc_raw),
            "cycles/s",
            result.ratio(conc, conc_raw),
            (">=", 0.9),
        ),
    ]
    pooled_seq_name = "sequential tenure, redis-py pool"
    pooled_conc_name = f"{CONCURRENCY} tasks tenure, redis-py pool"
    found += [
        Figure(
            "redis",
            "sequential: pipelined lease connection vs redis-py pool",
            result.rate(seq),
            result.rate(pooled_seq_name),
            "cycles/s",
            result.ratio(seq, pooled_seq_name),
            (">=", 1.0),
        ),
        Figure(
            "redis",
            f"{CONCURRENCY} tasks: pipelined lease connection vs redis-py pool",
            result.rate(conc),
            result.rate(pooled_conc_name),
            "cycles/s",
            result.ratio(conc, pooled_conc_name),
            (">=", 1.0),
        ),
    ]
    for figure in found:
        print(f"  ratio {figure.what:<55} {figure.ratio:.2f}  (goal {figure.goal_text()})")

    # Keeping many leases alive: one pipelined round trip.
    keys = [f"many-{i}" for i in range(10_000)]
    many = RedisStreamsPubSub.from_url(url, prefix="bench:", max_ttl_ms=TTL_MS)
    for start in range(0, len(keys), 1000):
        await asyncio.gather(
            *(many.acquire_lease(k, "me", TTL_MS) for k in keys[start : start + 1000])
        )
    many_pooled = RedisStreamsPubSub.from_url(url, prefix="bench:", max_ttl_ms=TTL_MS)
    many_pooled._conn.pipe = None
    best = {"pipelined": float("inf"), "redis-py pipeline()": float("inf")}
    for _ in range(3):  # interleaved
        for name, renewer in (("pipelined", many), ("redis-py pipeline()", many_pooled)):
            t0 = time.perf_counter()
            renewed = await renewer.renew_leases(keys, "me", TTL_MS)
            best[name] = min(best[name], time.perf_counter() - t0)
            assert all(renewed)
    for name, seconds_taken in best.items():
        print(
            f"  renew_leases of 10,000 keys, {name:<20} {seconds_taken * 1000:>8.1f} ms (best of 3)"
        )
    await many_pooled.aclose()
    async for key in raw.scan_iter(match=b"bench:*", count=1000):
        await raw.delete(key)
    await many.aclose()
    await pooled.aclose()
    await backend.aclose()
    await raw.aclose()
    return found


def measure_on(url: str | None, seconds: float, rounds: int) -> list[Figure]:
    """On the Redis at ``url``, or on a private ``redis-server`` when ``url`` is ``None``."""
    with stamped("redis"):
        if url:
            return run(measure(url, seconds, rounds))
        from tests.support.redis_server import RedisServer

        with RedisServer() as server:
            return run(measure(server.url, seconds, rounds))


def figures(full: bool = False) -> list[Figure]:
    return measure_on(None, *(FULL if full else SHORT))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=FULL[0], help="timed seconds per case")
    parser.add_argument("--rounds", type=int, default=FULL[1], help="alternating rounds")
    parser.add_argument("--url", help="an existing Redis (default: start a private one)")
    opts = parser.parse_args()
    print_table(measure_on(opts.url, opts.seconds, opts.rounds))
