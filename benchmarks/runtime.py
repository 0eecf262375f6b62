"""Thread runtime benchmark: signal latency and throughput against raw pub/sub, in the same run.

Usage: ``python benchmarks/runtime.py [--backend sqlite|redis|all] [--count N] [--burst M] [--rounds R]
[--policy coalesce|interrupt|rollback]``

For each backend, two processes share it: this one sends, a child receives.

1. Latency. The child owns a thread (it woke it with a signal of its own and
   keeps its run open). This process sends ``--count`` signals one at a time,
   ``--gap`` seconds apart, with ``ThreadRuntime.send_signal``; the child's
   handler stamps each as it receives it. Baseline, in the same run and the
   same two processes: ``publish`` of an event to a topic the child is
   subscribed to with a consumer group (the delivery path the runtime uses),
   stamped in the child's callback. Latency = receive stamp - stamp taken just
   before the call (``time.monotonic()``, one clock for the host).
2. Throughput through one thread, in ``--rounds`` interleaved slices (the
   order reversed every other round): per slice, ``--burst`` signals sent back
   to back, from the first send to the last receipt; baseline: as many events
   published back to back to a group subscriber. The ratio is the median of
   the per-slice ratios, so a burst that a noisy moment hit counts once.

With ``--policy P``, a third path in the same run, interleaved with the two
others: ``send_signal(..., policy=P)`` to the same owner (whose own default is
``enqueue``: the policy travels with the signal). A signal coalesced into a
later one counts as received when the later one's run receives it; one an
interrupt skipped is never received, and a burst ends at its last signal's
receipt. ``reject`` is not measured: the child's run is always active, so
nothing would be delivered.

Goals: runtime latency at most 1.5 x the raw publish-to-subscriber latency;
throughput at least 0.8 x raw; under ``--policy``, at least 0.9 x ``enqueue``
(throughput), and latency at most 1.11 x ``enqueue``'s.
Redis uses the shared server at ``TENURE_BENCH_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``) under a prefix of its own, deleted at the end.
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
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, get_args

import tenure
from benchmarks._common import Figure, interleave, print_table, run, stamped, summary_ms
from tenure import Event, ThreadRun, ThreadRuntime
from tenure.runtime._types import Policy

REDIS_URL = os.environ.get("TENURE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
THREAD = "bench-thread"
TOPIC = "bench-raw"
# (latency samples, signals per throughput slice, rounds of slices)
FULL = (300, 250, 40)
SHORT = (100, 200, 4)


def say(**doc: Any) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


# -- the receiving child ---------------------------------------------------------


async def child(url: str) -> None:
    async def handler(run: ThreadRun) -> None:
        async for signal in run.signals():
            now = time.monotonic()
            if signal.payload != "warm-up":
                for one in (*signal.coalesced, signal):
                    say(kind="runtime", i=one.payload["i"], recv=now, cpu=time.process_time())

    async def on_raw(event: Event) -> None:
        say(kind="raw", i=event.data["i"], recv=time.monotonic(), cpu=time.process_time())

    async with tenure.events_of(tenure.from_url(url)) as backend:
        await backend.subscribe(TOPIC, on_raw, group="bench")
        # A long idle timeout keeps this process's run open for the whole benchmark.
        async with ThreadRuntime(backend, handler, idle_timeout=600, process_id="child") as rt:
            woke = await rt.send_signal(THREAD, "warm-up")
            assert woke.outcome == "wake", woke
            say(kind="ready")
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await backend.unsubscribe(TOPIC, on_raw)


# -- the sending parent ------------------------------------------------------------


class Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.recv: dict[tuple[str, int], float] = {}
        # The receiving process's CPU time when it took each one.
        self.cpu: dict[tuple[str, int], float] = {}
        self.ready = asyncio.Event()
        self.arrived = asyncio.Event()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            doc = json.loads(line)
            if doc["kind"] == "ready":
                self.ready.set()
            else:
                self.recv[(doc["kind"], doc["i"])] = doc["recv"]
                self.cpu[(doc["kind"], doc["i"])] = doc["cpu"]
                self.arrived.set()

    async def wait_for(self, kind: str, i: int, timeout: float = 30.0) -> float:
        async with asyncio.timeout(timeout):
            while (kind, i) not in self.recv:
                self.arrived.clear()
                await self.arrived.wait()
        return self.recv[(kind, i)]

    def cpu_each(self, kind: str, first: int, count: int) -> float:
        """Microseconds of the receiver's CPU per event from the first to the last of a burst."""
        spent = self.cpu[(kind, first + count - 1)] - self.cpu[(kind, first)]
        return spent / (count - 1) * 1e6

    async def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"\n")
        await self.proc.stdin.drain()
        await asyncio.wait_for(self.proc.wait(), 30)
        await self.reader


async def bench(
    name: str, url: str, count: int, burst: int, rounds: int, gap: float, policy: Policy | None
) -> list[Figure]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--child",
        url,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    kid = Child(proc)
    try:
        await asyncio.wait_for(kid.ready.wait(), 30)
        async with (
            tenure.events_of(tenure.from_url(url)) as backend,
            ThreadRuntime(backend, _never_runs, idle_timeout=600, process_id="parent") as rt,
        ):
            # Warm both paths (connections, scripts, prepared statements).
            for i in range(-20, 0):
                await backend.publish(TOPIC, Event("bench", {"i": i}))
                result = await rt.send_signal(THREAD, {"i": i})
                assert result.outcome == "deliver", result
                await kid.wait_for("raw", i)
                await kid.wait_for("runtime", i)

            # 1. latency, the two paths interleaved so both see the same load.
            raw: list[float] = []
            runtime: list[float] = []
            under: list[float] = []
            for i in range(count):
                if policy is not None:
                    start = time.monotonic()
                    await rt.send_signal(THREAD, {"i": -1_000_000 - i}, policy=policy)
                    under.append((await kid.wait_for("runtime", -1_000_000 - i) - start) * 1000)
                    await asyncio.sleep(gap)
                start = time.monotonic()
                await backend.publish(TOPIC, Event("bench", {"i": i}))
                raw.append((await kid.wait_for("raw", i) - start) * 1000)
                await asyncio.sleep(gap)
                start = time.monotonic()
                await rt.send_signal(THREAD, {"i": i})
                runtime.append((await kid.wait_for("runtime", i) - start) * 1000)
                await asyncio.sleep(gap)

            # 2. throughput through one thread, in interleaved slices: a burst
            # of each path per round, timed from its first send to its last
            # receipt. The sender's CPU time per send (a loaded machine disturbs
            # it less) and the receiver's are summed over the slices.
            numbers = {"raw": 1_000_000, "runtime": 2_000_000, "policy": 3_000_000}
            cpu = {"raw": [0.0, 0.0], "runtime": [0.0, 0.0], "policy": [0.0, 0.0]}

            def burst_of(kind: str) -> Callable[[], Awaitable[tuple[float, float]]]:
                async def one() -> tuple[float, float]:
                    first = numbers[kind]
                    numbers[kind] += burst
                    start, used = time.monotonic(), time.process_time()
                    for i in range(first, first + burst):
                        if kind == "raw":
                            await backend.publish(TOPIC, Event("bench", {"i": i}))
                        elif kind == "policy":
                            await rt.send_signal(THREAD, {"i": i}, policy=policy)
                        else:
                            await rt.send_signal(THREAD, {"i": i})
                    cpu[kind][0] += (time.process_time() - used) / burst * 1e6
                    received = "raw" if kind == "raw" else "runtime"
                    last = await kid.wait_for(received, first + burst - 1, 120)
                    if kind != "policy":  # a skipped first signal has no receipt
                        cpu[kind][1] += kid.cpu_each(received, first, burst)
                    return burst, last - start

                return one

            cases = {"runtime": burst_of("runtime"), "raw": burst_of("raw")}
            if policy is not None:
                cases["policy"] = burst_of("policy")
            slices = await interleave(cases, rounds)
    finally:
        await kid.stop()

    ratio = statistics.median(runtime) / statistics.median(raw)
    print(f"[{name}] latency, send in one process -> handler in the owning process")
    print(f"  raw publish -> group subscriber : {summary_ms(raw)}")
    print(f"  runtime send_signal -> handler  : {summary_ms(runtime)}")
    verdict = "meets" if ratio <= 1.5 else "MISSES"
    print(f"  ratio of medians runtime/raw    : {ratio:.2f}  ({verdict} the 1.5x goal)")
    raw_rate, rt_rate = slices.rate("raw"), slices.rate("runtime")
    through = slices.ratio("runtime", "raw")
    ratios = slices.ratios("runtime", "raw")
    print(
        f"[{name}] throughput through one thread ({rounds} interleaved slices of {burst} back to back)"
    )
    print(
        f"  raw publish -> group subscriber : {raw_rate:9.0f} events/s  "
        f"(CPU each: sender {cpu['raw'][0] / rounds:.0f} us, receiver {cpu['raw'][1] / rounds:.0f} us)"
    )
    print(
        f"  runtime send_signal -> handler  : {rt_rate:9.0f} signals/s  "
        f"(CPU each: sender {cpu['runtime'][0] / rounds:.0f} us, receiver {cpu['runtime'][1] / rounds:.0f} us)"
    )
    print(
        f"  ratio runtime/raw               : {through:.2f} median of per-slice ratios "
        f"(min {min(ratios):.2f}, max {max(ratios):.2f}; goal >= 0.8)"
    )
    found: list[Figure] = []
    if policy is not None:
        lat = statistics.median(under) / statistics.median(runtime)
        rate = slices.rate("policy")
        print(f"[{name}] policy={policy} against enqueue, same run")
        print(f"  latency  : {summary_ms(under)}  ratio {lat:.2f} (goal <= 1.11)")
        print(
            f"  throughput: {rate:9.0f} signals/s  ratio "
            f"{slices.ratio('policy', 'runtime'):.2f} (goal >= 0.9)"
        )
        found += [
            Figure(
                name,
                f"runtime: {policy} signal latency median vs enqueue",
                statistics.median(under),
                statistics.median(runtime),
                "ms",
                lat,
                ("<=", 1.11),
            ),
            Figure(
                name,
                f"runtime: {policy} throughput through one thread vs enqueue",
                rate,
                rt_rate,
                "/s",
                slices.ratio("policy", "runtime"),
                (">=", 0.9),
            ),
        ]
    return [
        *found,
        Figure(
            name,
            "runtime: signal latency median vs raw publish -> subscriber",
            statistics.median(runtime),
            statistics.median(raw),
            "ms",
            ratio,
            ("<=", 1.5),
        ),
        Figure(
            name,
            "runtime: throughput through one thread vs raw pub/sub",
            rt_rate,
            raw_rate,
            "/s",
            through,
            (">=", 0.8),
        ),
    ]


async def _never_runs(run: ThreadRun) -> None:
    raise AssertionError(f"the parent must never run the thread, got {run!r}")


async def measure(
    backends: list[str],
    count: int,
    burst: int,
    rounds: int,
    gap: float,
    policy: Policy | None = None,
) -> list[Figure]:
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"count={count}, burst={burst}, rounds={rounds}"
    )
    found: list[Figure] = []
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            found += await bench(
                "sqlite", f"sqlite:///{tmp}/bench.db", count, burst, rounds, gap, policy
            )
    if "redis" in backends:
        prefix = f"tenure-bench-{uuid.uuid4().hex[:8]}:"
        sep = "&" if "?" in REDIS_URL else "?"
        try:
            found += await bench(
                "redis", f"{REDIS_URL}{sep}prefix={prefix}", count, burst, rounds, gap, policy
            )
        finally:
            # Imported by name: benchmarks/redis.py shadows the package for mypy.
            redis_sync: Any = importlib.import_module("redis")
            client = redis_sync.Redis.from_url(REDIS_URL)
            keys = list(client.scan_iter(match=prefix + "*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
    return found


def figures(full: bool = False) -> list[Figure]:
    with stamped("runtime"):
        return run(measure(["sqlite", "redis"], *(FULL if full else SHORT), 0.002))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "redis", "all"], default="all")
    parser.add_argument("--count", type=int, default=FULL[0], help="latency samples per path")
    parser.add_argument("--burst", type=int, default=FULL[1], help="signals per throughput slice")
    parser.add_argument("--rounds", type=int, default=FULL[2], help="throughput slices per path")
    parser.add_argument("--gap", type=float, default=0.002, help="seconds between samples")
    parser.add_argument(
        "--policy",
        choices=[p for p in get_args(Policy) if p not in ("enqueue", "reject")],
        help="also measure sends under this policy against enqueue",
    )
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(child(args.child))
        return
    backends = ["sqlite", "redis"] if args.backend == "all" else [args.backend]
    with stamped("runtime"):
        found = run(measure(backends, args.count, args.burst, args.rounds, args.gap, args.policy))
    print_table(found)


if __name__ == "__main__":
    main()
