"""The demo's live view: who owns which thread, built only from the evidence records."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ._evidence import COORDINATOR, Record

__all__ = ["DemoState", "ThreadView", "WorkerView", "progress_line", "render"]


@dataclass
class ThreadView:
    owner: str | None = None
    run_id: str | None = None
    token: int | None = None
    handled: int = 0
    runs: int = 0
    handovers: int = 0
    takeovers: int = 0
    # Who holds the lease as far as wake/takeover/release/lost events say.
    session_owner: str | None = None


@dataclass
class WorkerView:
    pid: int | None = None
    status: str = "starting"
    sent: int = 0
    handled: int = 0
    sending_done: bool = False


@dataclass
class DemoState:
    """What the coordinator knows, built only from the evidence records."""

    t0: int = 0
    threads: dict[str, ThreadView] = field(default_factory=dict)
    workers: dict[str, WorkerView] = field(default_factory=dict)
    log: deque[str] = field(default_factory=lambda: deque(maxlen=8))
    notable: list[str] = field(default_factory=list)
    sent: set[str] = field(default_factory=set)
    handled: set[str] = field(default_factory=set)
    routed: int = 0
    handovers: int = 0
    takeovers: int = 0
    planned: int = 0

    def elapsed(self, t: int | None = None) -> float:
        t = time.monotonic_ns() if t is None else t
        return max(0.0, (t - self.t0) / 1e9) if self.t0 else 0.0

    def owned_by(self, worker: str) -> list[str]:
        return sorted(k for k, v in self.threads.items() if v.owner == worker)

    def note(self, t: int, text: str, notable: bool = False) -> None:
        line = f"{self.elapsed(t):6.1f}s  {text}"
        self.log.append(line)
        if notable:
            self.notable.append(line)

    def apply(self, r: Record) -> None:
        k, w, t = r.get("k"), str(r.get("w")), int(r.get("t", 0))
        if w != COORDINATOR:
            self.workers.setdefault(w, WorkerView())
        th = self.threads.setdefault(r["thread"], ThreadView()) if "thread" in r else None
        if k == "hello":
            self.workers[w].pid = r.get("pid")
            self.workers[w].status = "running"
        elif k == "sent":
            self.workers[w].sent += 1
            self.sent.add(r["sig"])
            if r.get("outcome") == "deliver":
                self.routed += 1
        elif k == "handled" and th is not None:
            self.workers[w].handled += 1
            th.handled += 1
            self.handled.add(r["sig"])
        elif k == "run_start" and th is not None:
            th.owner, th.run_id, th.token = w, r.get("run_id"), r.get("token")
            th.runs += 1
        elif k == "sending_done":
            self.workers[w].sending_done = True
        elif k == "killed":
            victim = str(r["victim"])
            owned = self.owned_by(victim)
            self.workers.setdefault(victim, WorkerView()).status = "KILLED"
            self.note(
                t,
                f"SIGKILL {victim} (pid {r.get('pid')}) holding {', '.join(owned) or 'nothing'}",
                True,
            )
        elif k == "event" and th is not None:
            self._apply_event(r, w, t, th)

    def _apply_event(self, r: Record, w: str, t: int, th: ThreadView) -> None:
        ev, thread, token = r.get("ev"), r["thread"], r.get("token")
        if ev in ("wake", "takeover"):
            previous = th.session_owner
            th.owner, th.run_id, th.token = w, r.get("run_id"), token
            th.session_owner = w
            if previous not in (None, w):
                # The previous owner never released: it died or lost the lease.
                th.takeovers += 1
                self.takeovers += 1
                self.note(t, f"{w} took over {thread} from {previous} (token {token})", True)
            else:
                self.note(t, f"{w} woke {thread} (token {token})")
        elif ev == "handover":
            th.owner, th.run_id, th.token = w, r.get("run_id"), token
            th.handovers += 1
            self.handovers += 1
            self.note(t, f"{w} handed {thread} to its next run (token {token})")
        elif ev in ("release", "lost"):
            if th.owner == w and th.run_id == r.get("run_id"):
                th.owner = th.run_id = None
            if th.session_owner == w:
                th.session_owner = None
            if ev == "lost":
                self.note(t, f"{w} LOST {thread}: {r.get('detail')}", True)
            else:
                self.note(t, f"{w} released {thread}")
        elif ev == "refused":
            self.note(t, f"{w}: the backend refuses {thread} to everyone ({r.get('detail')})", True)


def render(state: DemoState, title: str) -> RenderableType:
    """The live view: threads, workers, recent events."""
    threads = Table(title=title, title_justify="left", expand=False)
    for col in ("thread", "owner", "run", "token", "handled", "runs", "hand-overs", "takeovers"):
        threads.add_column(col, justify="left" if col in ("thread", "owner", "run") else "right")
    for name in sorted(state.threads, key=lambda n: (len(n), n)):
        v = state.threads[name]
        owner = v.owner or "idle"
        if v.owner and state.workers.get(v.owner, WorkerView()).status == "KILLED":
            owner = f"[red]{v.owner} (dead)[/red]"
        threads.add_row(
            name,
            owner,
            v.run_id or "-",
            "-" if v.token is None else str(v.token),
            str(v.handled),
            str(v.runs),
            str(v.handovers),
            str(v.takeovers),
        )
    workers = Table(expand=False)
    for col in ("worker", "pid", "status", "sent", "handled", "owns"):
        workers.add_column(col, justify="right" if col in ("sent", "handled") else "left")
    for name in sorted(state.workers, key=lambda n: (len(n), n)):
        wv = state.workers[name]
        status = f"[red]{wv.status}[/red]" if wv.status in ("KILLED", "FAILED") else wv.status
        workers.add_row(
            name,
            str(wv.pid or "-"),
            status,
            str(wv.sent),
            str(wv.handled),
            ", ".join(state.owned_by(name)) if wv.status != "KILLED" else "-",
        )
    summary = Text(
        f"{state.elapsed():.1f}s  signals sent {len(state.sent)}/{state.planned}, "
        f"handled {len(state.handled)}, routed to another owner {state.routed}, "
        f"hand-overs {state.handovers}, takeovers {state.takeovers}"
    )
    return Group(threads, workers, summary, Text("\n".join(state.log) or "(no events yet)"))


def progress_line(state: DemoState) -> str:
    alive = sum(1 for w in state.workers.values() if w.status == "running")
    return (
        f"{state.elapsed():6.1f}s  sent {len(state.sent)}/{state.planned}  "
        f"handled {len(state.handled)}  routed {state.routed}  hand-overs {state.handovers}  "
        f"takeovers {state.takeovers}  workers alive {alive}"
    )
