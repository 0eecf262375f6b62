"""Replies benchmark on Redis: output item latency and throughput against raw Streams, same run.

Usage: ``python benchmarks/output.py [--count N] [--gap S] [--burst M] [--rounds R]``

A child process owns one thread (it sends itself a signal; its run does the
work below); this process reads.

1. Latency. The run appends ``--count`` items with ``run.append`` (the fenced
   script, ``XADD 0-*``), each stamped with ``time.monotonic()`` (one clock for
   the host), and after each one ``XADD``s a stamped entry to a raw stream,
   ``--gap`` seconds apart: interleaved, so load hits both alike. This process
   reads the thread with ``ThreadRuntime.follow`` (blocking ``XREAD``) and the
   raw stream with a blocking ``XREAD`` loop, and takes receipt - stamp. Both
   readers go on reading through part 2.
2. Throughput through one thread: ``--rounds`` interleaved slices of
   ``--burst`` items appended one call each (``run.append``), against as many
   raw ``XADD``s, and ``run.append_many`` of the same burst in batches of 32;
   items/s in the owner; the ratio is the median of the per-slice ratios.

Goals (issue 32): latency at most 1.3x raw (p50 and p99); items/s at least 0.8x.
Uses the shared Redis at ``TENURE_BENCH_REDIS_URL`` under a prefix of its own,
deleted at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: the repository root first (benchmarks/redis.py shadows redis)
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import importlib
import json
import os
import statistics
import time
import uuid
from typing import Any

import tenure
from benchmarks._common import Figure, percentile, print_table, run, stamped, summary_ms
from tenure import ThreadRun, ThreadRuntime

REDIS_URL = os.environ.get("TENURE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
THREAD = "bench"
BATCH = 32
CHILD = str(Path(__file__).resolve())


def _redis() -> Any:
    # Imported by name: benchmarks/redis.py shadows the package for mypy.
    return importlib.import_module("redis.asyncio")


async def child(url: str, raw_key: str, opts: dict[str, Any]) -> None:
    raw = _redis().Redis.from_url(REDIS_URL)
    finished = asyncio.Event()
    burst: int = opts["burst"]

    async def handler(run: ThreadRun) -> None:
        async for _ in run.signals():
            for i in range(opts["count"]):
                await run.append({"phase": "latency", "i": i, "t": time.monotonic()})
                await raw.xadd(raw_key, {"t": repr(time.monotonic())})
                await asyncio.sleep(opts["gap"])
            rates: dict[str, list[float]] = {"append": [], "append_many": [], "raw": []}

            async def one_by_one() -> None:
                for i in range(burst):
                    await run.append(i, kind="bulk")

            async def batched() -> None:
                for start in range(0, burst, BATCH):
                    await run.append_many(list(range(start, min(burst, start + BATCH))), "bulk")

            async def raw_adds() -> None:
                for i in range(burst):
                    await raw.xadd(raw_key, {"i": i})

            cases = {"append": one_by_one, "append_many": batched, "raw": raw_adds}
            for r in range(opts["rounds"]):
                names = list(cases) if r % 2 == 0 else list(reversed(cases))
                for name in names:
                    t0 = time.perf_counter()
                    await cases[name]()
                    rates[name].append(burst / (time.perf_counter() - t0))
            await run.append(rates, kind="result")
            finished.set()

    async with (
        tenure.from_url(url) as backend,
        ThreadRuntime(backend, handler, output=True, idle_timeout=5.0) as runtime,
    ):
        await runtime.send_signal(THREAD, "go")
        await finished.wait()
    await raw.aclose()


async def parent(args: argparse.Namespace) -> list[Figure]:
    prefix = f"tenure-bench-{uuid.uuid4().hex[:8]}:"
    sep = "&" if "?" in REDIS_URL else "?"
    url = f"{REDIS_URL}{sep}prefix={prefix}"
    raw_key = f"{prefix}raw"
    redis = _redis()
    raw = redis.Redis.from_url(REDIS_URL)
    raw_ms: list[float] = []
    out_ms: list[float] = []
    result: dict[str, list[float]] = {}

    async def read_raw() -> None:
        # Reads on through the throughput slices, as the follow does: each side has a
        # reader in this process while its appends run.
        last = "0-0"
        while True:
            reply = await raw.xread({raw_key: last}, count=100, block=0)
            now = time.monotonic()
            for _, entries in reply:
                for entry_id, fields in entries:
                    last = entry_id
                    if b"t" in fields and len(raw_ms) < args.count:
                        raw_ms.append((now - float(fields[b"t"])) * 1000)

    async def nothing(run: ThreadRun) -> None:
        pass

    try:
        async with tenure.from_url(url) as backend:
            reader = ThreadRuntime(backend, nothing, output=True)
            raw_task = asyncio.ensure_future(read_raw())
            opts = json.dumps(vars(args))
            proc = await asyncio.create_subprocess_exec(
                sys.executable, CHILD, "--child", url, raw_key, opts
            )
            async for item in reader.follow(THREAD):
                now = time.monotonic()
                if item.kind == "token" and isinstance(item.data, dict):
                    out_ms.append((now - item.data["t"]) * 1000)
                elif item.kind == "result":
                    result = item.data
                    break
            raw_task.cancel()
            await asyncio.gather(raw_task, return_exceptions=True)
            await proc.wait()
            await reader.aclose()
    finally:
        keys = [k async for k in raw.scan_iter(match=prefix + "*", count=1000)]
        if keys:
            await raw.delete(*keys)
        await raw.aclose()

    print(f"output  append -> follow : {summary_ms(out_ms)}")
    print(f"raw     XADD -> XREAD    : {summary_ms(raw_ms)}")
    p50 = statistics.median(out_ms), statistics.median(raw_ms)
    p99 = percentile(out_ms, 0.99), percentile(raw_ms, 0.99)
    rate = {name: statistics.median(values) for name, values in result.items()}
    ratios = [a / r for a, r in zip(result["append"], result["raw"], strict=True)]
    batch_ratios = [a / r for a, r in zip(result["append_many"], result["raw"], strict=True)]
    for name, value in rate.items():
        print(f"items/s {name:12s}: {value:10.0f}")
    return [
        Figure(
            "redis", "output item latency p50", p50[0], p50[1], "ms", p50[0] / p50[1], ("<=", 1.3)
        ),
        Figure(
            "redis", "output item latency p99", p99[0], p99[1], "ms", p99[0] / p99[1], ("<=", 1.3)
        ),
        Figure(
            "redis",
            "items/s, one append per item",
            rate["append"],
            rate["raw"],
            "/s",
            statistics.median(ratios),
            (">=", 0.8),
        ),
        Figure(
            "redis",
            f"items/s, append_many of {BATCH}",
            rate["append_many"],
            rate["raw"],
            "/s",
            statistics.median(batch_ratios),
            (">=", 0.8),
        ),
    ]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        run(child(sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--gap", type=float, default=0.005)
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    with stamped("output"):
        figures = run(parent(args))
    print_table(figures)


if __name__ == "__main__":
    main()
