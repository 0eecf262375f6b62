"""Memory backend: acquire+release cycles per second against an asyncio.Lock cycle.

Both run in the same process, alternating in short slices so that machine noise
(this is often a shared, loaded machine) hits both alike; the ratio is the
median of the per-slice ratios. Goal: at least 0.2 of the asyncio.Lock rate.

    .venv/bin/python benchmarks/memory.py [--slices 40] [--slice-seconds 0.25]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: import the benchmarks package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import statistics
import time

from benchmarks._common import Figure, interleave, print_table, run, stamped
from tenure import MemoryPubSub

# (slices, seconds per slice)
FULL = (40, 0.25)
SHORT = (10, 0.1)


async def tenure_cycles(backend: MemoryPubSub, n: int) -> tuple[float, float]:
    acquire, release = backend.acquire_lease, backend.release_lease
    start = time.perf_counter()
    for _ in range(n):
        await acquire("bench-key", "bench-owner", 10_000)
        await release("bench-key", "bench-owner")
    return n, time.perf_counter() - start


async def lock_cycles(lock: asyncio.Lock, n: int) -> tuple[float, float]:
    start = time.perf_counter()
    for _ in range(n):
        await lock.acquire()
        lock.release()
    return n, time.perf_counter() - start


async def measure(slices: int, slice_seconds: float) -> list[Figure]:
    backend = MemoryPubSub()
    lock = asyncio.Lock()
    # Calibrate the cycle counts so each slice runs about slice_seconds.
    n, spent = await tenure_cycles(backend, 20_000)
    n_tenure = max(1000, int(n / spent * slice_seconds))
    n, spent = await lock_cycles(lock, 50_000)
    n_lock = max(1000, int(n / spent * slice_seconds))
    result = await interleave(
        {
            "tenure": lambda: tenure_cycles(backend, n_tenure),
            "lock": lambda: lock_cycles(lock, n_lock),
        },
        slices,
    )
    await backend.aclose()
    ours, base = result.rounds["tenure"], result.rounds["lock"]
    ratios = result.ratios("tenure", "lock")
    print(
        f"memory acquire+release: {statistics.median(ours):>12,.0f} cycles/s (median of {slices} slices)"
    )
    print(f"asyncio.Lock cycle:     {statistics.median(base):>12,.0f} cycles/s")
    q = statistics.quantiles(ratios, n=10)
    print(
        f"ratio tenure/asyncio.Lock: {statistics.median(ratios):.3f} median of per-slice ratios "
        f"(p10 {q[0]:.3f}, p90 {q[-1]:.3f}; goal >= 0.2)"
    )
    return [
        Figure(
            "memory",
            "acquire+release cycle vs asyncio.Lock cycle",
            statistics.median(ours),
            statistics.median(base),
            "cycles/s",
            statistics.median(ratios),
            (">=", 0.2),
        )
    ]


def figures(full: bool = False) -> list[Figure]:
    with stamped("memory"):
        return run(measure(*(FULL if full else SHORT)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--slices", type=int, default=FULL[0])
    parser.add_argument("--slice-seconds", type=float, default=FULL[1])
    args = parser.parse_args()
    with stamped("memory"):
        found = run(measure(args.slices, args.slice_seconds))
    print_table(found)


if __name__ == "__main__":
    main()
