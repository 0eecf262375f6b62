"""What a thread run leaves behind, and the writers that record it.

- **Stored signals**: one JSON line per ``send_signal`` that returned, written by
  the sender with an unbuffered append right after the call (``stored-*.jsonl``).
  A signal whose send never returned (the sender died, or gave up at the end of
  the run) is not recorded: its outcome is unknown, so nothing is owed for it.
- **Sink writes**: one row per signal a handler wrote, in one SQLite table
  (``sink.db``), each appended in its own ``BEGIN IMMEDIATE`` transaction. The
  row id is the commit order. The handler checks ``run.ensure_held()`` *inside*
  the transaction, after taking the sink's write lock: a run whose lease was lost
  before a newer run's write committed cannot pass that check afterwards, so a
  write from a lower token after a higher one is a real overlap, never the
  artefact of a pause between the check and the write.
- **Settlements** (the policies workload): one JSON line per runtime event that
  settles a signal unrun or hands it to another's run (``coalesced``,
  ``discarded``, ``interrupted``; ``events-*.jsonl``), written by the owner's
  ``on_event`` as the runtime emits it, before the signal is acknowledged.
- **Faults**: one JSON line per injected fault (``faults.jsonl``), by the runner.
- **Checkpoints** (the LangGraph workload): every thread's checkpoint history as
  LangGraph orders it, one JSON line per checkpoint (``checkpoints.jsonl``), and
  each thread's final state (``states.jsonl``), read from the saver after the run
  (:mod:`safety.threads.graph`).

Every time is ``time.monotonic_ns()``: one host, one timeline for all processes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import sqlite3
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "Checkpoint",
    "Fault",
    "FinalState",
    "Settled",
    "Sink",
    "Stored",
    "StoredLog",
    "Write",
    "load_checkpoints",
    "load_faults",
    "load_handed",
    "load_settled",
    "load_states",
    "load_stored",
    "load_writes",
]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS writes ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " namespace TEXT NOT NULL, thread TEXT NOT NULL, token INTEGER,"
    " run_id TEXT NOT NULL, signal_id TEXT NOT NULL, worker TEXT NOT NULL,"
    " attempt INTEGER NOT NULL, t_ns INTEGER NOT NULL, wall REAL NOT NULL)"
)


@dataclass(frozen=True, slots=True)
class Stored:
    """``sender`` was told that signal ``signal_id`` (its ``seq``-th to the thread) is stored."""

    signal_id: str
    namespace: str
    thread: str
    sender: str
    seq: int
    t_ns: int
    outcome: str = "deliver"
    #: A poison signal: its handler always fails on it, with a CancelledError it did
    #: not ask for. The backend drops it after its attempts; it is never written.
    poison: bool = False
    #: The policy it was sent under (the policies workload mixes them), and when
    #: its send began: it was stored after ``t0_ns`` and before ``t_ns``.
    policy: str = "enqueue"
    t0_ns: int = 0

    @property
    def owed(self) -> bool:
        """Whether a run owes it (a rejected send stored nothing)."""
        return self.outcome != "rejected" and not self.poison


@dataclass(frozen=True, slots=True)
class Settled:
    """The owner ``worker`` settled ``signal_id`` of a thread (a runtime event of ``kind``:
    ``coalesced`` into ``detail``'s signal, ``discarded``, or ``interrupted``: skipped)."""

    kind: str
    namespace: str
    thread: str
    signal_id: str
    run_id: str | None
    detail: str | None
    worker: str
    t_ns: int


@dataclass(frozen=True, slots=True)
class Write:
    """A handler's write of ``signal_id``: the ``order``-th commit of the sink.

    ``namespace`` and ``thread`` are the handling run's (where the signal
    arrived), not the sender's.
    """

    order: int
    namespace: str
    thread: str
    token: int | None
    run_id: str
    signal_id: str
    worker: str
    t_ns: int
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault of ``kind`` on ``target`` from ``start_ns`` to ``end_ns`` (equal for an instant)."""

    kind: str
    target: str
    start_ns: int
    end_ns: int


class _Run(Protocol):
    """What the sink needs of a :class:`tenure.ThreadRun`."""

    thread_key: str
    run_id: str
    token: int | None

    def ensure_held(self) -> None: ...


class Sink:
    """The recording fenced sink, as one worker process writes to it.

    One connection, used from one worker thread (``BEGIN IMMEDIATE`` may wait
    for a paused process's lock; the event loop must go on renewing meanwhile);
    writes of the process go one at a time.
    """

    def __init__(self, path: Path, worker: str) -> None:
        self.worker = worker
        self._db = sqlite3.connect(path, timeout=300, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout = 300000")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute(_SCHEMA)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sink")
        self._lock = asyncio.Lock()

    @staticmethod
    def create(path: Path) -> None:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute(_SCHEMA)
        finally:
            db.close()

    def _begin(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def _roll_back(self) -> None:
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    async def write(
        self,
        run: _Run,
        namespace: str,
        signal_id: str,
        attempt: int,
        carried: tuple[str, ...] = (),
    ) -> None:
        """Append one write, after one for each signal ``carried`` into it (coalesced), in
        one transaction; raises :class:`tenure.LeaseLost` (nothing written) if the run lost."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            begun = loop.run_in_executor(self._pool, self._begin)
            try:
                await asyncio.shield(begun)
            except asyncio.CancelledError:
                # The lock may still be taken by the worker thread: give it back,
                # queued behind the BEGIN on the sink's one thread. Not awaited:
                # a second cancellation (an interrupt, then a lost lease) would
                # end that wait and keep the lock, stalling every writer.
                self._pool.submit(self._roll_back)
                raise
            # From here on no await: the check and the write are one step of this
            # process, and the sink's lock keeps every other writer out.
            try:
                run.ensure_held()
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.executemany(
                "INSERT INTO writes (namespace, thread, token, run_id, signal_id, worker,"
                " attempt, t_ns, wall) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        namespace,
                        run.thread_key,
                        run.token,
                        run.run_id,
                        sid,
                        self.worker,
                        attempt,
                        time.monotonic_ns(),
                        time.time(),
                    )
                    for sid in (*carried, signal_id)
                ],
            )
            self._db.execute("COMMIT")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._db.close()


class StoredLog:
    """A sender's record of stored signals: one unbuffered append per line (survives SIGKILL)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(self, item: Stored | Settled) -> None:
        self.line(asdict(item))

    def line(self, row: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(row) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def _lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill
    return out


def load_stored(workdir: Path) -> list[Stored]:
    return [Stored(**row) for p in sorted(workdir.glob("stored-*.jsonl")) for row in _lines(p)]


def load_handed(workdir: Path) -> Counter[str]:
    """How many times each poison signal was handed to a handler, over every worker."""
    return Counter(
        row["signal_id"] for p in sorted(workdir.glob("handed-*.jsonl")) for row in _lines(p)
    )


def load_settled(workdir: Path) -> list[Settled]:
    return [Settled(**row) for p in sorted(workdir.glob("events-*.jsonl")) for row in _lines(p)]


def load_writes(path: Path) -> list[Write]:
    db = sqlite3.connect(path, timeout=60)
    try:
        rows = db.execute(
            "SELECT id, namespace, thread, token, run_id, signal_id, worker, t_ns, attempt"
            " FROM writes ORDER BY id"
        ).fetchall()
    finally:
        db.close()
    return [Write(*row) for row in rows]


def load_faults(path: Path) -> list[Fault]:
    return [Fault(**row) for row in _lines(path)] if path.exists() else []


@dataclass(frozen=True, slots=True)
class OutputSeen:
    """One item of a thread's output, as a reader read it after the run."""

    namespace: str
    thread: str
    position: int
    run_id: str
    token: int | None
    kind: str


def load_outputs(path: Path) -> list[OutputSeen]:
    return [OutputSeen(**row) for row in _lines(path)] if path.exists() else []


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint of a thread's history, as the saver stores it: its metadata's
    fencing token, signal (LangGraph's ``run_id``), tenure run and worker."""

    namespace: str
    thread: str
    checkpoint_id: str
    parent_id: str | None
    token: int | None
    signal_id: str
    run_id: str
    worker: str
    # Where the saver put it in commit order (SQLite's rowid); None where the
    # saver keeps no such order (PostgreSQL).
    stored: int | None = None


@dataclass(frozen=True, slots=True)
class FinalState:
    """A thread's final graph state: signal id -> times its input was applied
    (``asked``) and times it was answered (``answered``)."""

    namespace: str
    thread: str
    asked: dict[str, int]
    answered: dict[str, int]


def load_checkpoints(path: Path) -> list[Checkpoint]:
    return [Checkpoint(**row) for row in _lines(path)] if path.exists() else []


def load_states(path: Path) -> list[FinalState]:
    return [FinalState(**row) for row in _lines(path)] if path.exists() else []
