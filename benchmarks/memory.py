"""Memory backend: acquire+release cycles per second against an asyncio.Lock cycle.

Both run in the same process, alternating in short slices so that machine noise
(this is often a shared, loaded machine) hits both alike; the ratio is the
median of the per-slice ratios. Goal: at least 0.2 of the asyncio.Lock rate.

    .venv/bin/python benchmarks/memory.py [--slices 40] [--slice-seconds 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from tenure import MemoryPubSub


async def tenure_cycles(backend: MemoryPubSub, n: int) -> float:
    acquire, release = backend.acquire_lease, backend.release_lease
    start = time.perf_counter()
    for _ in range(n):
        await acquire("bench-key", "bench-owner", 10_000)
        await release("bench-key", "bench-owner")
    return n / (time.perf_counter() - start)


async def lock_cycles(lock: asyncio.Lock, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await lock.acquire()
        lock.release()
    return n / (time.perf_counter() - start)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--slices", type=int, default=40)
    parser.add_argument("--slice-seconds", type=float, default=0.25)
    args = parser.parse_args()

    backend = MemoryPubSub()
    lock = asyncio.Lock()
    # Calibrate the cycle counts so each slice runs about --slice-seconds.
    n_tenure = max(1000, int(await tenure_cycles(backend, 20_000) * args.slice_seconds))
    n_lock = max(1000, int(await lock_cycles(lock, 50_000) * args.slice_seconds))
    ours: list[float] = []
    base: list[float] = []
    ratios: list[float] = []
    for _ in range(args.slices):
        t = await tenure_cycles(backend, n_tenure)
        b = await lock_cycles(lock, n_lock)
        ours.append(t)
        base.append(b)
        ratios.append(t / b)
    await backend.aclose()
    print(
        f"memory acquire+release: {statistics.median(ours):>12,.0f} cycles/s (median of {args.slices} slices)"
    )
    print(f"asyncio.Lock cycle:     {statistics.median(base):>12,.0f} cycles/s")
    q = statistics.quantiles(ratios, n=10)
    print(
        f"ratio tenure/asyncio.Lock: {statistics.median(ratios):.3f} median of per-slice ratios "
        f"(p10 {q[0]:.3f}, p90 {q[-1]:.3f}; goal >= 0.2)"
    )


if __name__ == "__main__":
    asyncio.run(main())
