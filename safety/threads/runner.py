"""Run the thread workload with faults against one backend, heal, and check the evidence.

A run: start the backend (a SQLite file; or a private ``redis-server`` with
``appendonly yes`` and ``appendfsync always``, or a private PostgreSQL, each
reached by each worker slot through its own fault proxy), start the workers, let them send until the
deadline while faults are injected, then heal: every fault is undone, senders
stop, the surviving and fresh workers idle, sweeping, for at least TTL + sweep
interval and until every stored signal was written (or ``heal_s`` passed). Then
the workers exit and :func:`safety.threads.checker.check` judges the evidence.

Faults (seeded; one kind per step, a step every ``fault_gap_s``):

- ``owner-kill``: SIGKILL a worker that wrote to the sink in the last 500 ms
  (it is running a thread); a fresh worker takes its slot.
- ``owner-pause``: SIGSTOP such a worker for 1.5-3 TTLs, then SIGCONT (at most
  a third of the workers at once).
- ``sender-kill``: the worker SIGKILLs itself right after its next
  ``send_signal`` returned and was recorded (``SIGUSR1`` arms it).
- ``proxy-blackhole`` (Redis, PostgreSQL): one worker's connections to the
  server swallow every byte for 1-3 TTLs, so its renewals hang; then its
  connections are reset.
- ``backend-restart`` (Redis, PostgreSQL): SIGKILL the server and start it
  again on its data (every committed write survives the crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import worker_env
from ..proxy import Proxy
from .checker import ThreadReport, check, percentile, settlements
from .evidence import (
    Fault,
    OutputSeen,
    Sink,
    load_checkpoints,
    load_faults,
    load_handed,
    load_outputs,
    load_settled,
    load_states,
    load_stored,
    load_writes,
)
from .worker import WorkerConfig, config_json

__all__ = [
    "BACKENDS",
    "KINDS",
    "WORKLOADS",
    "ThreadRunConfig",
    "ThreadRunResult",
    "check_dir",
    "control_config",
    "run_threads",
    "spread",
]

ROOT = Path(__file__).resolve().parent.parent.parent
WORKER_FAILED = 70  # a worker's exit status when its main task raised (worker.py)
BACKENDS = ("sqlite", "redis", "postgres")
# "runtime": handlers write each signal to the recording sink. "langgraph": each
# thread runs a graph through graph_handler on a fenced saver (a SQLite file, or
# the private PostgreSQL on the postgres backend), then writes the sink; the
# checkpoint histories and final states are read back and judged too. "policies":
# as "runtime", each signal sent under a policy drawn from the worker's MIX; the
# runtime's settlement events are recorded and judged (checker.settlements).
WORKLOADS = ("runtime", "langgraph", "policies")
KINDS: dict[str, list[str]] = {
    "sqlite": ["owner-kill", "owner-kill", "owner-pause", "owner-pause", "sender-kill"],
    "redis": [
        "owner-kill",
        "owner-kill",
        "owner-pause",
        "owner-pause",
        "sender-kill",
        "proxy-blackhole",
        "proxy-blackhole",
        "backend-restart",
    ],
    "postgres": [
        "owner-kill",
        "owner-kill",
        "owner-pause",
        "owner-pause",
        "sender-kill",
        "proxy-blackhole",
        "proxy-blackhole",
        "backend-restart",
    ],
}
# The two namespaces whose names collided before names were injective.
COLLIDING = [["app", "v2:42"], ["app:v2", "42"]]


@dataclass
class ThreadRunConfig:
    backend: str  # sqlite | redis | postgres
    duration_s: float = 20.0
    seed: int = 1
    workers: int = 4
    threads: int = 4  # plus the two colliding ones
    ttl_ms: int = 1000
    control: str | None = None
    workdir: str | None = None
    faults: bool = True
    fault_kinds: list[str] | None = None  # None: every kind of the backend
    fault_gap_s: tuple[float, float] = (0.5, 1.5)
    heal_s: float | None = None  # None: 5 s + 3 TTLs (20 s + 3 TTLs for langgraph)
    # None: 5-40 ms; 100-400 ms for the langgraph workload, whose signals cost
    # three checkpoints and a graph each: sent faster than the loaded machine runs
    # them (40-160 ms was), a thread's backlog grows, and each owner lost spends a
    # delivery of every signal it had taken, so five losses drop them (SAFETY.md).
    send_gap_ms: tuple[float, float] | None = None
    # Every n-th signal of a worker is poison (0: none): its handler lets out a
    # CancelledError tenure did not cause, every time (see checker.looped).
    poison_every: int = 40
    # Redis: start the workers while the fresh server still refuses grants (its
    # quarantine after a start), so the first signals of every thread meet it. The
    # runtime used to lose them (found by this harness; fixed in 3c669f0). False:
    # wait until the server grants leases before starting the workers.
    cold_start: bool = True
    # The runtimes keep output (replies): each handled signal appends an item, and
    # after the run every thread's output is read and checked (checker.stale_outputs).
    output: bool = False
    workload: str = "runtime"

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}, got {self.workload!r}")
        if self.workload != "runtime":
            # The graph has no poison path; a policy may settle a poison signal
            # unrun, and the loop bound counts deliveries of every one.
            self.poison_every = 0

    def send_gap(self) -> tuple[float, float]:
        if self.send_gap_ms is not None:
            return self.send_gap_ms
        return (100.0, 400.0) if self.workload == "langgraph" else (5.0, 40.0)

    def heal_limit(self) -> float:
        if self.heal_s is not None:
            return self.heal_s
        return (20 if self.workload == "langgraph" else 5) + 3 * self.ttl_ms / 1000

    def thread_list(self) -> list[list[str]]:
        if self.control == "collide":
            return [list(t) for t in COLLIDING]
        return [["app", f"t{i}"] for i in range(self.threads)] + [list(t) for t in COLLIDING]

    @property
    def sweep_s(self) -> float:
        return min(self.ttl_ms / 3000, 1.0)  # the runtime's default


@dataclass
class ThreadRunResult:
    config: ThreadRunConfig
    report: ThreadReport
    faults: dict[str, int]
    workers_started: int
    drained_s: float | None  # seconds after healing until every stored signal was written
    workdir: str
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    # Workers whose main task died of an exception (exit status 70, traceback
    # in their .stderr): a failure of the run whatever the checkers say.
    failed_workers: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return self.report.violations + len(self.failed_workers)

    def figure_line(self) -> str:
        r, c = self.report, self.config
        n_faults = sum(v for k, v in self.faults.items() if "not injected" not in k)
        kinds = ", ".join(f"{k} {v}" for k, v in self.faults.items()) or "none"
        dup_signals = len(r.duplicates)
        dup_extra = sum(n - 1 for n in r.duplicates.values())
        bound = c.ttl_ms + c.sweep_s * 1000
        t = r.takeover_ms
        takeover = (
            f"takeover after owner kill p50/p99/max = {spread(t)} ms over {len(t)} stranded "
            f"threads; with no other fault during the takeover {spread(r.takeover_isolated_ms)} ms "
            f"over {len(r.takeover_isolated_ms)} (TTL + sweep = {bound:.0f} ms)"
            if t
            else "takeover: no kill left a waiting signal"
        )
        counts = r.counts()
        verdict = ", ".join(f"{v} {k}" for k, v in counts.items())
        graph = (
            f"{r.checkpoints} checkpoints read back ({r.forks} forks); "
            if c.workload == "langgraph"
            else ""
        )
        graph += r.settled_line()
        return (
            f"{c.backend}{f' [{c.workload}]' if c.workload != 'runtime' else ''}"
            f"{f' [control {c.control}]' if c.control else ''}: {r.signals} signals, "
            f"{r.writes} writes, {self.workers_started} worker processes, "
            f"{len(c.thread_list())} threads, TTL {c.ttl_ms} ms; {n_faults} faults ({kinds}); "
            f"{verdict}; {graph}{f'{r.outputs} output items read; ' if r.outputs else ''}duplicates: {dup_signals} signals written twice or more "
            f"(+{dup_extra} writes); {r.untokened} writes without a token; {takeover}; "
            + (
                f"drained {self.drained_s:.1f} s after healing"
                if self.drained_s is not None
                else "NOT drained after healing"
            )
            + (f"; WORKERS FAILED: {', '.join(self.failed_workers)}" if self.failed_workers else "")
        )


def spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{percentile(xs, 50):.0f}/{percentile(xs, 99):.0f}/{max(xs):.0f}"


class Pool:
    """Worker processes by slot; a killed worker's slot gets a fresh one."""

    def __init__(
        self, rc: ThreadRunConfig, workdir: Path, urls: list[str], checkpoints: list[str]
    ) -> None:
        self.rc = rc
        self.workdir = workdir
        self.urls = urls
        self.checkpoints = checkpoints
        self.rnd = random.Random(rc.seed * 7919)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.slot_of: dict[str, int] = {}
        self.paused: set[str] = set()
        self.started = 0

    def spawn(self, slot: int) -> str:
        self.started += 1
        name = f"w{slot}-{self.started}"
        cfg = WorkerConfig(
            name=name,
            url=self.urls[slot],
            workdir=str(self.workdir),
            seed=self.rnd.randrange(2**32),
            ttl_ms=self.rc.ttl_ms,
            threads=self.rc.thread_list(),
            send_gap_ms=list(self.rc.send_gap()),
            control=self.rc.control,
            poison_every=self.rc.poison_every,
            output=self.rc.output,
            workload=self.rc.workload,
            checkpoints=self.checkpoints[slot] if self.checkpoints else None,
        )
        env = worker_env()
        with (self.workdir / f"{name}.stderr").open("wb") as err:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "safety.threads.worker", "--config", config_json(cfg)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        self.slot_of[name] = slot
        return name

    def running(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def active(self) -> list[str]:
        return [n for n in self.running() if n not in self.paused]

    def signal(self, name: str, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.procs[name].send_signal(sig)

    async def kill(self, name: str) -> None:
        proc = self.procs[name]
        self.signal(name, signal.SIGKILL)
        await asyncio.to_thread(proc.wait)

    async def wait_ready(self, names: list[str], timeout: float) -> None:
        until = time.monotonic() + timeout
        while not all((self.workdir / f"ready-{n}").exists() for n in names):
            dead = [n for n in names if self.procs[n].poll() is not None]
            if dead:
                err = (self.workdir / f"{dead[0]}.stderr").read_text()[-2000:]
                raise RuntimeError(f"worker {dead[0]} died while starting: {err}")
            if time.monotonic() > until:
                raise RuntimeError(f"workers did not start within {timeout:.0f} s")
            await asyncio.sleep(0.05)

    async def stop_all(self, timeout: float) -> None:
        for name in list(self.paused):
            self.signal(name, signal.SIGCONT)
        self.paused.clear()
        (self.workdir / "exit").touch()
        until = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                await asyncio.to_thread(proc.wait, max(0.1, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)


class Env:
    """The backend: one URL per worker slot, and its server faults."""

    async def start(self, workdir: Path, rc: ThreadRunConfig) -> list[str]:
        raise NotImplementedError

    def proxy(self, slot: int) -> Proxy | None:
        return None

    async def checkpoints(self, workdir: Path, rc: ThreadRunConfig) -> list[str]:
        """Where each worker slot's LangGraph saver writes: a SQLite file next to the evidence."""
        return [str(workdir / "checkpoints.db")] * rc.workers

    async def restart(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        return None


class SqliteEnv(Env):
    async def start(self, workdir: Path, rc: ThreadRunConfig) -> list[str]:
        return [f"sqlite:///{workdir / 'backend.db'}"] * rc.workers


class ServerEnv(Env):
    """A private server the env starts, reached by each worker slot through a
    proxy of its own (for black holes), and crashed for a restart."""

    server: Any
    proxies: list[Proxy]

    async def _serve(self, server: Any, workers: int) -> None:
        self.server = server
        await asyncio.to_thread(server.start)
        self.proxies = [await Proxy("127.0.0.1", server.port).start() for _ in range(workers)]

    def proxy(self, slot: int) -> Proxy | None:
        return self.proxies[slot]

    async def restart(self) -> None:
        # A crash, not a shutdown: every write that was acknowledged survives it
        # (Redis with appendfsync always, PostgreSQL's committed transactions).
        await asyncio.to_thread(self.server.kill)
        await asyncio.to_thread(self.server.start)

    async def close(self) -> None:
        for p in self.proxies:
            await p.aclose()
        await asyncio.to_thread(self.server.close)


class RedisEnv(ServerEnv):
    async def start(self, workdir: Path, rc: ThreadRunConfig) -> list[str]:
        from tests.support.redis_server import RedisServer

        await self._serve(RedisServer(persistence=True), rc.workers)
        prefix = f"thr{rc.seed}x{os.getpid()}:"
        # A fresh server refuses grants for max_ttl_ms (it may have lost leases):
        # keep that quarantine short, as the TTLs here are.
        opts = f"prefix={prefix}&max_ttl_ms={2 * rc.ttl_ms}"
        if not rc.cold_start:
            await _past_quarantine(f"{self.server.url}?{opts}")
        return [f"redis://127.0.0.1:{p.port}/0?{opts}" for p in self.proxies]


class PostgresEnv(ServerEnv):
    async def start(self, workdir: Path, rc: ThreadRunConfig) -> list[str]:
        from tests.support.pg_server import PgServer

        await self._serve(PgServer(), rc.workers)
        # A call that hangs (a black-holed connection) gives up well within the
        # renew interval, as the runtime's renewer expects of a short TTL.
        opts = f"schema=thr{rc.seed}x{os.getpid()}&call_timeout={max(0.2, rc.ttl_ms / 4000)}"
        return [f"postgresql://postgres@127.0.0.1:{p.port}/postgres?{opts}" for p in self.proxies]

    async def checkpoints(self, workdir: Path, rc: ThreadRunConfig) -> list[str]:
        """The private server, through each slot's proxy (its faults hit the saver too)."""
        import psycopg

        from .graph import postgres_url

        schema = f"lg{rc.seed}x{os.getpid()}"
        async with await psycopg.AsyncConnection.connect(self.server.url, autocommit=True) as conn:
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        return [
            postgres_url(f"postgresql://postgres@127.0.0.1:{p.port}/postgres", schema)
            for p in self.proxies
        ]


async def _past_quarantine(url: str) -> None:
    """Wait until the fresh server grants leases (it refuses them for ``max_ttl_ms``)."""
    import tenure

    backend = tenure.from_url(url)
    try:
        async with asyncio.timeout(60):
            while True:
                granted = await backend.acquire_lease("harness.warm-up", "harness", 100)
                if granted.acquired:
                    break
                await asyncio.sleep(0.1)
    finally:
        await backend.aclose()


class Injector:
    def __init__(
        self, rc: ThreadRunConfig, rnd: random.Random, pool: Pool, env: Env, workdir: Path
    ) -> None:
        self.rc = rc
        self.rnd = rnd
        self.pool = pool
        self.env = env
        self.ttl = rc.ttl_ms / 1000
        self.kinds = rc.fault_kinds or KINDS[rc.backend]
        self.counts: Counter[str] = Counter()
        self.sink = sqlite3.connect(workdir / "sink.db", timeout=30)
        self._log = (workdir / "faults.jsonl").open("a")
        self._tasks: set[asyncio.Task[None]] = set()
        self._senders: set[asyncio.Task[None]] = set()  # not cancelled: they respawn a slot
        self._blackholed: set[int] = set()
        self._restarting = False
        self.deadline_ns = 0

    def _record(self, kind: str, target: str, start: int, end: int | None = None) -> None:
        self.counts[kind] += 1
        fault = Fault(kind, target, start, start if end is None else end)
        self._log.write(json.dumps(asdict(fault)) + "\n")
        self._log.flush()

    def _spawn(self, coro: Any, tasks: set[asyncio.Task[None]] | None = None) -> None:
        into = self._tasks if tasks is None else tasks
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        into.add(task)
        task.add_done_callback(into.discard)

    def _owners(self) -> list[str]:
        """Active workers that wrote to the sink in the last 500 ms (they run a thread)."""
        since = time.monotonic_ns() - 500_000_000
        try:
            rows = self.sink.execute(
                "SELECT worker, t_ns FROM writes ORDER BY id DESC LIMIT 200"
            ).fetchall()
        except sqlite3.Error:
            rows = []
        recent = {w for w, t in rows if t > since}
        return sorted(recent & set(self.pool.active()))

    async def run(self, until_ns: int) -> None:
        self.deadline_ns = until_ns
        while time.monotonic_ns() < until_ns:
            await asyncio.sleep(self.rnd.uniform(*self.rc.fault_gap_s))
            if time.monotonic_ns() >= until_ns:
                break
            await self.inject(self.rnd.choice(self.kinds))

    async def inject(self, kind: str) -> None:
        rnd, pool = self.rnd, self.pool
        if kind in ("owner-kill", "owner-pause"):
            victims = self._owners()
            if not victims:
                self.counts[f"{kind} (not injected: no owner)"] += 1
                return
            victim = rnd.choice(victims)
            if kind == "owner-kill":
                t = time.monotonic_ns()
                await pool.kill(victim)
                self._record(kind, victim, t)
                pool.spawn(pool.slot_of[victim])
            else:
                if len(pool.paused) >= max(1, self.rc.workers // 3):
                    self.counts[f"{kind} (not injected: enough paused)"] += 1
                    return
                pool.paused.add(victim)
                t = time.monotonic_ns()
                pool.signal(victim, signal.SIGSTOP)
                self._spawn(self._resume(victim, t, rnd.uniform(1.5, 3.0) * self.ttl))
        elif kind == "sender-kill":
            victims = pool.active()
            if not victims or time.monotonic_ns() > self.deadline_ns - 2_000_000_000:
                self.counts[f"{kind} (not injected: no sender)"] += 1
                return
            victim = rnd.choice(victims)
            pool.signal(victim, signal.SIGUSR1)
            self._spawn(self._after_sender_kill(victim, time.monotonic_ns()), self._senders)
        elif kind == "proxy-blackhole":
            slots = [s for s in range(self.rc.workers) if s not in self._blackholed]
            if not slots:
                return
            slot = rnd.choice(slots)
            proxy = self.env.proxy(slot)
            if proxy is None:
                return
            self._blackholed.add(slot)
            proxy.set_mode("blackhole")
            self._spawn(
                self._open_proxy(slot, time.monotonic_ns(), rnd.uniform(1.0, 3.0) * self.ttl)
            )
        elif kind == "backend-restart":
            if self._restarting:
                return
            self._restarting = True
            t = time.monotonic_ns()
            try:
                await self.env.restart()
            finally:
                self._restarting = False
            self._record(kind, "server", t, time.monotonic_ns())
        else:
            raise ValueError(f"unknown fault kind {kind!r}")

    async def _resume(self, victim: str, start: int, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
        finally:
            self.pool.signal(victim, signal.SIGCONT)
            self.pool.paused.discard(victim)
            self._record("owner-pause", victim, start, time.monotonic_ns())

    async def _after_sender_kill(self, victim: str, armed: int) -> None:
        proc = self.pool.procs[victim]
        try:
            # proc.wait's own timeout: a thread stuck in an endless wait would
            # be lost to the executor each time (six such and every later
            # to_thread call, faults included, waits forever).
            await asyncio.to_thread(proc.wait, 5)
        except subprocess.TimeoutExpired:
            # It sent nothing more (its sending ended): not the fault we wanted.
            self.counts["sender-kill (not injected: no send)"] += 1
            return
        self._record("sender-kill", victim, armed, time.monotonic_ns())
        self.pool.spawn(self.pool.slot_of[victim])

    async def _open_proxy(self, slot: int, start: int, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
        finally:
            proxy = self.env.proxy(slot)
            if proxy is not None:
                proxy.set_mode("pass")
            self._blackholed.discard(slot)
            self._record("proxy-blackhole", f"slot{slot}", start, time.monotonic_ns())

    async def heal(self) -> None:
        """Undo every active fault (resume, open the network); respawn a sender that died."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._senders, return_exceptions=True)

    def close(self) -> None:
        self.sink.close()
        self._log.close()


def _all_written(workdir: Path, running: list[str], rc: ThreadRunConfig) -> bool:
    """Every running worker has finished sending, and every stored signal was written
    (the policies workload: or settled by a rule, see checker.settlements)."""
    if not all((workdir / f"sent-{n}").exists() for n in running):
        return False
    if rc.workload == "policies":
        writes = load_writes(workdir / "sink.db")
        faults = load_faults(workdir / "faults.jsonl")
        found = settlements(load_stored(workdir), writes, load_settled(workdir), faults)
        return not found.lost
    stored = {s.signal_id for s in load_stored(workdir) if s.owed}
    db = sqlite3.connect(workdir / "sink.db", timeout=30)
    try:
        written = {r[0] for r in db.execute("SELECT DISTINCT signal_id FROM writes")}
    finally:
        db.close()
    return stored <= written


def check_dir(workdir: Path, rc: ThreadRunConfig) -> ThreadReport:
    """Judge the evidence a run left in ``workdir`` (also to re-check an old run)."""
    stored = load_stored(workdir)
    writes = load_writes(workdir / "sink.db")
    faults = load_faults(workdir / "faults.jsonl")
    outputs = load_outputs(workdir / "outputs.jsonl")
    checkpoints = load_checkpoints(workdir / "checkpoints.jsonl")
    states = load_states(workdir / "states.jsonl")
    settled = load_settled(workdir) if rc.workload == "policies" else None
    return check(
        stored, writes, faults, load_handed(workdir), outputs, checkpoints, states, settled
    )


async def read_outputs(url: str, rc: ThreadRunConfig, path: Path) -> None:
    """Every thread's whole output, as a reader sees it, one JSON line per item."""
    import tenure

    async def nothing(run: tenure.ThreadRun) -> None:
        pass

    lines: list[str] = []
    async with tenure.from_url(url) as backend:
        for namespace, thread in rc.thread_list():
            reader = tenure.ThreadRuntime(backend, nothing, namespace=namespace, output=True)
            try:
                last = await reader.last_position(thread)
                if last:
                    async for item in reader.follow(thread):
                        doc = OutputSeen(
                            namespace, thread, item.position, item.run_id, item.token, item.kind
                        )
                        lines.append(json.dumps(asdict(doc)))
                        if item.position >= last:
                            break
            finally:
                await reader.aclose()
    await asyncio.to_thread(path.write_text, "".join(line + "\n" for line in lines))


def _prepare(rc: ThreadRunConfig) -> Path:
    workdir = Path(rc.workdir or tempfile.mkdtemp(prefix=f"tenure-threads-{rc.backend}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in ("go", "exit", "faults.jsonl"):
        (workdir / stale).unlink(missing_ok=True)
    Sink.create(workdir / "sink.db")
    return workdir


async def run_threads(rc: ThreadRunConfig) -> ThreadRunResult:
    started = time.monotonic()
    if rc.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {rc.backend!r}")
    workdir = await asyncio.to_thread(_prepare, rc)
    rnd = random.Random(rc.seed)
    env: Env = {"sqlite": SqliteEnv, "redis": RedisEnv, "postgres": PostgresEnv}[rc.backend]()
    urls = await env.start(workdir, rc)
    checkpoints: list[str] = []
    if rc.workload == "langgraph":
        from .graph import setup

        checkpoints = await env.checkpoints(workdir, rc)
        await setup(checkpoints[0])
    pool = Pool(rc, workdir, urls, checkpoints)
    injector = Injector(rc, rnd, pool, env, workdir)
    drained: float | None = None
    try:
        names = [pool.spawn(slot) for slot in range(rc.workers)]
        await pool.wait_ready(names, 120)
        deadline = time.monotonic_ns() + int(rc.duration_s * 1e9)
        (workdir / "go").write_text(str(deadline))
        if rc.faults:
            await injector.run(deadline)
        else:
            await asyncio.sleep(rc.duration_s)
        await injector.heal()
        healed = time.monotonic()
        heal_s = rc.heal_limit()
        at_least = rc.ttl_ms / 1000 + rc.sweep_s + 1
        while True:
            now = time.monotonic()
            done = await asyncio.to_thread(_all_written, workdir, pool.running(), rc)
            if done and drained is None:
                drained = now - healed
            if (done and now - healed >= at_least) or now - healed > heal_s:
                break
            await asyncio.sleep(0.2)
        await pool.stop_all(30)
        if rc.output:
            await read_outputs(urls[0], rc, workdir / "outputs.jsonl")
        if checkpoints:
            from .graph import read_history

            await read_history(checkpoints[0], rc.thread_list(), workdir)
    finally:
        with contextlib.suppress(Exception):
            await injector.heal()
        for name in pool.running():
            pool.signal(name, signal.SIGCONT)
            pool.signal(name, signal.SIGKILL)
        injector.close()
        await env.close()
    report = await asyncio.to_thread(check_dir, workdir, rc)
    failed = sorted(n for n, p in pool.procs.items() if p.returncode == WORKER_FAILED)
    result = ThreadRunResult(
        failed_workers=failed,
        config=rc,
        report=report,
        faults=dict(sorted(injector.counts.items())),
        workers_started=pool.started,
        drained_s=drained,
        workdir=str(workdir),
        elapsed_s=time.monotonic() - started,
    )
    (workdir / "result.json").write_text(
        json.dumps(
            {
                "config": asdict(rc),
                "figure": result.figure_line(),
                "violations": report.describe(50),
                "failed_workers": result.failed_workers,
                "duplicates": len(report.duplicates),
            },
            indent=2,
        )
    )
    return result


def control_config(backend: str, control: str, **over: Any) -> ThreadRunConfig:
    """A short run of ``control`` with the faults that make its bug show."""
    kinds = {
        "never-lose": ["owner-pause"] + (["proxy-blackhole"] if backend != "sqlite" else []),
        "no-reclaim": ["owner-kill", "owner-kill", "sender-kill"],
        "collide": None,
    }[control]
    rc = ThreadRunConfig(
        backend=backend,
        duration_s=8.0,
        control=control,
        faults=kinds is not None,
        fault_kinds=kinds,
        fault_gap_s=(0.3, 0.8),
    )
    for k, v in over.items():
        setattr(rc, k, v)
    return rc
