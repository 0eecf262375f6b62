"""Thread runtime at scale: what a live, idle thread costs, and how fast threads start.

Usage: ``python benchmarks/scale.py [--backend redis|postgres|sqlite] [--threads N] [--window S]
[--ttl-ms T] [--top K]``

One runtime process on a private ``redis-server`` or PostgreSQL (started for
the run, so no other client's traffic is counted), or a fresh SQLite file. ``--threads`` threads are woken by 64
concurrent senders; each one's handler takes its first signal and then waits
(a run open, idle) until the end.

- **Start rate**: threads whose handler is running, per second, from the first
  send to the last handler started.
- **Idle cost**: Redis ``INFO commandstats`` deltas over ``--window`` seconds
  while every thread waits; commands a script runs are counted, as Redis counts
  them. Per command and per thread per second. PostgreSQL: the database's
  ``pg_stat_database.xact_commit`` and ``xact_rollback`` deltas (less the
  reading query's own). SQLite: no server to count, so the statements the
  backend's connections run, counted by a trace callback set on each one as it
  is opened (``sqlite3.connect`` wrapped in this process), and its
  transactions (``BEGIN``).
- **Memory**: the process's RSS before the runtime started and with every
  thread live, and (``--top K``) tracemalloc's K largest allocation sites of
  the live threads.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: the repository root first (benchmarks/redis.py shadows redis)
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import itertools
import json
import sqlite3
import tempfile
import time
import tracemalloc
from typing import Any

import redis
import tenure
from benchmarks._common import run
from tenure import ThreadRun, ThreadRuntime
from tests.redis.helpers import wait_out_quarantine
from tests.support.pg_server import PgServer
from tests.support.redis_server import RedisServer

SENDERS = 64


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


_sqlite_statements = itertools.count()
_sqlite_begins = itertools.count()


def _count_sqlite_statements() -> None:
    """Every SQLite connection opened from now on counts the statements it runs."""
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **kwargs)

        def seen(statement: str) -> None:
            next(_sqlite_statements)
            if statement.lstrip().upper().startswith("BEGIN"):
                next(_sqlite_begins)

        conn.set_trace_callback(seen)
        return conn

    sqlite3.connect = traced  # type: ignore[assignment]  # counting only, in this process


def _peek(counter: itertools.count[int]) -> int:
    """The count so far (taking one more, which :func:`commandstats` subtracts)."""
    return next(counter)


def commandstats(url: str) -> dict[str, int]:
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
            row = conn.execute(
                "SELECT xact_commit, xact_rollback FROM pg_stat_database "
                "WHERE datname = current_database()"
            ).fetchone()
        # Counted for the next reading too: one transaction, its own.
        return {"commits": int(row[0]), "rollbacks": int(row[1])} if row else {}
    if url.startswith("sqlite"):
        return {"statements": _peek(_sqlite_statements), "transactions": _peek(_sqlite_begins)}
    client = redis.Redis.from_url(url.partition("?")[0])
    try:
        stats: dict[str, Any] = client.info("commandstats")
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def measure(url: str, threads: int, window: float, ttl_ms: int, top: int) -> dict[str, Any]:
    live = 0
    all_live = asyncio.Event()
    finish = asyncio.Event()

    async def handler(run: ThreadRun) -> None:
        nonlocal live
        async for _ in run.signals():
            live += 1
            if live == threads:
                all_live.set()
            await finish.wait()
            return

    rss_before = rss_kb()
    if top:
        tracemalloc.start(4)
    async with (
        tenure.events_of(tenure.from_url(url)) as backend,
        ThreadRuntime(backend, handler, ttl_ms=ttl_ms, idle_timeout=3600) as rt,
    ):
        keys = iter(range(threads))
        started = time.monotonic()

        async def sender() -> None:
            for i in keys:
                await rt.send_signal(f"t{i}", "wake")

        await asyncio.gather(*(sender() for _ in range(SENDERS)))
        await all_live.wait()
        start_rate = threads / (time.monotonic() - started)
        snapshot = tracemalloc.take_snapshot() if top else None
        await asyncio.sleep(min(2.0, window))  # the starts' own traffic settles
        before = commandstats(url)
        await asyncio.sleep(window)
        after = commandstats(url)
        rss_live = rss_kb()
        finish.set()
    deltas = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    deltas.pop("info", None)
    if "commits" in deltas:
        deltas["commits"] -= 1  # the first reading's own
    for own in ("statements", "transactions"):  # the first reading's peek
        if own in deltas:
            deltas[own] -= 1
    # SQLite's transactions are among its statements: not counted twice.
    total = sum(v for k, v in deltas.items() if k != "transactions")
    result: dict[str, Any] = {
        "threads": threads,
        "ttl_ms": ttl_ms,
        "start_rate_per_s": round(start_rate),
        "idle_commands_per_s": round(total / window, 1) if before else None,
        "per_thread_per_s": round(total / window / threads, 4) if before else None,
        "by_command_per_thread_per_s": {
            k: round(v / window / threads, 4) for k, v in sorted(deltas.items())
        },
        "rss_kb_before": rss_before,
        "rss_kb_live": rss_live,
        "rss_kb_per_thread": round((rss_live - rss_before) / threads, 1),
    }
    if snapshot is not None:
        stats = snapshot.statistics("lineno")[:top]
        result["top_allocations"] = [
            f"{s.size / threads:.0f} B/thread {s.count / threads:.1f} objs/thread "
            f"{s.traceback[0].filename.rsplit('/', 2)[-1]}:{s.traceback[0].lineno}"
            for s in stats
        ]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("redis", "postgres", "sqlite"), default="redis")
    parser.add_argument("--threads", type=int, default=1000)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--ttl-ms", type=int, default=15_000)
    parser.add_argument("--top", type=int, default=0)
    args = parser.parse_args()
    figures = (args.threads, args.window, args.ttl_ms, args.top)
    if args.backend == "postgres":
        with PgServer() as pg:
            result = run(measure(pg.url, *figures))
    elif args.backend == "sqlite":
        _count_sqlite_statements()
        with tempfile.TemporaryDirectory() as tmp:
            result = run(measure(f"sqlite:///{tmp}/scale.db", *figures))
    else:
        with RedisServer() as server:
            # A new server quarantines new prefixes for max_ttl_ms: not what is measured.
            url = f"{server.url}?max_ttl_ms={args.ttl_ms}"
            wait_out_quarantine(server.url, max_ttl_ms=args.ttl_ms)
            result = run(measure(url, *figures))
    result["backend"] = args.backend
    sys.stdout.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
