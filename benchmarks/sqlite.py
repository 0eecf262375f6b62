"""SQLite backend benchmark: tenure against raw sqlite3 doing the same writes, in the same run.

Usage: ``python benchmarks/sqlite.py [--cycles N] [--seconds S] [--baseline REF] [--wake-only]``

1. Sequential acquire+release cycles. The baseline issues the same statements
   (BEGIN IMMEDIATE, the lease read, the token bump, the insert, COMMIT; then
   BEGIN IMMEDIATE, the delete, COMMIT) with the same driver and pragmas (WAL,
   synchronous=NORMAL, busy_timeout), run the same way: on one dedicated thread
   with its own connection, awaited from the event loop. A raw run called
   directly on the loop thread (no hand-off) is printed for context.
2. Four processes contending on the same 100 keys (acquire, release when won),
   tenure and raw, each for ``--seconds``.
3. ``renew_leases`` of 10,000 keys in one call.
4. Wake-ups across processes, this tree against a baseline git ref (default
   ``main``, extracted with ``git archive``; ``--baseline ''`` for none), in
   interleaved slices of the same run: delivery latency (publisher in a child
   process, from ``created_at`` to the callback: p50, p99), hand-off (a holder
   in a child process releases, a waiter blocked in ``acquire_wait`` takes the
   lease: median, p90, on the host's monotonic clock) and the CPU an idle
   subscriber process uses (``/proc/<pid>/task/*/schedstat`` over
   ``--idle-seconds``, every tree at once). ``--wake-only`` runs only this.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: import the benchmarks package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import json
import os
import queue
import random
import sqlite3
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks._common import (
    Figure,
    interleave,
    percentile,
    print_table,
    run,
    stamped,
)
from tenure import Event
from tenure.backends.sqlite import SqlitePubSub

TTL_MS = 30_000
# (cycles per sequential run, rounds, seconds of contention, wake-up slices, idle seconds)
FULL = (1000, 15, 5.0, 6, 10.0)
SHORT = (300, 6, 1.5, 2, 3.0)


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


async def sequential(path: str, cycles: int, rounds: int) -> list[Figure]:
    async with SqlitePubSub(path) as backend:
        await backend.get_lease_owner("warm-up")  # creates the schema
        raw = RawLeases(path)
        runner = OnThread()
        keys = [f"seq-{i}" for i in range(100)]
        bkeys = [k.encode() for k in keys]

        async def run_tenure() -> tuple[float, float]:
            start = time.perf_counter()
            for i in range(cycles):
                key = keys[i % 100]
                await backend.acquire_lease(key, "bench", TTL_MS)
                await backend.release_lease(key, "bench")
            return cycles, time.perf_counter() - start

        async def run_raw() -> tuple[float, float]:
            start = time.perf_counter()
            for i in range(cycles):
                key = bkeys[i % 100]
                await runner.run(raw.acquire, key, b"bench", TTL_MS)
                await runner.run(raw.release, key, b"bench")
            return cycles, time.perf_counter() - start

        async def run_raw_inline() -> tuple[float, float]:
            start = time.perf_counter()
            for i in range(cycles):
                key = bkeys[i % 100]
                raw.acquire(key, b"bench", TTL_MS)
                raw.release(key, b"bench")
            return cycles, time.perf_counter() - start

        await run_tenure()
        await run_raw()  # warm-up of both paths
        # Short runs in alternating order, so that load from other work on the
        # machine hits both alike; the ratio is taken within each round.
        result = await interleave(
            {"tenure": run_tenure, "raw": run_raw, "raw-inline": run_raw_inline}, rounds
        )
        runner.stop()
        raw.conn.close()
    med = {name: statistics.median(v) for name, v in result.rounds.items()}
    ratios = result.ratios("tenure", "raw")
    print(f"sequential acquire+release cycles ({rounds} pairs of runs of {cycles} cycles, median):")
    print(f"  tenure SqlitePubSub         {med['tenure']:9.0f} cycles/s")
    print(f"  raw sqlite3, on a thread    {med['raw']:9.0f} cycles/s   (baseline)")
    print(f"  raw sqlite3, on the loop    {med['raw-inline']:9.0f} cycles/s   (context only)")
    print(
        f"  ratio tenure / baseline     {statistics.median(ratios):9.2f}   "
        f"(median of per-pair ratios; goal >= 0.80; pairs min {min(ratios):.2f} max {max(ratios):.2f})"
    )
    return [
        Figure(
            "sqlite",
            "sequential acquire+release vs raw sqlite3 on a thread",
            med["tenure"],
            med["raw"],
            "cycles/s",
            statistics.median(ratios),
            (">=", 0.8),
        )
    ]


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
    print(json.dumps({"ops": ops, "wins": wins}), flush=True)


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


# -- 4. wake-ups across processes, this tree against a baseline ref -------------------------
# Every measurement runs in child processes whose PYTHONPATH picks the tree, so the
# baseline (by default main, extracted with git archive) and this tree alternate
# in short slices of the same run.


def baseline_src(ref: str, tmp: str) -> str:
    """The ``src`` directory of git ``ref`` of this repository, extracted under ``tmp``."""
    repo = Path(__file__).resolve().parent.parent
    out = Path(tmp) / "baseline"
    out.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", ref, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return str(out / "src")


def tree_env(src: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    return env


def role(src: str | None, *args: str) -> dict[str, Any]:
    """Run ``sqlite.py --ROLE ARGS`` on the tree ``src``; its last stdout line, as JSON."""
    out = subprocess.run(
        [sys.executable, __file__, *args], env=tree_env(src), stdout=subprocess.PIPE, check=True
    ).stdout  # its stderr shows, should it fail
    doc: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
    return doc


async def publisher_worker(path: str, count: int) -> None:
    rng = random.Random(2)
    async with SqlitePubSub(path) as backend:
        for i in range(count):
            # Random gaps: a publish falls at a random point of a polling cycle.
            await asyncio.sleep(rng.uniform(0.01, 0.03))
            await backend.publish("latency", Event(type="ping", data=i))


async def delivery_role(path: str, count: int) -> None:
    """Subscribe here, publish from a child process; latency from ``created_at`` to the callback."""
    latencies: list[float] = []
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
        await asyncio.wait_for(all_in.wait(), 10)
        await backend.unsubscribe("latency", on_event)
    print(json.dumps({"latencies": latencies}))


async def holder_role(path: str) -> None:
    """For each ``hold`` line: take the key; then at the next line note the time and release it."""
    loop = asyncio.get_running_loop()
    async with SqlitePubSub(path) as backend:
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "hold":
            # The waiter released it before asking again.
            assert (await backend.acquire_lease("handoff", "holder", TTL_MS)).acquired
            print("held", flush=True)
            await loop.run_in_executor(None, sys.stdin.readline)
            released_at = time.monotonic()  # one clock for every process of the host
            await backend.release_lease("handoff", "holder")
            print(json.dumps({"released_at": released_at}), flush=True)


async def handoff_role(path: str, count: int) -> None:
    """A holder in a child process releases; the waiter here blocks in ``acquire_wait``."""
    import tenure

    rng = random.Random(3)
    samples: list[float] = []
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--holder",
        path,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    async with SqlitePubSub(path) as backend:
        for _ in range(count):
            child.stdin.write(b"hold\n")
            assert (await child.stdout.readline()).strip() == b"held"
            task = asyncio.create_task(
                tenure.acquire_wait(backend, "handoff", "waiter", TTL_MS, timeout=10)
            )
            await asyncio.sleep(rng.uniform(0.02, 0.12))  # parked, like a real waiter
            assert not task.done()
            child.stdin.write(b"release\n")
            released_at = json.loads(await child.stdout.readline())["released_at"]
            await task
            samples.append(time.monotonic() - released_at)
            await backend.release_lease("handoff", "waiter")
        child.stdin.write(b"stop\n")
        await child.wait()
    print(json.dumps({"handoffs": samples}))


async def idle_role(path: str) -> None:
    async def on_event(event: Event) -> None:
        pass

    async with SqlitePubSub(path) as backend:
        await backend.subscribe("idle", on_event)
        print("ready", flush=True)
        await asyncio.Event().wait()


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far (schedstat: nanoseconds; else stat: ticks)."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks.iterdir()) / 1e9
    except (OSError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(trees: dict[str, str | None], tmp: str, seconds: float) -> dict[str, float]:
    """Idle subscribers of every tree at once, each on a file of its own; CPU over ``seconds``."""
    procs = {
        label: subprocess.Popen(
            [sys.executable, __file__, "--idle", str(Path(tmp) / f"idle-{n}.db")],
            env=tree_env(src),
            stdout=subprocess.PIPE,
        )
        for n, (label, src) in enumerate(trees.items())
    }
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(1.0)  # past start-up
        start = {label: cpu_seconds(p.pid) for label, p in procs.items()}
        wall = time.perf_counter()
        time.sleep(seconds)
        wall = time.perf_counter() - wall
        return {label: (cpu_seconds(p.pid) - start[label]) / wall for label, p in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def wake_comparison(
    trees: dict[str, str | None], tmp: str, slices: int, events: int, handoffs: int, idle: float
) -> list[Figure]:
    load_before = os.getloadavg()[0]
    delivery: dict[str, list[float]] = {label: [] for label in trees}
    handoff: dict[str, list[float]] = {label: [] for label in trees}
    labels = list(trees)
    for i in range(slices):
        for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
            src = trees[label]
            db = str(Path(tmp) / f"wake-{label}-{i}.db")
            delivery[label] += role(src, "--delivery", db, str(events))["latencies"]
            handoff[label] += role(src, "--handoff", db, str(handoffs))["handoffs"]
    cpu = idle_cpu(trees, tmp, idle)
    load_after = os.getloadavg()[0]
    print(
        f"wake-ups across processes ({slices} interleaved slices of {events} events and "
        f"{handoffs} hand-offs per tree; idle CPU of a subscriber over {idle:.0f} s, all trees at once):"
    )
    print(
        f"  {'tree':10s} {'delivery p50':>12s} {'p99':>8s} {'hand-off median':>16s} {'p90':>8s} "
        f"{'idle CPU':>9s}"
    )
    for label in labels:
        d = [x * 1000 for x in delivery[label]]
        h = [x * 1000 for x in handoff[label]]
        print(
            f"  {label:10s} {statistics.median(d):9.2f} ms {percentile(d, 0.99):5.1f} ms "
            f"{statistics.median(h):13.2f} ms {percentile(h, 0.9):5.1f} ms {cpu[label] * 100:8.2f}%"
        )
    print("  goals: delivery p50 < 1 ms, p99 < 5 ms; hand-off median < 1 ms; idle < 0.2% of a core")
    print(f"  load average (1 min): {load_before:.2f} before, {load_after:.2f} after")
    if len(labels) == 2:
        old, new = labels
        ratio = statistics.median(delivery[old]) / statistics.median(delivery[new])
        hratio = statistics.median(handoff[old]) / statistics.median(handoff[new])
        print(
            f"  {new} is {ratio:.1f}x faster in delivery p50 and {hratio:.1f}x in hand-off than {old}"
        )
    # The summary's figures: this tree's, against the goals (absolute, no baseline).
    d = [x * 1000 for x in delivery["this tree"]]
    h = [x * 1000 for x in handoff["this tree"]]
    return [
        Figure.limit(
            "sqlite", "cross-process delivery p50", statistics.median(d), "ms", ("<=", 1.0)
        ),
        Figure.limit(
            "sqlite", "cross-process delivery p99", percentile(d, 0.99), "ms", ("<=", 5.0)
        ),
        Figure.limit("sqlite", "hand-off median", statistics.median(h), "ms", ("<=", 1.0)),
        Figure.limit(
            "sqlite", "idle subscriber, % of one core", cpu["this tree"] * 100, "%", ("<=", 0.2)
        ),
    ]


def measure(
    cycles: int,
    rounds: int,
    seconds: float,
    slices: int,
    idle: float,
    baseline: str = "",
    wake_only: bool = False,
) -> list[Figure]:
    print(
        f"sqlite {sqlite3.sqlite_version}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )
    found: list[Figure] = []
    with tempfile.TemporaryDirectory() as tmp:
        trees: dict[str, str | None] = {}
        if baseline:
            trees[baseline] = baseline_src(baseline, tmp)
        trees["this tree"] = None
        if not wake_only:
            path = str(Path(tmp) / "bench.db")
            found += run(sequential(path, cycles, rounds))
            print(f"four processes contending on the same 100 keys, {seconds:g} s each:")
            rates = {}
            for kind in ("tenure", "raw"):
                rate, wins = contend(path, kind, seconds)
                rates[kind] = rate
                label = "tenure SqlitePubSub" if kind == "tenure" else "raw sqlite3, on a thread"
                print(f"  {label:26s}  {rate:9.0f} lease ops/s  ({wins} grants)")
            print(f"  ratio tenure / baseline     {rates['tenure'] / rates['raw']:9.2f}")
            found.append(
                Figure(
                    "sqlite",
                    "4 processes on the same 100 keys vs raw",
                    rates["tenure"],
                    rates["raw"],
                    "ops/s",
                    rates["tenure"] / rates["raw"],
                    (">=", 0.8),
                )
            )
            run(batch_renew(path))
        found += wake_comparison(trees, tmp, slices, 40, 15, idle)
    return found


def figures(full: bool = False) -> list[Figure]:
    with stamped("sqlite"):
        return measure(*(FULL if full else SHORT))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, path, owner, seconds, go = sys.argv[2:7]
        run(contend_worker(kind, path, owner, float(seconds), go))
        return
    roles: dict[str, Callable[..., Any]] = {
        "--publisher": lambda path, n: publisher_worker(path, int(n)),
        "--delivery": lambda path, n: delivery_role(path, int(n)),
        "--handoff": lambda path, n: handoff_role(path, int(n)),
        "--holder": holder_role,
        "--idle": idle_role,
    }
    if len(sys.argv) > 1 and sys.argv[1] in roles:
        run(roles[sys.argv[1]](*sys.argv[2:]))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=FULL[0])
    parser.add_argument("--rounds", type=int, default=FULL[1])
    parser.add_argument("--seconds", type=float, default=FULL[2])
    parser.add_argument(
        "--baseline",
        default="main",
        help="git ref the wake-up figures are compared with ('' for none)",
    )
    parser.add_argument("--wake-only", action="store_true", help="only the wake-up comparison")
    parser.add_argument("--slices", type=int, default=FULL[3])
    parser.add_argument("--idle-seconds", type=float, default=FULL[4])
    args = parser.parse_args()
    with stamped("sqlite"):
        found = measure(
            args.cycles,
            args.rounds,
            args.seconds,
            args.slices,
            args.idle_seconds,
            args.baseline,
            args.wake_only,
        )
    print_table(found)


if __name__ == "__main__":
    main()
