"""The thread runtime across real processes, on SQLite, Redis and PostgreSQL.

Each test starts worker processes (``_worker.py``) that share one backend and
reports what they did as JSON lines stamped with ``time.monotonic()`` (one
timeline for every process of the host). Processes are killed (SIGKILL) and
paused (SIGSTOP/SIGCONT) for real. The backends run with their default
settings: a takeover starts with a dead owner's unfinished signals because the
new owner reclaims them, not because a redelivery timeout was shortened.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import signal as signals
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import tenure
from tenure.testing import eventually
from tests.conftest import REDIS_URL, isolated_url
from tests.support.servers import drop_postgres_schema

WORKER = Path(__file__).with_name("_worker.py")
TTL_MS = 2000
RENEW_MS = TTL_MS // 3
Doc = dict[str, Any]


class Worker:
    """One runtime process and everything it has printed so far."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.proc = proc
        self.lines: list[Doc] = []
        self.changed = asyncio.Event()
        self._ids = 0
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.lines.append(json.loads(line))
            self.changed.set()
        self.changed.set()

    def of(self, op: str, **match: Any) -> list[Doc]:
        return [
            d for d in self.lines if d["op"] == op and all(d.get(k) == v for k, v in match.items())
        ]

    async def wait(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    self.changed.clear()
                    if self.proc.returncode is not None and self._reader.done():
                        raise AssertionError(f"{self.name} exited: {self.lines[-5:]}")
                    await self.changed.wait()
        except TimeoutError:
            # What the process did, so a failure on a loaded machine can be read.
            told = "\n".join(json.dumps(d) for d in self.lines[-40:])
            raise AssertionError(
                f"{self.name}: not so after {timeout} s; last lines:\n{told}"
            ) from None

    async def send(
        self, thread: str, payload: Any, signal_id: str | None = None, policy: str | None = None
    ) -> Doc:
        self._ids += 1
        n = self._ids
        assert self.proc.stdin is not None
        cmd = {"op": "send", "id": n, "thread": thread, "payload": payload, "signal_id": signal_id}
        cmd["policy"] = policy
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()
        await self.wait(lambda: bool(self.of("sent", id=n)))
        return self.of("sent", id=n)[0]

    def kill(self) -> None:
        self.proc.send_signal(signals.SIGKILL)

    def pause(self) -> None:
        self.proc.send_signal(signals.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signals.SIGCONT)

    async def quit(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(ConnectionError):
                self.proc.stdin.write(b'{"op": "quit"}\n')
                await self.proc.stdin.drain()
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.kill()
        await self.proc.wait()
        await self._reader


class Spawner:
    def __init__(self, url: str) -> None:
        self.url = url
        self.workers: list[Worker] = []

    async def __call__(self, name: str, *options: str) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            self.url,
            name,
            "--ttl-ms",
            str(TTL_MS),
            *options,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = Worker(name, proc)
        self.workers.append(worker)
        await worker.wait(lambda: bool(worker.of("ready")))
        return worker

    async def cleanup(self) -> None:
        for worker in self.workers:
            if worker.proc.returncode is None:
                worker.resume()
        await asyncio.gather(*(w.quit() for w in self.workers))


def _drop_redis_prefix(prefix: str) -> None:
    # Imported by name: benchmarks/redis.py shadows the package for mypy.
    redis: Any = importlib.import_module("redis")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    kind: str = request.param
    yield isolated_url(kind, unique=unique, tmp_path=tmp_path)
    if kind == "redis":
        _drop_redis_prefix(f"tenure-test-{unique}:")
    elif kind == "postgres":
        drop_postgres_schema(f"tenure_test_{unique}")


@pytest_asyncio.fixture
async def spawn(url: str) -> AsyncIterator[Spawner]:
    spawner = Spawner(url)
    try:
        yield spawner
    finally:
        await spawner.cleanup()


def run_intervals(workers: list[Worker], thread: str) -> list[tuple[float, float, str]]:
    """Every run of ``thread``, as (start, end, process), sorted by start."""
    out: list[tuple[float, float, str]] = []
    for w in workers:
        starts = {d["run"]: d["t"] for d in w.of("run_start", thread=thread)}
        out.extend((starts[e["run"]], e["t"], w.name) for e in w.of("run_end", thread=thread))
    return sorted(out)


def assert_never_two_runs(workers: list[Worker], thread: str) -> None:
    runs = run_intervals(workers, thread)
    for (_, end, who), (start, _, nxt) in itertools.pairwise(runs):
        assert start >= end, f"runs of {thread!r} overlap: {who} until {end}, {nxt} from {start}"


@pytest.mark.asyncio
async def test_concurrent_senders_route_to_one_run_in_order_and_lose_nothing(
    spawn: Spawner,
) -> None:
    workers = [await spawn(f"p{i}", "--work-ms", "2", "--idle", "0.2") for i in range(3)]
    threads = ["alpha", "beta\0gamma"]
    count = 15

    async def sender(w: Worker) -> list[Doc]:
        results = []
        for i in range(count):
            results.extend([await w.send(t, [w.name, i]) for t in threads])
            if i % 4 == 3:
                await asyncio.sleep(0.25)  # let some threads go idle and be woken again
        return results

    sent = [r for rs in await asyncio.gather(*(sender(w) for w in workers)) for r in rs]
    total = len(workers) * count * len(threads)
    assert len(sent) == total

    def done_ids() -> list[str]:
        return [d["sid"] for w in workers for d in w.of("done")]

    await eventually(lambda: len(set(done_ids())) >= total, timeout=60, interval=0.05)
    await asyncio.sleep(0.5)  # anything handled twice would show up now
    assert sorted(done_ids()) == sorted(r["signal_id"] for r in sent)  # each exactly once
    outcomes = {r["outcome"] for r in sent}
    assert outcomes == {"wake", "deliver"}
    for t in threads:
        assert_never_two_runs(workers, t)
        takes = sorted((d["t"], d["payload"]) for w in workers for d in w.of("take", thread=t))
        for w in workers:
            mine = [i for _, (who, i) in takes if who == w.name]
            assert mine == list(range(count)), (t, w.name, mine)
    for w in workers:
        for d in w.of("sent"):
            if d["outcome"] == "deliver":
                assert d["run_id"] is not None


@pytest.mark.asyncio
async def test_waiting_signals_pass_the_lease_to_the_next_run_without_a_gap(
    spawn: Spawner, url: str
) -> None:
    owner = await spawn("owner", "--one-per-run", "--work-ms", "300", "--idle", "0.3")
    other = await spawn("other", "--idle", "0.3")
    async with tenure.from_url(url) as observer:
        key = "tenure.thread:chat"
        samples: list[tuple[float, str | None]] = []
        stop = asyncio.Event()

        async def poll() -> None:
            while not stop.is_set():
                lease = await observer.get_lease(key)
                samples.append((time.monotonic(), None if lease is None else lease.owner))
                await asyncio.sleep(0.002)

        poller = asyncio.ensure_future(poll())
        first = await owner.send("chat", 0)
        assert first["outcome"] == "wake"
        for i in range(1, 6):
            routed = await other.send("chat", i)
            assert routed["outcome"] == "deliver"
        await owner.wait(lambda: len(owner.of("done", thread="chat")) == 6)
        stop.set()
        await poller
    took = owner.of("take", thread="chat")
    assert [d["payload"] for d in took] == list(range(6))
    runs = [d["run"] for d in took]
    assert len(set(runs)) == 6  # one run per signal
    handovers = owner.of("event", kind="handover")
    assert [d["run"] for d in handovers] == runs[1:]
    tokens = [d["token"] for d in owner.of("run_start", thread="chat")]
    assert tokens == sorted(set(tokens)), tokens
    # From the first run until the last one took its signal the key was never free.
    during = [o for t, o in samples if took[0]["t"] <= t <= took[-1]["t"]]
    assert len(during) > 20, len(during)
    assert None not in during
    assert {o.rpartition("/")[2] for o in during if o} <= set(runs)
    releases = owner.of("event", kind="release")
    assert all(r["t"] > took[-1]["t"] for r in releases)


@pytest.mark.asyncio
async def test_a_killed_owner_is_replaced_within_ttl_and_its_unfinished_signals_redelivered(
    spawn: Spawner,
) -> None:
    a = await spawn("a", "--idle", "0.5")
    b = await spawn("b", "--idle", "0.5")
    stuck = await a.send("thread", {"block": True})
    assert stuck["outcome"] == "wake"
    await a.wait(lambda: bool(a.of("take", sid=stuck["signal_id"])))
    later = await b.send("thread", "after")
    assert later["outcome"] == "deliver"
    a.kill()
    killed_at = time.monotonic()
    await b.wait(lambda: len(b.of("take", thread="thread")) >= 2, timeout=30)
    takes = b.of("take", thread="thread")
    assert [d["sid"] for d in takes[:2]] == [stuck["signal_id"], later["signal_id"]]
    assert takes[0]["attempt"] >= 2
    assert b.of("event", kind="takeover")
    started = b.of("run_start", thread="thread")[0]["t"]
    # Liveness bound from the spec, with room for a loaded machine.
    assert started - killed_at <= (TTL_MS + RENEW_MS) / 1000 + 3.0, started - killed_at


@pytest.mark.asyncio
async def test_a_paused_owner_is_told_it_lost_the_thread_and_stops(spawn: Spawner) -> None:
    a = await spawn("a", "--idle", "0.5")
    b = await spawn("b", "--idle", "0.5")
    stuck = await a.send("thread", {"block": True})
    await a.wait(lambda: bool(a.of("take", sid=stuck["signal_id"])))
    a.pause()
    later = await b.send("thread", "after")
    assert later["outcome"] == "deliver"
    await b.wait(lambda: len(b.of("done", thread="thread")) >= 1, timeout=30)
    await b.wait(lambda: bool(b.of("take", sid=stuck["signal_id"])), timeout=30)
    a.resume()
    await a.wait(lambda: bool(a.of("event", kind="lost")), timeout=30)
    await a.wait(lambda: bool(a.of("run_end", detail="cancelled")), timeout=30)
    lost = a.of("event", kind="lost")[0]
    # Told on resuming: the deadline had passed (or, had a renewal gone out, it was refused).
    assert "renew deadline" in lost["detail"] or "refused" in lost["detail"]
    # While paused a did nothing; after resuming it took no signal of b's era.
    assert not a.of("take", sid=later["signal_id"])
    b_started = b.of("run_start", thread="thread")[0]["t"]
    assert all(d["t"] < b_started for d in a.of("take"))


@pytest.mark.asyncio
async def test_a_signal_routed_to_an_owner_that_is_releasing_still_gets_a_run(
    spawn: Spawner,
) -> None:
    # The owner pauses inside release_lease: its subscription is gone but its
    # lease still stands, so the sender's acquire loses. The signal must still
    # run, once: whichever process's sweep finds it first starts the run.
    a = await spawn("a", "--idle", "0.2", "--slow-release-ms", "2000")
    b = await spawn("b", "--idle", "0.2")
    first = await a.send("thread", "first")
    assert first["outcome"] == "wake"
    await a.wait(lambda: bool(a.of("releasing")))
    late = await b.send("thread", "late")
    assert late["outcome"] == "deliver"
    assert late["run_id"] == first["run_id"]

    def done() -> list[Doc]:
        return [d for w in (a, b) for d in w.of("done", sid=late["signal_id"])]

    await eventually(lambda: bool(done()), timeout=30)
    await asyncio.sleep(0.5)
    assert len(done()) == 1
    # Not by the closing session that had already unsubscribed: by a new one.
    assert done()[0]["run"] != first["run_id"]
    assert any(w.of("event", kind="takeover") for w in (a, b))


# -- the reproductions of issue 11, with default settings ---------------------------

BOUND = (TTL_MS + RENEW_MS) / 1000  # TTL + renew interval (the sweep runs at least as often)
SLACK = 3.0  # a loaded 2-core machine


@pytest.mark.asyncio
async def test_a_killed_owners_signal_runs_when_nobody_sends_again(spawn: Spawner) -> None:
    a = await spawn("a", "--idle", "0.5")
    b = await spawn("b", "--idle", "0.5")  # idle: it never hears of the thread
    stuck = await a.send("thread", {"block": True})
    await a.wait(lambda: bool(a.of("take", sid=stuck["signal_id"])))
    a.kill()
    killed_at = time.monotonic()
    await b.wait(lambda: bool(b.of("done", sid=stuck["signal_id"])), timeout=30)
    started = b.of("run_start", thread="thread")[0]["t"]
    assert started - killed_at <= BOUND + SLACK, started - killed_at
    assert b.of("take", sid=stuck["signal_id"])[0]["attempt"] >= 2
    # b's sweeps were refused the lease by a's run until it expired: b names it.
    [takeover] = b.of("event", kind="takeover")
    assert takeover["detail"] == a.of("run_start", thread="thread")[0]["run"]


@pytest.mark.asyncio
async def test_a_signal_whose_sender_dies_right_after_sending_runs(spawn: Spawner) -> None:
    owner = await spawn("owner", "--idle", "0.5")
    sender = await spawn("sender", "--idle", "0.5")
    idle = await spawn("idle", "--idle", "0.5")
    busy = await owner.send("thread", {"block": True})
    await owner.wait(lambda: bool(owner.of("take", sid=busy["signal_id"])))
    routed = await sender.send("thread", "from a sender about to die")
    assert routed["outcome"] == "deliver"
    sender.kill()
    owner.kill()
    killed_at = time.monotonic()
    await idle.wait(lambda: bool(idle.of("done", sid=routed["signal_id"])), timeout=30)
    takes = [d["sid"] for d in idle.of("take", thread="thread")]
    assert takes[:2] == [busy["signal_id"], routed["signal_id"]]  # order kept
    assert idle.of("run_start")[0]["t"] - killed_at <= BOUND + SLACK


@pytest.mark.asyncio
async def test_a_woken_sender_killed_before_its_run_reads_the_signal(spawn: Spawner) -> None:
    sender = await spawn("sender", "--idle", "0.5", "--work-ms", "100000")
    idle = await spawn("idle", "--idle", "0.5")
    first = await sender.send("thread", "held by the sender's own run")
    assert first["outcome"] == "wake"
    second = await sender.send("thread", "behind it")
    sender.kill()
    await idle.wait(lambda: bool(idle.of("done", sid=second["signal_id"])), timeout=30)
    takes = [d["sid"] for d in idle.of("take", thread="thread")]
    assert takes[:2] == [first["signal_id"], second["signal_id"]]


@pytest.mark.asyncio
async def test_colliding_namespaces_stay_apart_across_processes(spawn: Spawner) -> None:
    app = await spawn("app", "--idle", "0.3", "--namespace", "app")
    v2 = await spawn("v2", "--idle", "0.3", "--namespace", "app:v2")
    to_app = await v2.send("v2:42", "for app")  # v2's runtime sends in its own namespace
    to_v2 = await app.send("42", "for app:v2")
    await v2.wait(lambda: bool(v2.of("done", sid=to_app["signal_id"])))
    await app.wait(lambda: bool(app.of("done", sid=to_v2["signal_id"])))
    await asyncio.sleep(0.5)
    assert [d["thread"] for d in app.of("take")] == ["42"]
    assert [d["thread"] for d in v2.of("take")] == ["v2:42"]


@pytest.mark.asyncio
async def test_a_retried_send_with_one_id_runs_once_across_processes(spawn: Spawner) -> None:
    a = await spawn("a", "--idle", "0.3")
    b = await spawn("b", "--idle", "0.3")
    first = await a.send("thread", "hello", signal_id="message-1")
    again = await b.send("thread", "hello", signal_id="message-1")  # a retry from elsewhere
    assert first["signal_id"] == again["signal_id"] == "message-1"
    after = await b.send("thread", "next")
    await eventually(
        lambda: any(d["sid"] == after["signal_id"] for w in (a, b) for d in w.of("done")),
        timeout=30,
    )
    await asyncio.sleep(0.5)
    done = [d["sid"] for w in (a, b) for d in w.of("done")]
    assert sorted(done) == sorted(["message-1", after["signal_id"]])


@pytest.mark.asyncio
async def test_reject_across_processes(spawn: Spawner) -> None:
    a = await spawn("a", "--idle", "0.3", "--policy", "reject")
    b = await spawn("b", "--idle", "0.3", "--policy", "reject")
    busy = await a.send("thread", {"block": True})
    assert busy["outcome"] == "wake"
    await a.wait(lambda: bool(a.of("take", sid=busy["signal_id"])))
    refused = await b.send("thread", "while busy")
    assert refused["outcome"] == "rejected"
    await asyncio.sleep(0.5)
    assert not [d for w in (a, b) for d in w.of("take") if d["sid"] == refused["signal_id"]]


@pytest.mark.asyncio
async def test_interrupt_across_processes(spawn: Spawner) -> None:
    a = await spawn("a", "--idle", "0.3", "--policy", "interrupt")
    b = await spawn("b", "--idle", "0.3", "--policy", "interrupt")
    busy = await a.send("thread", {"block": True})
    await a.wait(lambda: bool(a.of("take", sid=busy["signal_id"])))
    new = await b.send("thread", "stop that, do this")
    assert new["outcome"] == "deliver"
    await a.wait(lambda: bool(a.of("done", sid=new["signal_id"])), timeout=30)
    ends = a.of("run_end", thread="thread")
    assert ends[0]["detail"] == "interrupted"
    assert a.of("event", kind="interrupted")
    # The blocked signal was interrupted, not run again.
    assert len(a.of("take", sid=busy["signal_id"])) == 1
