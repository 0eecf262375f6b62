"""The dashboard's cost: time to first render with 10,000 live leases, and the
backend load it adds while idle and while 10 browsers watch.

Usage: ``python benchmarks/dashboard.py [--leases N] [--seconds S] [--clients C]``

On a private Redis and a private PostgreSQL (so that nothing else's traffic is
counted), ``--leases`` live leases (TTL 30 min, never renewed: the only traffic
left is the dashboard's) are granted, then ``tenure dashboard`` is started in a
process of its own, exactly as an operator runs it:

1. **First render**: from the moment the dashboard accepts connections, the
   time of the first ``GET /leases`` (page 1 from the first leases its first
   look has read), and until that look of every lease has ended; then the median and p90 of 20 more (page 1, no filter),
   and of 20 with an owner filter (every row looked at); and the page opened
   on a dashboard nobody had looked at for a while.
2. **Backend load**: requests per second to the backend over ``--seconds``
   (in three windows, one and many pages taking turns),
   counted by the server (Redis: ``total_commands_processed``, which counts
   the commands run inside the read script too; PostgreSQL: transactions of
   the database in ``pg_stat_database``), with no page open, then with one
   and with ``--clients`` Server-Sent Events clients on the leases page. One
   and ``--clients`` pages should cost the same: every page and every live
   update is served from one scan.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: import the benchmarks package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import contextlib
import dataclasses
import json
import signal
import socket
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from benchmarks._common import Figure, percentile, print_table, run, stamped
from tenure import from_url
from tenure.dashboard._watcher import WATCHED_S
from tests.support.pg_server import PgServer
from tests.support.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
TTL_MS = 30 * 60 * 1000
FIRST_RENDER_GOAL_MS = 300.0
#: The load windows are taken in this many turns (see ``measure``).
ROUNDS = 3


async def bare_scan_ms(url: str) -> float:
    """How long ``scan_leases`` of every lease takes on its own (no dashboard)."""
    async with from_url(url) as backend:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            async for _pair in backend.scan_leases(""):
                pass
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)


async def grant(url: str, count: int) -> None:
    async with from_url(url) as backend:
        gate = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with gate:
                result = await backend.acquire_lease(f"jobs/{i:06d}", f"worker-{i % 97}", TTL_MS)
                assert result.acquired, result

        await asyncio.gather(*(one(i) for i in range(count)))


@contextlib.contextmanager
def dashboard(url: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenure", "dashboard", "--url", url, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the dashboard exited {proc.returncode}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("the dashboard did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def timed_get(url: str) -> float:
    """Milliseconds to the last byte of ``url``'s answer."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as answer:
        answer.read()
        assert answer.status == 200
    return (time.perf_counter() - started) * 1000


def stats(base: str) -> dict[str, Any]:
    """The dashboard's own counters (scans, time spent scanning)."""
    with urllib.request.urlopen(base + "/stats.json", timeout=60) as answer:
        found: dict[str, Any] = json.load(answer)
        return found


def first_look_ended(base: str) -> None:
    """Once the dashboard's first look at every lease has ended."""
    while stats(base)["scans"] < 1:
        time.sleep(0.005)


async def sse_client(base: str, opened: asyncio.Event, counter: list[int]) -> None:
    """One browser's live updates on the leases page: read and count them."""
    port = int(base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /events?view=leases HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    opened.set()
    try:
        while line := await reader.readline():
            if line.startswith(b"event: update"):
                counter[0] += 1
    finally:
        writer.close()


@dataclass
class Window:
    """What the backend served while ``pages`` live pages were open (summed over windows)."""

    pages: int
    seconds: float = 0.0
    requests: int = 0
    scans: int = 0
    scanning_s: float = 0.0
    updates: int = 0

    def __str__(self) -> str:
        per_scan = self.requests / self.scans if self.scans else float("nan")
        mean_ms = self.scanning_s / self.scans * 1000 if self.scans else float("nan")
        return (
            f"{self.pages} live page{'' if self.pages == 1 else 's'}: "
            f"{self.requests / self.seconds:,.1f} req/s, {self.scans / self.seconds:.2f} scans/s "
            f"(a scan: {per_scan:,.0f} requests, {mean_ms:.0f} ms), {self.updates} updates sent"
        )


async def load(
    base: str, window: Window, seconds: float, requests: Callable[[], Awaitable[int]]
) -> None:
    """Add to ``window`` what the backend served over ``seconds`` with its pages open."""
    counter = [0]
    tasks = []
    for _ in range(window.pages):
        opened = asyncio.Event()
        tasks.append(asyncio.create_task(sse_client(base, opened, counter)))
        await opened.wait()
    await asyncio.sleep(1.0)  # let every client settle into the stream
    before, stats_before = await requests(), await asyncio.to_thread(stats, base)
    started = time.monotonic()
    await asyncio.sleep(seconds)
    after, stats_after = await requests(), await asyncio.to_thread(stats, base)
    window.seconds += time.monotonic() - started
    window.requests += after - before
    window.scans += stats_after["scans"] - stats_before["scans"]
    window.scanning_s += stats_after["scanning_s"] - stats_before["scanning_s"]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    window.updates += counter[0]


async def measure(
    name: str,
    url: str,
    leases: int,
    seconds: float,
    clients: int,
    requests: Callable[[], Awaitable[int]],
) -> list[Figure]:
    started = time.monotonic()
    await grant(url, leases)
    print(f"{name}: {leases} leases granted in {time.monotonic() - started:.1f} s", flush=True)
    bare = await bare_scan_ms(url)
    print(f"{name}: a bare scan_leases of them all: {bare:.0f} ms (median of 3)", flush=True)
    figures = []
    with dashboard(url) as base:
        listening = time.perf_counter()
        first = await asyncio.to_thread(timed_get, base + "/leases")
        # The first page is shown from the first look's first leases; the whole list
        # (counted, paged) when that look ends.
        await asyncio.to_thread(first_look_ended, base)
        whole = (time.perf_counter() - listening) * 1000
        warm = [await asyncio.to_thread(timed_get, base + "/leases") for _ in range(20)]
        owner = [
            await asyncio.to_thread(timed_get, base + "/leases?owner=worker-7") for _ in range(20)
        ]
        print(
            f"{name}: first render {first:.0f} ms, the first look of every lease ended after "
            f"{whole:.0f} ms; then p50 "
            f"{statistics.median(warm):.1f} ms, p90 {percentile(warm, 0.9):.1f} ms; "
            f"with an owner filter p50 {statistics.median(owner):.1f} ms",
            flush=True,
        )
        figures.append(
            dataclasses.replace(
                Figure.limit(
                    name,
                    "dashboard first render after start (10k leases)",
                    first,
                    "ms",
                    ("<=", FIRST_RENDER_GOAL_MS),
                ),
                note="page 1 from the first look's first leases",
            )
        )
        figures.append(
            Figure(
                name,
                "dashboard first look of every lease after start vs a bare scan",
                whole,
                bare,
                "ms",
                whole / bare,
                note="the whole list (counted, paged) replaces the first page then",
            )
        )
        figures.append(
            Figure.limit(
                name,
                "dashboard render p50 (10k leases)",
                statistics.median(warm),
                "ms",
                ("<=", FIRST_RENDER_GOAL_MS),
            )
        )
        # Nobody looking: the watcher slows down once the last page is WATCHED_S old.
        await asyncio.sleep(WATCHED_S + 1)
        idle = Window(0)
        await load(base, idle, seconds / ROUNDS, requests)
        print(f"{name}: no page open: {idle}", flush=True)
        opened = await asyncio.to_thread(timed_get, base + "/leases")
        print(f"{name}: the leases page opened on an idle dashboard: {opened:.0f} ms", flush=True)
        figures.append(
            Figure.limit(
                name,
                "dashboard page opened when idle (10k leases)",
                opened,
                "ms",
                ("<=", FIRST_RENDER_GOAL_MS),
            )
        )
        # One page, then many, in turns: the scan's pace follows the machine's load,
        # which changes over a run; interleaving spreads that over both.
        one, many = Window(1), Window(clients)
        for _ in range(ROUNDS):
            for window in (one, many):
                await load(base, window, seconds / ROUNDS, requests)
        print(f"{name}: {one}", flush=True)
        print(f"{name}: {many}", flush=True)
        figures.append(
            Figure(
                name,
                f"dashboard backend req/s, {clients} live pages vs 1",
                many.requests / many.seconds,
                one.requests / one.seconds,
                "req/s",
                (many.requests / many.seconds) / (one.requests / one.seconds),
                ("<=", 1.1),
                note=f"no page open: {idle.requests / idle.seconds:.1f} req/s",
            )
        )
    return figures


async def redis_requests(server: RedisServer) -> int:
    info = await asyncio.to_thread(server.command, "INFO", "stats")
    return int(info["total_commands_processed"]) - 1  # the INFO itself


def pg_requests(url: str) -> Callable[[], Awaitable[int]]:
    async def count() -> int:
        import psycopg

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            row = await (
                await conn.execute(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database"
                    " WHERE datname = current_database()"
                )
            ).fetchone()
            assert row is not None
            return int(row[0])

    return count


async def figures_of(leases: int, seconds: float, clients: int) -> list[Figure]:
    found = []
    with RedisServer() as server:
        url = server.url + f"?quarantine=off&max_ttl_ms={TTL_MS}"
        found += await measure(
            "redis", url, leases, seconds, clients, lambda: redis_requests(server)
        )
    with PgServer() as pg:
        found += await measure("postgres", pg.url, leases, seconds, clients, pg_requests(pg.url))
    return found


def figures(full: bool = False) -> list[Figure]:
    return run(figures_of(10_000, 60.0 if full else 30.0, 10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args()
    # A TERM runs the clean-ups (the private servers, the dashboard) like an interrupt.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with stamped("dashboard"):
        found = run(figures_of(args.leases, args.seconds, args.clients))
    print_table(found)


if __name__ == "__main__":
    main()
