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
3. ``renew_leases`` of 10,000 held keys (one pipelined round trip).

Cases alternate in several rounds so that load changes on the machine hit all
of them alike; each rate is total cycles / total time. Goals: tenure >= 1.0x
raw and >= 1.2x Lock sequentially, >= 0.9x raw concurrently.

The tenure backend runs with its defaults (quarantine on): its key's fencing
counter is created first, as in any long-running deployment, so the timed
path is the ordinary one.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's directory comes first on sys.path and this
# module (named redis) would shadow the redis package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import time  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402

import redis.asyncio as aioredis  # noqa: E402

from tenure.backends.redis import RedisStreamsPubSub  # noqa: E402

TTL_MS = 30_000
CONCURRENCY = 64

Cycle = Callable[[int], Awaitable[None]]


async def run_for(cycle: Cycle, seconds: float, tasks: int) -> tuple[int, float]:
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


async def main(url: str, seconds: float, rounds: int) -> None:
    warm = RedisStreamsPubSub.from_url(url, prefix="bench:", quarantine=False)
    backend = RedisStreamsPubSub.from_url(url, prefix="bench:")
    raw = aioredis.Redis.from_url(url)
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
    }
    conc_cases: dict[str, tuple[Cycle, int]] = {
        f"{CONCURRENCY} tasks tenure": (tenure_conc, CONCURRENCY),
        f"{CONCURRENCY} tasks raw SET NX PX + DEL": (raw_cycle, CONCURRENCY),
    }
    totals: dict[str, list[float]] = {name: [0, 0.0] for name in [*cases, *conc_cases]}
    # Warm up every path (connections, script cache) before timing.
    for cycle, tasks in [*cases.values(), *conc_cases.values()]:
        await run_for(cycle, 0.2, tasks)
    per_round = seconds / rounds
    for _ in range(rounds):
        for name, (cycle, tasks) in [*cases.items(), *conc_cases.items()]:
            n, elapsed = await run_for(cycle, per_round, tasks)
            totals[name][0] += n
            totals[name][1] += elapsed

    rates = {name: n / elapsed for name, (n, elapsed) in totals.items()}
    print(f"redis-server at {url.split('@')[-1]}, {seconds:g} s per case in {rounds} rounds")
    for name, rate in rates.items():
        print(f"  {name:<40} {rate:>10,.0f} cycles/s")
    seq_raw = rates["sequential raw SET NX PX + DEL"]
    seq_lock = rates["sequential redis-py asyncio Lock"]
    seq_tenure = rates["sequential tenure"]
    conc_tenure = rates[f"{CONCURRENCY} tasks tenure"]
    conc_raw = rates[f"{CONCURRENCY} tasks raw SET NX PX + DEL"]
    print(f"  ratio sequential tenure / raw            {seq_tenure / seq_raw:.2f}  (goal >= 1.0)")
    print(f"  ratio sequential tenure / Lock           {seq_tenure / seq_lock:.2f}  (goal >= 1.2)")
    print(
        f"  ratio {CONCURRENCY} tasks tenure / raw             {conc_tenure / conc_raw:.2f}  (goal >= 0.9)"
    )

    # Keeping many leases alive: one pipelined round trip.
    keys = [f"many-{i}" for i in range(10_000)]
    many = RedisStreamsPubSub.from_url(url, prefix="bench:", quarantine=False)
    for start in range(0, len(keys), 1000):
        await asyncio.gather(
            *(many.acquire_lease(k, "me", TTL_MS) for k in keys[start : start + 1000])
        )
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        renewed = await many.renew_leases(keys, "me", TTL_MS)
        best = min(best, time.perf_counter() - t0)
        assert all(renewed)
    print(f"  renew_leases of 10,000 keys               {best * 1000:>10.1f} ms (best of 3)")
    async for key in raw.scan_iter(match=b"bench:*", count=1000):
        await raw.delete(key)
    await many.aclose()
    await backend.aclose()
    await raw.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="timed seconds per case")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--url", help="an existing Redis (default: start a private one)")
    opts = parser.parse_args()
    if opts.url:
        asyncio.run(main(opts.url, opts.seconds, opts.rounds))
    else:
        from tests.support.redis_server import RedisServer

        with RedisServer() as server:
            asyncio.run(main(server.url, opts.seconds, opts.rounds))
