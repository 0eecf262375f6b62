"""The coordinator of ``tenure demo``: worker processes, a kill, and a verdict.

It starts ``workers`` processes running :mod:`tenure.demo.worker` on one
backend URL (by default a fresh SQLite file in a temporary directory), lets
them send a seeded stream of signals to ``threads`` threads, SIGKILLs a worker
that owns a thread part-way, and shows from the workers' evidence files who
owns what. When every sent signal has been handled (or a deadline passes) it
stops the workers and judges the evidence with
:func:`tenure.demo._evidence.judge`. The exit status is 0 only when every
check passes.

It reaches the backend only through :func:`tenure.from_url` and the thread
runtime, as a user's program would.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, urlsplit

from rich.console import Console
from rich.live import Live

from .. import TenureError, from_url
from .._url_options import redact_url
from ..runtime import ThreadRun, ThreadRuntime
from ._evidence import (
    COORDINATOR,
    Check,
    Record,
    Verdict,
    judge,
    read_dir,
    read_new_lines,
    worker_name,
)
from ._view import DemoState, WorkerView, progress_line, render

__all__ = ["DemoSettings", "demo_url", "run_demo"]

_TICK = 0.1


@dataclass(frozen=True)
class DemoSettings:
    """What ``tenure demo``'s options choose (see ``tenure demo --help``)."""

    workers: int = 4
    threads: int = 5
    signals: int = 200
    seed: int | None = None
    url: str | None = None
    ttl_ms: int = 2000
    kill: bool = True
    send_seconds: float = 12.0
    keep: bool = False


# -- URL ------------------------------------------------------------------------


def _with_query(url: str, extra: dict[str, str]) -> str:
    # Appended as text: urlunsplit would turn "sqlite:////abs" into "sqlite://abs".
    present = {name for name, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True)}
    added = "&".join(f"{k}={v}" for k, v in extra.items() if k not in present)
    if not added:
        return url
    return f"{url}{'&' if '?' in url else '?'}{added}"


def demo_url(url: str | None, directory: Path, tag: str) -> str:
    """The URL the workers use: a fresh SQLite file by default.

    The backend keeps its default settings (a takeover gets the dead owner's
    unfinished signals because the new owner reclaims them). On Redis the demo
    adds a key prefix of its own, unless the user set one, so runs never see
    each other's keys.
    """
    if url is None:
        return f"sqlite:///{directory / 'demo.db'}"
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("redis", "rediss"):
        return _with_query(url, {"prefix": f"{tag}:"})
    return url


async def _probe(url: str) -> None:
    """Fail fast, in the coordinator, on a URL the runtime cannot use across processes."""

    async def nothing(run: ThreadRun) -> None:
        return None

    backend = from_url(url)
    async with backend:
        ThreadRuntime(backend, nothing)  # raises ConfigurationError without pub/sub
        await backend.get_lease_owner("tenure-demo-probe")


# -- the coordinator --------------------------------------------------------------


class _Coordinator:
    def __init__(self, settings: DemoSettings, directory: Path) -> None:
        self.s = settings
        self.dir = directory
        self.seed = settings.seed if settings.seed is not None else secrets.randbelow(10**6)
        self.rng = random.Random(f"coordinator:{self.seed}")
        self.tag = f"tenure-demo-{secrets.token_hex(4)}"
        self.url = demo_url(settings.url, directory, self.tag)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.offsets: dict[Path, int] = {}
        self.state = DemoState(planned=settings.signals)
        self.kill_at = int(settings.signals * self.rng.uniform(0.3, 0.45))
        self.victim: str | None = None
        self.kill_t: int | None = None
        self.victim_threads: list[str] = []
        self.failures: list[str] = []
        self._out = (directory / f"{COORDINATOR}.jsonl").open("a", encoding="utf-8")

    def record(self, kind: str, **fields: Any) -> Record:
        doc = {"k": kind, "w": COORDINATOR, "t": time.monotonic_ns(), **fields}
        self._out.write(json.dumps(doc) + "\n")
        self._out.flush()
        return doc

    def poll(self) -> list[Record]:
        batch: list[Record] = []
        for path in sorted(self.dir.glob("w*.jsonl")):
            records, self.offsets[path] = read_new_lines(path, self.offsets.get(path, 0))
            batch.extend(records)
        batch.sort(key=lambda r: int(r.get("t", 0)))
        for r in batch:
            self.state.apply(r)
        return batch

    def check_workers(self) -> None:
        for name, proc in self.procs.items():
            view = self.state.workers.setdefault(name, WorkerView())
            rc = proc.poll()
            if rc is not None and view.status not in ("KILLED", "stopped", "FAILED"):
                view.status = "stopped" if rc == 0 else "FAILED"
                if rc != 0:
                    self.failures.append(f"{name} exited with status {rc}")
                    self.state.note(time.monotonic_ns(), f"{name} EXITED with status {rc}", True)

    def spawn(self) -> None:
        (self.dir / "settings.json").write_text(
            json.dumps(
                {
                    "url": self.url,
                    "namespace": self.tag,
                    "seed": self.seed,
                    "workers": self.s.workers,
                    "threads": self.s.threads,
                    "signals": self.s.signals,
                    "ttl_ms": self.s.ttl_ms,
                    "send_seconds": self.s.send_seconds,
                    "idle_timeout": 0.5,
                    "work_ms": [30, 150],
                    "signals_per_run": [1, 4],
                }
            )
        )
        self.record("start", seed=self.seed, url=redact_url(self.url), workers=self.s.workers)
        env = dict(os.environ)
        # The workers must import this very copy of tenure, installed or not.
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        for i in range(self.s.workers):
            name = worker_name(i)
            log: IO[bytes] = (self.dir / f"{name}.log").open("ab")
            with log:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "tenure.demo.worker", str(self.dir), str(i)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=env,
                )
            self.state.workers[name] = WorkerView(pid=self.procs[name].pid)

    def wait_ready(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            self.check_workers()
            if self.failures:
                return False
            if all(w.status == "running" for w in self.state.workers.values()):
                return True
            time.sleep(_TICK)
        self.failures.append(f"workers not ready within {timeout:.0f} s")
        return False

    def go(self) -> None:
        t0 = time.monotonic_ns() + 200_000_000
        self.state.t0 = t0
        tmp = self.dir / "go.tmp"
        tmp.write_text(json.dumps({"t": t0}))
        tmp.replace(self.dir / "go")  # atomic: a worker never reads half a file

    def maybe_kill(self) -> None:
        if not self.s.kill or self.victim is not None or self.s.workers < 2:
            return
        if len(self.state.sent) < self.kill_at:
            return
        candidates = [
            name
            for name, proc in self.procs.items()
            if proc.poll() is None and self.state.owned_by(name)
        ]
        if not candidates:
            return  # nobody owns a thread right now: try again next tick
        most = max(len(self.state.owned_by(c)) for c in candidates)
        victim = self.rng.choice([c for c in candidates if len(self.state.owned_by(c)) == most])
        proc = self.procs[victim]
        self.victim_threads = self.state.owned_by(victim)
        proc.kill()
        proc.wait()
        # Taken after wait(): the process is certainly gone by then, so its open
        # runs are closed no earlier than they really ended.
        doc = self.record("killed", victim=victim, pid=proc.pid, owned=self.victim_threads)
        self.victim, self.kill_t = victim, int(doc["t"])
        self.state.apply(doc)

    def finished(self) -> bool:
        senders_done = all(
            v.sending_done or v.status in ("KILLED", "stopped", "FAILED")
            for name, v in self.state.workers.items()
            if name in self.procs
        )
        return senders_done and self.state.sent <= self.state.handled

    def stop(self, timeout: float = 20.0) -> None:
        (self.dir / "stop").write_text("stop\n")
        deadline = time.monotonic() + timeout
        for name, proc in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.failures.append(f"{name} did not stop within {timeout:.0f} s")
        self.poll()
        self.check_workers()

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self._out.close()


def _takeover_figures(
    records: list[Record], victim: str, kill_t: int, threads: list[str]
) -> list[str]:
    lines = []
    for thread in threads:
        after = [
            r
            for r in records
            if r.get("k") == "run_start"
            and r.get("thread") == thread
            and r.get("w") != victim
            and int(r["t"]) > kill_t
        ]
        if after:
            first = min(after, key=lambda r: int(r["t"]))
            lines.append(
                f"{thread}: taken over by {first['w']} {(int(first['t']) - kill_t) / 1e9:.2f} s "
                f"after the kill (token {first.get('token')})"
            )
        else:
            lines.append(f"{thread}: no run after the kill")
    return lines


def _print_verdict(console: Console, verdict: Verdict, extra: list[str]) -> None:
    f = verdict.figures
    console.print(
        f"runs {f['runs']}, hand-overs {f['handovers']}, takeovers {f['takeovers']}, "
        f"signals routed to another owner {f['routed']}, leases lost {f['lost']}",
        highlight=False,
    )
    for line in extra:
        console.print(f"  {line}", highlight=False)
    for line in verdict.lines():
        style = None
        if line.startswith("VERDICT"):
            style = "bold green" if verdict.passed else "bold red"
        console.print(line, style=style, highlight=False, markup=False)


def _introduce(console: Console, settings: DemoSettings, coord: _Coordinator) -> None:
    console.print(
        f"tenure demo: {settings.workers} workers, {settings.threads} threads, "
        f"{settings.signals} signals, TTL {settings.ttl_ms} ms, seed {coord.seed}",
        highlight=False,
    )
    console.print(f"backend: {redact_url(coord.url)}", highlight=False, markup=False)
    console.print(
        f"reproduce the plan with: tenure demo --seed {coord.seed} --workers {settings.workers} "
        f"--threads {settings.threads} --signals {settings.signals}",
        highlight=False,
    )
    if coord.url.split("://", 1)[0].lower() == "memory":
        console.print(
            "memory:// reaches one process: every worker gets a backend of its own, so the "
            "verdict is expected to FAIL (a negative control)",
            highlight=False,
        )


def _step(coord: _Coordinator) -> None:
    time.sleep(_TICK)
    coord.poll()
    coord.check_workers()
    coord.maybe_kill()


def _follow_live(console: Console, coord: _Coordinator, deadline: float) -> None:
    """On a terminal: the live view, until every signal is handled or the deadline."""
    title = f"tenure demo (seed {coord.seed})"
    with Live(render(coord.state, title), console=console, refresh_per_second=8) as live:
        while not coord.finished() and time.monotonic() < deadline:
            _step(coord)
            live.update(render(coord.state, title))
        coord.stop()
        live.update(render(coord.state, title))


def _follow_lines(console: Console, coord: _Coordinator, deadline: float) -> None:
    """Piped: what is notable as it happens, and a progress line every 2 s."""
    next_line = time.monotonic() + 2.0
    shown = 0
    while not coord.finished() and time.monotonic() < deadline:
        _step(coord)
        for line in coord.state.notable[shown:]:
            console.print(line, highlight=False, markup=False)
        shown = len(coord.state.notable)
        if time.monotonic() >= next_line:
            console.print(progress_line(coord.state), highlight=False)
            next_line += 2.0
    coord.stop()
    for line in coord.state.notable[shown:]:
        console.print(line, highlight=False, markup=False)
    console.print(progress_line(coord.state), highlight=False)


def _conclude(console: Console, settings: DemoSettings, coord: _Coordinator) -> Verdict:
    """Judge the evidence, print the verdict with the run's figures, return it."""
    records = read_dir(coord.dir)
    verdict = judge(records)
    extra: list[str] = []
    unsent = settings.signals - verdict.figures["sent"]
    if unsent:
        extra.append(
            f"{unsent} of the {settings.signals} planned signals were never sent "
            "(the killed worker's remaining share)"
        )
    if coord.victim is not None and coord.kill_t is not None:
        extra += _takeover_figures(records, coord.victim, coord.kill_t, coord.victim_threads)
    elif settings.kill and settings.workers >= 2:
        extra.append("no worker was killed (none owned a thread when the kill was due)")
    verdict.checks.append(
        Check(
            "workers ran cleanly",
            not coord.failures,
            f"{len(coord.failures)} worker problems (exit status, stop)",
            list(coord.failures),
        )
    )
    _print_verdict(console, verdict, extra)
    return verdict


def _perform(console: Console, settings: DemoSettings, coord: _Coordinator) -> Verdict | None:
    """Start the workers, follow them, judge; ``None`` when the demo could not run."""
    try:
        coord.spawn()
        if not coord.wait_ready():
            raise _Abort("; ".join(coord.failures))
        coord.go()
        deadline = time.monotonic() + settings.send_seconds + max(30.0, 6 * settings.ttl_ms / 1000)
        if console.is_terminal:
            _follow_live(console, coord, deadline)
        else:
            _follow_lines(console, coord, deadline)
        if not coord.finished():
            console.print("deadline reached before every signal was handled", highlight=False)
        return _conclude(console, settings, coord)
    except _Abort as exc:
        console.print(f"the demo could not run: {exc}", markup=False, highlight=False)
    except KeyboardInterrupt:
        console.print("interrupted", highlight=False)
    finally:
        coord.kill_all()
        coord.close()
    return None


def run_demo(settings: DemoSettings, console: Console | None = None) -> int:
    """Run the demo; 0 when the verdict passes, 1 when it fails, 2 when it could not run."""
    console = console or Console(soft_wrap=True)
    directory = Path(tempfile.mkdtemp(prefix="tenure-demo-"))
    coord = _Coordinator(settings, directory)
    _introduce(console, settings, coord)
    try:
        asyncio.run(_probe(coord.url))
    except (TenureError, OSError) as exc:
        console.print(f"cannot use {redact_url(coord.url)}: {exc}", markup=False, highlight=False)
        coord.close()
        shutil.rmtree(directory, ignore_errors=True)
        return 2
    verdict = _perform(console, settings, coord)
    ok = verdict is not None and verdict.passed
    if settings.keep or not ok:
        console.print(f"evidence kept in {directory}", highlight=False, markup=False)
    else:
        shutil.rmtree(directory, ignore_errors=True)
    if verdict is None:
        return 2
    return 0 if ok else 1


class _Abort(Exception):
    pass
