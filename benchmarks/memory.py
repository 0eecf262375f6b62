"""Memory backend: acquire+release cycles per second against an asyncio.Lock cycle.

Both run in the same process, interleaved in rounds so machine noise hits both
alike. Prints the rates and their ratio (goal: at least 0.2 of asyncio.Lock).

    .venv/bin/python benchmarks/memory.py [--seconds 2] [--rounds 5]
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
    parser.add_argument("--seconds", type=float, default=2.0, help="per case per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    backend = MemoryPubSub()
    lock = asyncio.Lock()
    # Calibrate the cycle count so each case runs about --seconds.
    n_tenure = int(await tenure_cycles(backend, 20_000) * args.seconds)
    n_lock = int(await lock_cycles(lock, 20_000) * args.seconds)
    ours: list[float] = []
    base: list[float] = []
    for _ in range(args.rounds):
        ours.append(await tenure_cycles(backend, n_tenure))
        base.append(await lock_cycles(lock, n_lock))
    await backend.aclose()
    t, b = statistics.median(ours), statistics.median(base)
    print(f"memory acquire+release: {t:>12,.0f} cycles/s (median of {args.rounds} rounds)")
    print(f"asyncio.Lock cycle:     {b:>12,.0f} cycles/s")
    print(f"ratio tenure/asyncio.Lock: {t / b:.3f} (goal >= 0.2)")


if __name__ == "__main__":
    asyncio.run(main())
