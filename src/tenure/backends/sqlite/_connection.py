"""The SQLite connection: one worker thread, its connection, and the SQL files.

The worker thread owns the only ``sqlite3`` connection of a backend instance;
the event loop hands it jobs and awaits their futures. Connecting (PRAGMAs,
schema), change detection (wake-up datagrams from :mod:`._wake`, and
``PRAGMA data_version`` polling behind them) and the translation of
``sqlite3.Error`` into :class:`~tenure.BackendUnavailable` happen here and
nowhere else.
"""

from __future__ import annotations

import abc
import asyncio
import os
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from ..._errors import BackendUnavailable, ConfigurationError
from .._claimed import EventOptions
from ._wake import SAFETY_POLL, WakeChannel

__all__ = [
    "CHUNK",
    "SYNCHRONOUS",
    "Connected",
    "Options",
    "Worker",
    "create_schema",
    "execute_chunked",
    "in_list",
    "in_rows",
    "load_sql",
    "write",
]

_T = TypeVar("_T")

# RETURNING needs 3.35; nothing below needs anything newer.
_MIN_SQLITE = (3, 35, 0)

#: The values of the ``synchronous`` option and their PRAGMA spelling.
SYNCHRONOUS = {"normal": "NORMAL", "full": "FULL"}

#: Keys per ``IN (...)`` list, well under SQLite's bound-parameter limit.
CHUNK = 500

# Where a .sql file wants its generated "?, ?, ..." list.
_KEYS_MARKER = "{keys}"


def load_sql(name: str) -> str:
    """The SQL of ``sql/<name>.sql`` (package data), without its comment lines."""
    text = (resources.files("tenure.backends.sqlite") / "sql" / f"{name}.sql").read_text("utf-8")
    return "\n".join(line for line in text.splitlines() if not line.startswith("--")).strip()


def in_list(template: str, count: int) -> str:
    """``template`` with its ``{keys}`` marker replaced by ``count`` placeholders."""
    return template.replace(_KEYS_MARKER, ",".join("?" * count))


def in_rows(template: str, count: int, width: int) -> str:
    """``template`` with its ``{rows}`` marker replaced by ``count`` rows of ``width``
    placeholders (``(?,?),(?,?)`` for a ``VALUES`` list)."""
    row = "(" + ",".join("?" * width) + ")"
    return template.replace("{rows}", ",".join([row] * count))


def execute_chunked(
    conn: sqlite3.Connection,
    template: str,
    items: Sequence[Any],
    *first: Any,
    width: int = 1,
) -> list[Any]:
    """Run ``template`` over ``items``, ``CHUNK // width`` of them per statement; every
    row the statements return.

    Each statement's parameters are ``first``, then its items: as the ``{keys}`` list
    (``width`` 1), or as ``{rows}`` of ``width`` values (each item a tuple of them).
    """
    rows: list[Any] = []
    step = CHUNK // width
    for start in range(0, len(items), step):
        chunk = items[start : start + step]
        if width == 1:
            rows += conn.execute(in_list(template, len(chunk)), (*first, *chunk))
        else:
            values = (x for item in chunk for x in item)
            rows += conn.execute(in_rows(template, len(chunk), width), (*first, *values))
    return rows


def statements(script: str) -> list[str]:
    """The statements of a script, each complete (a trigger body stays whole)."""
    out: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            out.append(pending.strip().removesuffix(";"))
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement: {pending.strip()!r}")
    return out


_SCHEMA = load_sql("schema")
_SCHEMA_VERSION = load_sql("schema_version")
# Migration n brings a file from version n - 1 to n; a file created by a
# version before them has the tables of schema.sql and version 0.
_MIGRATIONS = [statements(load_sql("schema_1")), statements(load_sql("schema_2"))]


def create_schema(conn: sqlite3.Connection) -> None:
    """Create the tables, or bring those of a file made by an earlier version up to date.

    Safe when several processes open a new or old file at once: each migration
    runs in one write transaction, after the version is read again inside it.
    """
    conn.executescript(_SCHEMA)
    if conn.execute(_SCHEMA_VERSION).fetchone()[0] >= len(_MIGRATIONS):
        return
    with write(conn):
        version: int = conn.execute(_SCHEMA_VERSION).fetchone()[0]
        for migration in _MIGRATIONS[version:]:
            for statement in migration:
                conn.execute(statement)


@dataclass(frozen=True)
class Options(EventOptions):
    """The event settings (``poll_interval``: polling's without wake-ups), and the connection's."""

    poll_interval: float = 0.01
    busy_timeout_ms: int = 5000
    synchronous: str = "normal"
    #: Create the file's missing parent directories at first use; otherwise a
    #: missing directory is refused (most often a typo in the path).
    create_dirs: bool = False


def check_directory(file: str, opts: Options) -> None:
    """Refuse ``file`` when its directory is missing, unless ``create_dirs`` is set.

    Creating it silently would hand two processes two databases when one of
    them has a typo in its path: each would hold "the" lease.
    """
    if opts.create_dirs:
        return
    where = os.path.dirname(file)
    if os.path.isdir(where):
        return
    state = "is not a directory" if os.path.exists(where) else "does not exist"
    raise ConfigurationError(
        f"the directory of SQLite file {file!r}, {where!r}, {state} (a typo in the path?): "
        f"create it, or add ?create_dirs=1 to the URL (create_dirs=True) to have tenure "
        "create it at first use"
    )


class Worker:
    """One thread, one ``sqlite3`` connection, a queue of jobs.

    While ``polling`` is on (something local waits for other connections'
    commits), ``notify`` is called on the event loop: with the datagrams
    read when the wake channel is rung, and with none when the thread,
    reading ``PRAGMA data_version`` between jobs, sees it changed. It reads it
    every :data:`~._wake.SAFETY_POLL` seconds while the wake channel listens,
    every ``poll_interval`` where that is unavailable.
    """

    def __init__(
        self,
        file: str,
        opts: Options,
        notify: weakref.WeakMethod[Callable[[Sequence[bytes]], None]],
    ) -> None:
        check_directory(file, opts)
        self.file = file
        self.opts = opts
        self.notify = notify
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.conn: sqlite3.Connection | None = None
        self.polling = False
        self.data_version: int | None = None
        self.wake = WakeChannel(file)

    def submit(self, fn: Callable[..., _T], args: tuple[Any, ...]) -> asyncio.Future[_T]:
        loop = asyncio.get_running_loop()
        if self.thread is None:
            self.loop = loop
            self.thread = threading.Thread(
                target=self.main, name=f"tenure-sqlite-{self.file}", daemon=True
            )
            self.thread.start()
        fut: asyncio.Future[_T] = loop.create_future()
        self.jobs.put((fn, args, fut, loop))
        return fut

    async def stop(self) -> None:
        """Close the connection and end the thread, after the jobs already queued."""
        if self.thread is None:
            self.wake.close()
            return
        loop = asyncio.get_running_loop()
        stopped: asyncio.Future[None] = loop.create_future()
        self.jobs.put((None, (), stopped, loop))
        await asyncio.shield(stopped)
        self.thread.join()  # the thread has closed the file and is exiting
        self.wake.close()

    def stop_soon(self) -> None:
        """Ask the thread to close the file and end, from any thread, without waiting."""
        self.jobs.put((None, (), None, None))
        self.wake.close_soon()

    def listen(self) -> None:
        """Receive wake-ups from now on (on the loop); call before the first look."""
        self.wake.listen(self.woken)

    def woken(self, messages: list[bytes]) -> None:
        """The wake channel was rung (on the loop)."""
        if self.polling:
            callback = self.notify()
            if callback is not None:
                callback(messages)

    def set_polling(self, on: bool) -> None:
        if on:
            self.listen()
        if on != self.polling:
            self.polling = on
            if on and self.thread is not None:
                self.jobs.put(())  # wake the thread so it starts polling now

    def poll_interval(self) -> float:
        if self.wake.listening:
            return max(SAFETY_POLL, self.opts.poll_interval)
        return self.opts.poll_interval

    def main(self) -> None:
        next_poll = 0.0
        jobs = self.jobs
        stop: tuple[asyncio.Future[None] | None, asyncio.AbstractEventLoop | None] = (None, None)
        while True:
            timeout = None
            if self.polling:
                timeout = max(0.0, next_poll - time.monotonic())
            try:
                item = jobs.get(timeout=timeout)
            except queue.Empty:
                item = ()
            if item:
                fn, args, fut, loop = item
                if fn is None:
                    stop = (fut, loop)
                    break
                try:
                    result = self.run(fn, args)
                except BaseException as exc:
                    _post(loop, fut, None, exc)
                else:
                    _post(loop, fut, result, None)
                del item, fn, args, fut  # drop references to the backend's bound methods
            if self.polling and self.conn is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.poll_interval()
                self.poll(self.conn)
                self.wake.check()
        self.wake.close_sender()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if stop[0] is not None and stop[1] is not None:
            _post(stop[1], stop[0], None, None)

    def poll(self, conn: sqlite3.Connection) -> None:
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            return  # the next real operation reports it
        if version == self.data_version or self.loop is None:
            return
        self.data_version = version
        callback = self.notify()
        if callback is not None:
            try:
                self.loop.call_soon_threadsafe(callback, ())
            except RuntimeError:
                pass  # the loop is closed: nobody left to tell

    def run(self, fn: Callable[..., _T], args: tuple[Any, ...]) -> _T:
        """``fn(conn, *args)``; an open transaction is rolled back if it raises."""
        try:
            conn = self.conn or self.connect()
            try:
                return fn(conn, *args)
            finally:
                if conn.in_transaction:
                    conn.rollback()
        except sqlite3.Error as exc:
            raise self.translate(exc) from exc

    def translate(self, exc: sqlite3.Error) -> BackendUnavailable:
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
            return BackendUnavailable(
                f"SQLite database {self.file!r} stayed locked by another connection for "
                f"more than busy_timeout_ms={self.opts.busy_timeout_ms}: {text}"
            )
        return BackendUnavailable(f"SQLite error on {self.file!r}: {text}")

    def connect(self) -> sqlite3.Connection:
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise BackendUnavailable(
                f"SqlitePubSub needs SQLite >= 3.35 (for RETURNING), this Python has {sqlite3.sqlite_version}"
            )
        check_directory(self.file, self.opts)  # it may have gone since
        try:
            Path(self.file).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot create the directory of {self.file!r}: {exc}"
            ) from exc
        timeout = self.opts.busy_timeout_ms / 1000
        conn = sqlite3.connect(
            self.file, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {self.opts.busy_timeout_ms}")
            # Switching a fresh file to WAL needs an exclusive lock that the busy
            # handler does not wait for; several processes may open it at once.
            deadline = time.monotonic() + timeout
            while True:
                try:
                    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"cannot switch the journal to WAL (got {mode!r})")
            conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[self.opts.synchronous]}")
            create_schema(conn)
            # The baseline for change detection, taken before any read of this
            # connection, so no commit by another process can slip between.
            self.data_version = conn.execute("PRAGMA data_version").fetchone()[0]
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            conn.close()
            raise
        self.conn = conn
        return conn


def _post(
    loop: asyncio.AbstractEventLoop,
    fut: asyncio.Future[Any],
    result: Any,
    exc: BaseException | None,
) -> None:
    try:
        loop.call_soon_threadsafe(_resolve, fut, result, exc)
    except RuntimeError:
        pass  # the loop is closed: nobody is waiting any more


def _resolve(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(result)
    else:
        fut.set_exception(exc)


@contextmanager
def write(conn: sqlite3.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction; rolled back (by the worker) if the body raises."""
    conn.execute("BEGIN IMMEDIATE")
    yield
    conn.execute("COMMIT")


class Connected(abc.ABC):
    """What both halves of the backend stand on: the worker thread and its connection.

    Jobs are plain functions ``fn(conn, *args)`` run on the worker thread, one
    job per operation; they see ``sqlite3`` and raise what it raises, and the
    worker turns that into :class:`~tenure.BackendUnavailable`.
    """

    _closed: bool
    _worker: Worker
    _opts: Options
    _file: str
    _clock: Callable[[], float]

    def _run(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        """Run ``fn(conn, *args)`` on the worker thread; the future has its result."""
        return self._worker.submit(fn, args)

    _write = staticmethod(write)

    @abc.abstractmethod
    def _check_open(self) -> None:
        """Raise ``BackendClosed`` once the backend is closed."""

    @abc.abstractmethod
    def _update_polling(self) -> None:
        """Poll for other connections' commits while anything local waits for them."""
