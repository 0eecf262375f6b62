"""Leases and pub/sub for every process on one host, in one SQLite file.

The embedded default: no server to run. Every process that opens the same file
(workers, CLI invocations, local serverless emulators) sees the same leases and
the same event log, coordinated by SQLite's own file locking.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import queue
import sqlite3
import threading
import time
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from .._contract import AcquireResult, LeaseRecord
from .._errors import BackendClosed, BackendUnavailable, ConfigurationError, InvalidArgument
from .._pubsub import Callback, Event, PubSub, check_callback, check_group, prepare_event
from .._validate import check_keys, check_name, check_timeout, check_ttl
from .._waiters import KeyWaiters

__all__ = ["SqlitePubSub"]

logger = logging.getLogger("tenure.sqlite")

_T = TypeVar("_T")

# RETURNING needs 3.35; UPSERT-free statements below need nothing newer.
_MIN_SQLITE = (3, 35, 0)

_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS tenure_meta (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO tenure_meta (name, value) VALUES ('token', 0);
CREATE TABLE IF NOT EXISTS tenure_leases (
    key BLOB PRIMARY KEY,
    owner BLOB NOT NULL,
    token INTEGER NOT NULL,
    deadline REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tenure_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic BLOB NOT NULL,
    body TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tenure_events_topic ON tenure_events (topic, id);
CREATE TABLE IF NOT EXISTS tenure_groups (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic BLOB NOT NULL,
    name BLOB NOT NULL,
    cursor INTEGER NOT NULL,
    private INTEGER NOT NULL,
    alive_until REAL NOT NULL,
    UNIQUE (topic, name)
);
CREATE TABLE IF NOT EXISTS tenure_pending (
    group_id INTEGER NOT NULL,
    event_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    visible_at REAL NOT NULL,
    consumer TEXT,
    PRIMARY KEY (group_id, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tenure_pending_event ON tenure_pending (event_id);
COMMIT;
"""

_SELECT_LEASE = "SELECT owner, token, deadline FROM tenure_leases WHERE key = ?"
_NEXT_TOKEN = "UPDATE tenure_meta SET value = value + 1 WHERE name = 'token' RETURNING value"
_INSERT_LEASE = (
    "INSERT OR REPLACE INTO tenure_leases (key, owner, token, deadline) VALUES (?, ?, ?, ?)"
)
_EXTEND_LEASE = "UPDATE tenure_leases SET deadline = ? WHERE key = ?"
_RENEW_LEASE = "UPDATE tenure_leases SET deadline = ? WHERE key = ? AND owner = ? AND deadline > ?"
_RELEASE_LEASE = "DELETE FROM tenure_leases WHERE key = ? AND owner = ? AND deadline > ?"
_TRANSFER_LEASE = "UPDATE tenure_leases SET owner = ?, token = ?, deadline = ? WHERE key = ?"
_SWEEP_LEASES = "DELETE FROM tenure_leases WHERE deadline <= ?"

_PUBLISH = (
    "INSERT INTO tenure_events (topic, body, created_at) "
    "SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM tenure_groups WHERE topic = ?1)"
)
_PRUNE_EVENTS = """
DELETE FROM tenure_events
WHERE created_at < ?1
   OR (id <= coalesce((SELECT min(g.cursor) FROM tenure_groups AS g
                       WHERE g.topic = tenure_events.topic), 9223372036854775807)
       AND NOT EXISTS (SELECT 1 FROM tenure_pending AS p WHERE p.event_id = tenure_events.id))
"""
_PRUNE_ORPHAN_CLAIMS = (
    "DELETE FROM tenure_pending WHERE NOT EXISTS "
    "(SELECT 1 FROM tenure_events AS e WHERE e.id = tenure_pending.event_id)"
)

_SYNCHRONOUS = {"normal": "NORMAL", "full": "FULL"}
_CHUNK = 500  # keys per IN (...) list, well under SQLite's bound-parameter limit
_BATCH = 100  # events claimed per fetch
_LEASE_SWEEP_INTERVAL = 60.0


@dataclass(frozen=True)
class _Options:
    busy_timeout_ms: int = 5000
    visibility_timeout: float = 30.0
    max_attempts: int = 5
    poll_interval: float = 0.01
    prune_interval: float = 10.0
    retention: float = 7 * 86400.0
    synchronous: str = "normal"


_OPTION_NAMES: Final = frozenset(_Options.__dataclass_fields__)


def _convert_option(name: str, value: Any) -> Any:
    """Turn a URL query value (a str) or a keyword value into the option's type."""
    try:
        if name in ("busy_timeout_ms", "max_attempts"):
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise TypeError
            number = int(value)
            low = 1 if name == "max_attempts" else 0
            if number < low:
                raise ValueError
            return number
        if name == "synchronous":
            if not isinstance(value, str) or value.lower() not in _SYNCHRONOUS:
                raise ValueError
            return value.lower()
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError
        seconds = float(value)
        if not (0 < seconds < math.inf):
            raise ValueError
        return seconds
    except (TypeError, ValueError):
        expected = {
            "busy_timeout_ms": "an int >= 0 (milliseconds)",
            "max_attempts": "an int >= 1",
            "synchronous": "'normal' or 'full'",
        }.get(name, "a finite number of seconds > 0")
        raise ConfigurationError(
            f"sqlite option {name} must be {expected}, got {value!r}"
        ) from None


def _path_from_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme.lower() != "sqlite":
        raise ConfigurationError(f"not a sqlite:// URL: {url!r}")
    if parts.netloc:
        raise ConfigurationError(
            f"sqlite URLs take no host: use sqlite:///relative.db or sqlite:////absolute.db, got {url!r}"
        )
    if parts.fragment:
        raise ConfigurationError(f"sqlite URLs take no fragment, got {url!r}")
    # urlsplit keeps the slash that ends the empty host: '/x.db' is relative,
    # '//abs/x.db' (four slashes in the URL) is absolute.
    path = unquote(parts.path)[1:]
    if not path or path.endswith("/"):
        raise ConfigurationError(f"sqlite URL names no database file: {url!r}")
    if path == ":memory:" or path.startswith("file:"):
        raise ConfigurationError(
            "sqlite:// needs a file that processes can share; use memory:// for one process"
        )
    return path


def _encode_many(keys: Sequence[str]) -> list[bytes]:
    return [k.encode() for k in keys]


class _Gone(Exception):
    """The consumer group row disappeared (deleted as stale by another process)."""


@dataclass(eq=False)
class _Group:
    """This instance's view of one consumer group on one topic.

    A fan-out subscriber has a private group of its own; a named group is shared
    by its members in every process, who compete for its events.
    """

    topic: str
    name: str | None
    gid: int
    cursor: int
    queue: asyncio.Queue[tuple[int, Event]] = field(default_factory=asyncio.Queue)
    workers: dict[Callback, asyncio.Task[None]] = field(default_factory=dict)
    # Event ids this instance has claimed and not yet acknowledged or dropped;
    # their visibility deadline is extended while this instance lives.
    held: set[int] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    fetcher: asyncio.Task[None] | None = None

    @property
    def private(self) -> bool:
        return self.name is None


class _Worker:
    """One thread, one ``sqlite3`` connection, a queue of jobs.

    While ``polling`` is on, the thread reads ``PRAGMA data_version`` every
    ``poll_interval`` between jobs and calls ``notify`` on the event loop when
    another connection has committed.
    """

    def __init__(
        self,
        file: str,
        opts: _Options,
        notify: weakref.WeakMethod[Callable[[], None]],
    ) -> None:
        self.file = file
        self.opts = opts
        self.notify = notify
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.conn: sqlite3.Connection | None = None
        self.polling = False
        self.data_version: int | None = None

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
            return
        loop = asyncio.get_running_loop()
        stopped: asyncio.Future[None] = loop.create_future()
        self.jobs.put((None, (), stopped, loop))
        await asyncio.shield(stopped)
        self.thread.join()  # the thread has closed the file and is exiting

    def stop_soon(self) -> None:
        """Ask the thread to close the file and end, from any thread, without waiting."""
        self.jobs.put((None, (), None, None))

    def set_polling(self, on: bool) -> None:
        if on != self.polling:
            self.polling = on
            if on and self.thread is not None:
                self.jobs.put(())  # wake the thread so it starts polling now

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
                next_poll = time.monotonic() + self.opts.poll_interval
                self.poll(self.conn)
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
                self.loop.call_soon_threadsafe(callback)
            except RuntimeError:
                pass  # the loop is closed: nobody left to tell

    def run(self, fn: Callable[..., _T], args: tuple[Any, ...]) -> _T:
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
            conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[self.opts.synchronous]}")
            conn.executescript(_SCHEMA)
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


class SqlitePubSub(PubSub):
    """Leases and durable pub/sub in one SQLite file (``sqlite:///path``).

    **Reach.** Every process on this host that opens the same file. The file
    must be on a local file system (SQLite's WAL mode needs shared memory; NFS
    and similar are not supported).

    **Execution.** Each instance runs the standard-library ``sqlite3`` on one
    dedicated thread with its own connection; the event loop only waits for
    results, so it never blocks on the file lock. Use an instance from one
    event loop.

    **Leases.** Every write is one short ``BEGIN IMMEDIATE`` transaction, so the
    check and the change are atomic across processes. A process that finds the
    write lock taken retries for ``busy_timeout_ms`` (default 5000); contention
    never surfaces as "database is locked" within that time. If the lock is
    held longer (for example by a stopped process), the call raises
    :class:`~tenure.BackendUnavailable` after the timeout, never hangs, and
    works again as soon as the holder resumes or dies (the OS drops the file
    locks of a dead process).

    **Clock.** Deadlines are kept on ``clock`` (default ``time.time``, seconds):
    the wall clock, the one clock every process on the host shares. Every
    process using the file must use the same clock; a wall-clock step (an
    administrator or NTP setting the time) shortens or lengthens live leases by
    the size of the step. The clock is read inside the transaction, after the
    write lock is taken. ``clock`` is injectable for tests
    (:class:`tenure.testing.ManualClock`); it affects leases only, pub/sub
    timing uses ``time.time``.

    **Fencing tokens** come from one counter row in the same file, bumped in
    the transaction that grants the lease, so they strictly increase for every
    key, also after expired or released lease rows were deleted by clean-up.

    **Durability.** WAL journal, ``synchronous=NORMAL`` by default: a
    transaction that committed survives the crash or ``SIGKILL`` of any process
    (it is in the WAL file before the call returns, and the file stays
    consistent whatever instant a process dies). Only an operating-system crash
    or power loss can lose the last transactions committed before it;
    ``synchronous=full`` closes that window at the cost of one ``fsync`` per
    write.

    A lease is lost only when its owner stops renewing it past its TTL.

    **Pub/sub.** A durable event log: each consumer group has a cursor, and
    events are claimed by a member, then deleted from the group's pending set
    when its callback returns. A callback that raises gets the event again
    (``attempt`` increased); a subscriber process that dies with events claimed
    has them redelivered to another member of the group after
    ``visibility_timeout`` seconds (default 30; a live subscriber keeps
    extending the claims of the events it holds). After ``max_attempts``
    deliveries (default 5) an event is dropped and logged at ERROR. Events
    published while a topic has no group are not stored. Named groups are
    durable: events published while a group has no member wait for one.
    Fan-out subscribers get a private group, deleted on ``unsubscribe``, on
    ``aclose`` or, when their process died, by any other instance after
    ``5 * visibility_timeout`` (the dead process's setting) without a
    heartbeat; a process stopped for that long joins again at the log's end
    and misses what was published meanwhile (logged at WARNING). Events every group of
    their topic has acknowledged are pruned every ``prune_interval`` seconds
    (default 10), and any event older than ``retention`` (default 7 days) is
    pruned even if unacknowledged, so the file does not grow without bound.

    **Change detection.** SQLite has no notifications. While this instance has
    subscribers or lease waiters, its thread reads ``PRAGMA data_version`` every
    ``poll_interval`` seconds (default 0.01); that number changes when another
    connection commits, and only then does the instance look for new events or
    released leases. Events and releases from other processes are therefore
    noticed within about ``poll_interval`` plus one transaction. The check
    itself costs a few microseconds; the cost of an idle subscriber is the
    thread's 100 wake-ups a second (measured at 1.4 to 2 percent of one core
    on a loaded two-core VM, see ``benchmarks/sqlite.py``). With no subscriber
    and no waiter the thread sleeps until the next operation.

    **Default.** ``tenure.from_url()`` with no URL and no ``TENURE_URL``
    environment variable opens ``$XDG_DATA_HOME/tenure/tenure.db`` (by default
    ``~/.local/share/tenure/tenure.db``), creating the directory on first use,
    so every process of the user on the host shares it.

    Options (keyword arguments or URL query parameters): ``busy_timeout_ms``,
    ``visibility_timeout``, ``max_attempts``, ``poll_interval``,
    ``prune_interval``, ``retention``, ``synchronous`` (``normal`` or ``full``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        **options: Any,
    ) -> None:
        unknown = sorted(set(options) - _OPTION_NAMES)
        if unknown:
            raise ConfigurationError(
                f"unknown sqlite option(s) {', '.join(unknown)}; known: {', '.join(sorted(_OPTION_NAMES))}"
            )
        if not callable(clock):
            raise ConfigurationError(f"clock must be callable, got {type(clock).__name__}")
        opts = _Options(**{name: _convert_option(name, v) for name, v in options.items()})
        self._path = os.fspath(path)
        if not self._path or self._path == ":memory:":
            raise ConfigurationError("SqlitePubSub needs the path of a database file")
        self._opts = opts
        # A private group whose instance stops heart-beating (every
        # visibility_timeout / 3) is deleted by any instance after this long;
        # the owner writes the deadline, so instances may use different settings.
        self._alive_for = 5 * opts.visibility_timeout
        self._file = os.path.abspath(self._path)
        self._clock = clock
        self._consumer = uuid.uuid4().hex
        self._closed = False

        # The worker thread holds only a weak reference to this object, so a
        # backend dropped without aclose() is collected, warns and stops it.
        self._worker = _Worker(self._file, opts, weakref.WeakMethod(self._on_external_change))
        # Touched only by jobs, on the worker thread.
        self._next_lease_sweep = -math.inf
        self._next_prune = 0.0

        # Event-loop side.
        self._waiters = KeyWaiters()
        # Last lease token seen for each key with local waiters (None: free).
        self._watched: dict[str, int | None] = {}
        self._topics: dict[str, dict[str | Callback, _Group]] = {}
        self._last_event_id: int | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._refresh_again = False
        self._maintenance_task: asyncio.Task[None] | None = None
        self._acks: deque[tuple[int, int, int | None]] = deque()
        self._acks_running = False
        self._acks_idle = asyncio.Event()
        self._acks_idle.set()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SqlitePubSub:
        """``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``.

        After ``sqlite://`` comes an empty host and a ``/``; what follows is the
        path, relative to the working directory unless it starts with ``/``
        (SQLAlchemy's convention: three slashes for a relative path, four for
        an absolute one, so ``"sqlite:///" + "/abs/x.db"`` is absolute).
        Percent-escapes in the path are decoded. Query parameters set options
        (see the class docstring); keyword ``options`` too, plus ``clock``. An
        unknown option, an option given twice or a bad value raises
        :class:`~tenure.ConfigurationError`. Missing parent directories are
        created when the file is first opened.
        """
        if not isinstance(url, str):
            raise ConfigurationError(f"url must be a str, got {type(url).__name__}")
        path = _path_from_url(url)
        query = urlsplit(url).query
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
        except ValueError:
            raise ConfigurationError(f"cannot parse the query of {url!r}") from None
        merged: dict[str, Any] = {}
        for name, value in pairs:
            if name not in _OPTION_NAMES:
                raise ConfigurationError(
                    f"unknown sqlite option {name!r}; known: {', '.join(sorted(_OPTION_NAMES))}"
                )
            if name in merged:
                raise ConfigurationError(f"sqlite option {name!r} is given twice")
            merged[name] = value
        for name in options:
            if name in merged:
                raise ConfigurationError(
                    f"sqlite option {name!r} is given in the URL and as a keyword"
                )
        return cls(path, **merged, **options)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"SqlitePubSub({self._path!r}, {state})"

    @property
    def path(self) -> str:
        """The database file, as given."""
        return self._path

    # -- the worker thread -----------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosed("SqlitePubSub is closed")

    def _run(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        """Run ``fn(conn, *args)`` on the worker thread; the future has its result."""
        return self._worker.submit(fn, args)

    def _update_polling(self) -> None:
        self._worker.set_polling(bool(self._topics) or len(self._waiters) > 0)

    @contextmanager
    def _write(self, conn: sqlite3.Connection) -> Iterator[None]:
        """One ``BEGIN IMMEDIATE`` transaction; rolled back if the body raises."""
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("COMMIT")

    # -- leases: jobs run on the worker thread ------------------------------------

    # Lease jobs spell out BEGIN IMMEDIATE ... COMMIT (they are the hot path); on
    # any error ``_job`` rolls the open transaction back.

    def _acquire_job(
        self, conn: sqlite3.Connection, key: bytes, owner: bytes, ttl_ms: int
    ) -> tuple[bool, bytes, int | None]:
        execute = conn.execute
        execute("BEGIN IMMEDIATE")
        now = self._clock()
        row = execute(_SELECT_LEASE, (key,)).fetchone()
        deadline = now + ttl_ms / 1000
        if row is not None and row[2] > now:
            if row[0] != owner:
                execute("COMMIT")
                return False, row[0], None
            execute(_EXTEND_LEASE, (deadline, key))
            token: int = row[1]
        else:
            token = execute(_NEXT_TOKEN).fetchone()[0]
            execute(_INSERT_LEASE, (key, owner, token, deadline))
        if now >= self._next_lease_sweep:
            # Rows of expired leases are dead weight; tokens live in tenure_meta.
            self._next_lease_sweep = now + _LEASE_SWEEP_INTERVAL
            execute(_SWEEP_LEASES, (now,))
        execute("COMMIT")
        return True, owner, token

    def _read_lease_job(
        self, conn: sqlite3.Connection, key: bytes
    ) -> tuple[bytes, int, float] | None:
        row = conn.execute(_SELECT_LEASE, (key,)).fetchone()
        now = self._clock()
        if row is None or row[2] <= now:
            return None
        return row[0], row[1], row[2] - now

    def _release_job(self, conn: sqlite3.Connection, key: bytes, owner: bytes) -> bool:
        conn.execute("BEGIN IMMEDIATE")
        released = conn.execute(_RELEASE_LEASE, (key, owner, self._clock())).rowcount
        conn.execute("COMMIT")
        return released == 1

    def _renew_job(self, conn: sqlite3.Connection, key: bytes, owner: bytes, ttl_ms: int) -> bool:
        conn.execute("BEGIN IMMEDIATE")
        now = self._clock()
        renewed = conn.execute(_RENEW_LEASE, (now + ttl_ms / 1000, key, owner, now)).rowcount
        conn.execute("COMMIT")
        return renewed == 1

    def _renew_many_job(
        self, conn: sqlite3.Connection, keys: list[bytes], owner: bytes, ttl_ms: int
    ) -> set[bytes]:
        renewed: set[bytes] = set()
        with self._write(conn):
            now = self._clock()
            deadline = now + ttl_ms / 1000
            for start in range(0, len(keys), _CHUNK):
                chunk = keys[start : start + _CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    "UPDATE tenure_leases SET deadline = ? "
                    f"WHERE owner = ? AND deadline > ? AND key IN ({marks}) RETURNING key",
                    (deadline, owner, now, *chunk),
                )
                renewed.update(r[0] for r in rows)
        return renewed

    def _transfer_job(
        self, conn: sqlite3.Connection, key: bytes, from_owner: bytes, to_owner: bytes, ttl_ms: int
    ) -> int | None:
        conn.execute("BEGIN IMMEDIATE")
        now = self._clock()
        row = conn.execute(_SELECT_LEASE, (key,)).fetchone()
        if row is None or row[2] <= now or row[0] != from_owner:
            conn.execute("COMMIT")
            return None
        token: int = conn.execute(_NEXT_TOKEN).fetchone()[0]
        conn.execute(_TRANSFER_LEASE, (to_owner, token, now + ttl_ms / 1000, key))
        conn.execute("COMMIT")
        return token

    # -- leases: the contract ------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        check_name(key, "key")
        check_name(owner, "owner")
        check_ttl(ttl_ms)
        self._check_open()
        acquired, holder, token = await self._run(
            self._acquire_job, key.encode(), owner.encode(), ttl_ms
        )
        if not acquired:
            return AcquireResult(False, holder.decode(), None)
        if key in self._watched:
            self._watched[key] = token
        return AcquireResult(True, owner, token)

    async def get_lease_owner(self, key: str) -> str | None:
        check_name(key, "key")
        self._check_open()
        row = await self._run(self._read_lease_job, key.encode())
        return None if row is None else row[0].decode()

    async def get_lease(self, key: str) -> LeaseRecord | None:
        check_name(key, "key")
        self._check_open()
        row = await self._run(self._read_lease_job, key.encode())
        if row is None:
            return None
        owner, token, remaining = row
        return LeaseRecord(owner.decode(), token, max(1, math.ceil(remaining * 1000)))

    async def release_lease(self, key: str, owner: str) -> None:
        check_name(key, "key")
        check_name(owner, "owner")
        self._check_open()
        if await self._run(self._release_job, key.encode(), owner.encode()):
            if key in self._watched:
                self._watched[key] = None
            if self._waiters:
                self._waiters.wake_one(key)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        check_name(key, "key")
        check_name(owner, "owner")
        check_ttl(ttl_ms)
        self._check_open()
        return await self._run(self._renew_job, key.encode(), owner.encode(), ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        check_name(key, "key")
        check_name(from_owner, "from_owner")
        check_name(to_owner, "to_owner")
        check_ttl(ttl_ms)
        self._check_open()
        token = await self._run(
            self._transfer_job, key.encode(), from_owner.encode(), to_owner.encode(), ttl_ms
        )
        if token is None:
            return False
        if key in self._watched:
            self._watched[key] = token
        if self._waiters:
            self._waiters.wake_one(key)
        return True

    # -- leases: extensions ----------------------------------------------------------

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many of ``owner``'s leases in one transaction; one ``bool`` per key, in order."""
        keys = check_keys(keys)
        check_name(owner, "owner")
        check_ttl(ttl_ms)
        self._check_open()
        encoded = _encode_many(keys)
        if not encoded:
            return []
        renewed = await self._run(self._renew_many_job, encoded, owner.encode(), ttl_ms)
        return [k in renewed for k in encoded]

    async def wait_lease_released(self, key: str, timeout: float) -> bool:
        """Wait until ``key`` is released or transferred, at most ``timeout`` seconds.

        ``True`` at once if the key has no live lease, or when a release or
        transfer wakes this waiter; ``False`` on timeout. A release or transfer
        by this instance wakes one local waiter at once; one by another process
        is noticed within about ``poll_interval`` and also wakes one local
        waiter. An expiry wakes nobody (as on every backend): pass a timeout no
        longer than the TTL if you want to retry after expiry.
        """
        check_name(key, "key")
        check_timeout(timeout)
        self._check_open()
        fut = self._waiters.register(key)
        self._worker.set_polling(True)
        try:
            try:
                row = await self._run(self._read_lease_job, key.encode())
            except BaseException:
                self._waiters.discard(key, fut)
                raise
            if row is None:
                self._waiters.discard(key, fut)
                return True
            if not fut.done():
                self._watched[key] = row[1]
            return await self._waiters.wait(key, fut, timeout)
        finally:
            self._update_polling()

    # -- change detection --------------------------------------------------------------

    def _on_external_change(self) -> None:
        """Another connection committed: look for released leases and new events."""
        if self._closed:
            return
        if self._refresh_task is not None and not self._refresh_task.done():
            self._refresh_again = True
            return
        self._refresh_task = asyncio.get_running_loop().create_task(
            self._refresh(), name="tenure-sqlite-refresh"
        )

    def _check_job(
        self, conn: sqlite3.Connection, keys: list[bytes], after_event: int | None
    ) -> tuple[dict[bytes, int | None], list[tuple[bytes, int]]]:
        states: dict[bytes, int | None] = dict.fromkeys(keys)
        conn.execute("BEGIN")  # one snapshot for everything read below
        now = self._clock()
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start : start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            rows = conn.execute(
                f"SELECT key, token, deadline FROM tenure_leases WHERE key IN ({marks})", chunk
            )
            states.update({k: token for k, token, deadline in rows if deadline > now})
        topics: list[tuple[bytes, int]] = []
        if after_event is not None:
            topics = conn.execute(
                "SELECT topic, max(id) FROM tenure_events WHERE id > ? GROUP BY topic",
                (after_event,),
            ).fetchall()
        conn.execute("COMMIT")
        return states, topics

    async def _refresh(self) -> None:
        while True:
            self._refresh_again = False
            waited = self._waiters.keys()
            for stale in set(self._watched) - set(waited):
                del self._watched[stale]
            try:
                states, topics = await self._run(
                    self._check_job, _encode_many(waited), self._last_event_id
                )
            except BackendUnavailable as exc:
                logger.warning("cannot check %s for changes: %s", self._file, exc)
                states, topics = {}, []
            for key_b, token in states.items():
                key = key_b.decode()
                previous = self._watched.get(key, -1)
                self._watched[key] = token
                if token == previous:
                    continue
                if token is None or previous not in (-1, None):
                    # Released, or owned by someone new since we last looked.
                    self._waiters.wake_one(key)
            for topic_b, max_id in topics:
                for group in self._topics.get(topic_b.decode(), {}).values():
                    group.wake.set()
                if self._last_event_id is None or max_id > self._last_event_id:
                    self._last_event_id = max_id
            self._update_polling()
            if not self._refresh_again:
                return

    # -- pub/sub: jobs run on the worker thread ---------------------------------------------

    def _publish_job(
        self, conn: sqlite3.Connection, topic: bytes, body: str, created: float
    ) -> None:
        with self._write(conn):
            conn.execute(_PUBLISH, (topic, body, created))
            now = time.time()
            if now >= self._next_prune:
                self._prune(conn, now)

    def _prune(self, conn: sqlite3.Connection, now: float) -> None:
        self._next_prune = now + self._opts.prune_interval
        conn.execute(
            "DELETE FROM tenure_pending WHERE group_id IN "
            "(SELECT id FROM tenure_groups WHERE private = 1 AND alive_until < ?)",
            (now,),
        )
        conn.execute("DELETE FROM tenure_groups WHERE private = 1 AND alive_until < ?", (now,))
        if conn.execute(_PRUNE_EVENTS, (now - self._opts.retention,)).rowcount:
            conn.execute(_PRUNE_ORPHAN_CLAIMS)

    def _join_job(
        self, conn: sqlite3.Connection, topic: bytes, name: bytes | None
    ) -> tuple[int, int]:
        private = name is None
        if name is None:
            name = b"\0fan-out\0" + uuid.uuid4().bytes
        with self._write(conn):
            conn.execute(
                "INSERT OR IGNORE INTO tenure_groups (topic, name, cursor, private, alive_until) "
                "VALUES (?, ?, (SELECT coalesce(max(id), 0) FROM tenure_events), ?, ?)",
                (topic, name, int(private), time.time() + self._alive_for),
            )
            gid, cursor = conn.execute(
                "SELECT id, cursor FROM tenure_groups WHERE topic = ? AND name = ?", (topic, name)
            ).fetchone()
        return gid, cursor

    def _fetch_job(
        self, conn: sqlite3.Connection, gid: int, topic: bytes
    ) -> tuple[list[tuple[int, int, str]], int, list[tuple[int, int]]]:
        """Claim due redeliveries and new events for group ``gid``.

        Returns (claimed (id, attempt, body), the group's cursor, dropped (id, attempts)).
        A read-only look comes first so that spurious wake-ups cost no write.
        """
        now = time.time()
        row = conn.execute("SELECT cursor FROM tenure_groups WHERE id = ?", (gid,)).fetchone()
        if row is None:
            raise _Gone
        top = conn.execute(
            "SELECT coalesce(max(id), 0) FROM tenure_events WHERE topic = ?", (topic,)
        ).fetchone()[0]
        due = conn.execute(
            "SELECT 1 FROM tenure_pending WHERE group_id = ? AND visible_at <= ? LIMIT 1",
            (gid, now),
        ).fetchone()
        if top <= row[0] and due is None:
            return [], max(row[0], top), []
        claimed: list[tuple[int, int, str]] = []
        dropped: list[tuple[int, int]] = []
        visible = now + self._opts.visibility_timeout
        with self._write(conn):
            row = conn.execute("SELECT cursor FROM tenure_groups WHERE id = ?", (gid,)).fetchone()
            if row is None:
                raise _Gone
            cursor: int = row[0]
            for event_id, attempt, body in conn.execute(
                "SELECT p.event_id, p.attempt, e.body FROM tenure_pending AS p "
                "LEFT JOIN tenure_events AS e ON e.id = p.event_id "
                "WHERE p.group_id = ? AND p.visible_at <= ? ORDER BY p.event_id LIMIT ?",
                (gid, now, _BATCH),
            ).fetchall():
                if body is None or attempt >= self._opts.max_attempts:
                    conn.execute(
                        "DELETE FROM tenure_pending WHERE group_id = ? AND event_id = ?",
                        (gid, event_id),
                    )
                    if body is not None:
                        dropped.append((event_id, attempt))
                    continue
                conn.execute(
                    "UPDATE tenure_pending SET attempt = ?, visible_at = ?, consumer = ? "
                    "WHERE group_id = ? AND event_id = ?",
                    (attempt + 1, visible, self._consumer, gid, event_id),
                )
                claimed.append((event_id, attempt + 1, body))
            room = _BATCH - len(claimed)
            if room > 0:
                fresh = conn.execute(
                    "SELECT id, body FROM tenure_events WHERE topic = ? AND id > ? ORDER BY id LIMIT ?",
                    (topic, cursor, room),
                ).fetchall()
                if fresh:
                    conn.executemany(
                        "INSERT OR REPLACE INTO tenure_pending "
                        "(group_id, event_id, attempt, visible_at, consumer) VALUES (?, ?, 1, ?, ?)",
                        [(gid, event_id, visible, self._consumer) for event_id, _ in fresh],
                    )
                    cursor = fresh[-1][0]
                    conn.execute("UPDATE tenure_groups SET cursor = ? WHERE id = ?", (cursor, gid))
                    claimed.extend((event_id, 1, body) for event_id, body in fresh)
        return claimed, cursor, dropped

    def _settle_job(self, conn: sqlite3.Connection) -> None:
        """Write the queued acknowledgements (attempt None) and failed attempts."""
        batch: list[tuple[int, int, int | None]] = []
        while self._acks and len(batch) < 1000:
            batch.append(self._acks.popleft())
        if not batch:
            return
        visible = time.time() + self._opts.visibility_timeout
        with self._write(conn):
            for gid, event_id, attempt in batch:
                if attempt is None:
                    conn.execute(
                        "DELETE FROM tenure_pending WHERE group_id = ? AND event_id = ?",
                        (gid, event_id),
                    )
                else:
                    conn.execute(
                        "UPDATE tenure_pending SET attempt = ?, visible_at = ? "
                        "WHERE group_id = ? AND event_id = ?",
                        (attempt, visible, gid, event_id),
                    )

    def _heartbeat_job(
        self, conn: sqlite3.Connection, held: list[tuple[int, int]], gids: list[int], prune: bool
    ) -> None:
        now = time.time()
        with self._write(conn):
            conn.executemany(
                "UPDATE tenure_pending SET visible_at = ? "
                "WHERE group_id = ? AND event_id = ? AND consumer = ?",
                [(now + self._opts.visibility_timeout, g, e, self._consumer) for g, e in held],
            )
            conn.executemany(
                "UPDATE tenure_groups SET alive_until = ? WHERE id = ?",
                [(now + self._alive_for, g) for g in gids],
            )
            if prune:
                self._prune(conn, now)

    def _leave_job(
        self, conn: sqlite3.Connection, gid: int, private: bool, unfinished: list[tuple[int, int]]
    ) -> None:
        """Give up group ``gid``: forget a private group, hand back a named group's claims."""
        with self._write(conn):
            if private:
                conn.execute("DELETE FROM tenure_pending WHERE group_id = ?", (gid,))
                conn.execute("DELETE FROM tenure_groups WHERE id = ?", (gid,))
            else:
                # Visible to the other members at once; the attempt they never made is not counted.
                conn.executemany(
                    "UPDATE tenure_pending SET attempt = ?, visible_at = 0, consumer = NULL "
                    "WHERE group_id = ? AND event_id = ? AND consumer = ?",
                    [(attempt, gid, e, self._consumer) for e, attempt in unfinished],
                )

    def _topic_tops_job(self, conn: sqlite3.Connection, topics: list[bytes]) -> dict[bytes, int]:
        conn.execute("BEGIN")
        tops = {
            t: conn.execute(
                "SELECT coalesce(max(id), 0) FROM tenure_events WHERE topic = ?", (t,)
            ).fetchone()[0]
            for t in topics
        }
        conn.execute("COMMIT")
        return tops

    def _max_event_job(self, conn: sqlite3.Connection) -> int:
        value: int = conn.execute("SELECT coalesce(max(id), 0) FROM tenure_events").fetchone()[0]
        return value

    # -- pub/sub: the contract ----------------------------------------------------------------

    async def publish(self, topic: str, event: Event) -> Event:
        """Append ``event`` to the log; stored only if ``topic`` has a consumer group."""
        check_name(topic, "topic")
        event = prepare_event(event)
        self._check_open()
        assert event.created_at is not None
        await self._run(self._publish_job, topic.encode(), event.to_json(), event.created_at)
        for group in self._topics.get(topic, {}).values():
            group.wake.set()
        return event

    async def subscribe(self, topic: str, callback: Callback, *, group: str | None = None) -> None:
        """Deliver events published on ``topic`` from now on to ``callback``.

        With ``group``, join that durable group (created at the log's current end
        if it does not exist yet, in any process); members compete for its events.
        """
        check_name(topic, "topic")
        check_callback(callback)
        check_group(group)
        self._check_open()
        groups = self._topics.setdefault(topic, {})
        if any(callback in g.workers for g in groups.values()):
            raise InvalidArgument(f"callback is already subscribed to topic {topic!r}")
        slot: str | Callback = callback if group is None else group
        target = groups.get(slot)
        loop = asyncio.get_running_loop()
        if target is None:
            try:
                if self._last_event_id is None:
                    self._last_event_id = await self._run(self._max_event_job)
                gid, cursor = await self._run(
                    self._join_job, topic.encode(), None if group is None else group.encode()
                )
            except BaseException:
                if not groups:
                    del self._topics[topic]
                raise
            target = groups.get(slot)  # another subscribe may have won while we waited
            if target is None:
                target = groups[slot] = _Group(topic, group, gid, cursor)
                target.fetcher = loop.create_task(
                    self._fetch_loop(target), name=f"tenure-sqlite-fetch-{topic}"
                )
            elif group is None:  # the same callback subscribed twice at once
                await self._run(self._leave_job, gid, True, [])
                raise InvalidArgument(f"callback is already subscribed to topic {topic!r}")
        if callback in target.workers:
            raise InvalidArgument(f"callback is already subscribed to topic {topic!r}")
        target.workers[callback] = loop.create_task(
            self._deliver(target, callback), name=f"tenure-sqlite-{topic}"
        )
        target.wake.set()
        self._update_polling()
        if self._maintenance_task is None or self._maintenance_task.done():
            self._maintenance_task = loop.create_task(
                self._maintain(), name="tenure-sqlite-maintenance"
            )

    async def unsubscribe(self, topic: str, callback: Callback) -> None:
        check_name(topic, "topic")
        self._check_open()
        groups = self._topics.get(topic, {})
        for slot, target in list(groups.items()):
            task = target.workers.pop(callback, None)
            if task is None:
                continue
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if not target.workers:
                del groups[slot]
                await self._leave(target)
        if not groups:
            self._topics.pop(topic, None)
        self._update_polling()

    async def _leave(self, target: _Group) -> None:
        if target.fetcher is not None:
            target.fetcher.cancel()
            await asyncio.gather(target.fetcher, return_exceptions=True)
        unfinished: list[tuple[int, int]] = []
        while not target.queue.empty():
            event_id, event = target.queue.get_nowait()
            unfinished.append((event_id, event.attempt - 1))
        await self._run(self._leave_job, target.gid, target.private, unfinished)

    async def flush(self) -> None:
        """Wait until this instance's subscribers have handled what was published so far.

        Exactly: for every topic with a local subscriber, the newest event of
        that topic committed before the call (by any process) is looked up;
        the call returns once each local group's cursor has reached it (its
        events are claimed, by this instance or by another process's member of
        the same group) and every event this instance claimed and queued by
        then has been handled (its callback returned, or raised its last
        allowed time). Events another process claimed, and redeliveries not yet
        due (``visibility_timeout``), are not waited for. Acknowledgements are
        written shortly after, in batches.
        """
        self._check_open()
        groups = [g for gs in self._topics.values() for g in gs.values()]
        if not groups:
            return
        tops = await self._run(self._topic_tops_job, [t.encode() for t in self._topics])
        for group in groups:
            top = tops.get(group.topic.encode(), 0)
            while group.cursor < top and group.fetcher is not None and not group.fetcher.done():
                group.progress.clear()
                group.wake.set()
                await group.progress.wait()
            if group.workers:
                await group.queue.join()

    async def _fetch_loop(self, group: _Group) -> None:
        topic = group.topic.encode()
        while True:
            await group.wake.wait()
            group.wake.clear()
            try:
                claimed, cursor, dropped = await self._run(self._fetch_job, group.gid, topic)
            except _Gone:
                logger.warning(
                    "consumer group of topic %r was deleted by another process (this one was "
                    "silent for longer than 5 x visibility_timeout); joining again at the log's end",
                    group.topic,
                )
                try:
                    group.gid, group.cursor = await self._run(
                        self._join_job, topic, None if group.name is None else group.name.encode()
                    )
                except BackendUnavailable:
                    await asyncio.sleep(0.5)
                group.wake.set()
                continue
            except BackendUnavailable as exc:
                logger.warning("cannot fetch events of topic %r: %s", group.topic, exc)
                group.progress.set()
                await asyncio.sleep(0.5)
                group.wake.set()
                continue
            group.cursor = max(group.cursor, cursor)
            for event_id, attempts in dropped:
                logger.error(
                    "event %d of topic %r was delivered %d times without being acknowledged "
                    "(its subscribers died or raised); dropping it",
                    event_id,
                    group.topic,
                    attempts,
                )
            for event_id, attempt, body in claimed:
                group.held.add(event_id)
                group.queue.put_nowait((event_id, Event.from_json(body, attempt)))
            group.progress.set()
            if len(claimed) >= _BATCH:
                await group.queue.join()
                group.wake.set()

    async def _deliver(self, group: _Group, callback: Callback) -> None:
        queue_ = group.queue
        max_attempts = self._opts.max_attempts
        while True:
            event_id, event = await queue_.get()
            try:
                await callback(event)
            except asyncio.CancelledError:
                # Unsubscribed mid-delivery: hand the event to another member.
                queue_.put_nowait((event_id, event))
                raise
            except Exception:
                if event.attempt < max_attempts:
                    logger.warning(
                        "callback for topic %r raised on event %s (attempt %d of %d); redelivering",
                        group.topic,
                        event.id,
                        event.attempt,
                        max_attempts,
                        exc_info=True,
                    )
                    self._settle(group.gid, event_id, event.attempt + 1)
                    queue_.put_nowait((event_id, replace(event, attempt=event.attempt + 1)))
                else:
                    logger.error(
                        "callback for topic %r raised on event %s %d times; dropping it",
                        group.topic,
                        event.id,
                        event.attempt,
                        exc_info=True,
                    )
                    group.held.discard(event_id)
                    self._settle(group.gid, event_id, None)
            else:
                group.held.discard(event_id)
                self._settle(group.gid, event_id, None)
            finally:
                queue_.task_done()

    def _settle(self, gid: int, event_id: int, attempt: int | None) -> None:
        """Queue an acknowledgement (``attempt`` None) or a failed attempt; written in batches."""
        self._acks.append((gid, event_id, attempt))
        if not self._acks_running:
            self._start_settling()

    def _start_settling(self) -> None:
        self._acks_running = True
        self._acks_idle.clear()
        self._run(self._settle_job).add_done_callback(self._settled)

    def _settled(self, fut: asyncio.Future[None]) -> None:
        self._acks_running = False
        if not fut.cancelled() and fut.exception() is not None:
            # The claims stay pending and are redelivered after visibility_timeout.
            logger.warning("cannot write acknowledgements to %s: %s", self._file, fut.exception())
            self._acks.clear()
        thread = self._worker.thread
        if self._acks and thread is not None and thread.is_alive():
            self._start_settling()
        else:
            self._acks_idle.set()

    async def _maintain(self) -> None:
        """While there are subscribers: look for due redeliveries, keep claims alive, prune."""
        vt = self._opts.visibility_timeout
        tick = min(0.5, vt / 4)
        next_heartbeat = time.monotonic() + vt / 3
        next_prune = time.monotonic() + self._opts.prune_interval
        while self._topics:
            await asyncio.sleep(tick)
            groups = [g for gs in self._topics.values() for g in gs.values()]
            for group in groups:
                group.wake.set()
            now = time.monotonic()
            if now >= next_heartbeat or now >= next_prune:
                next_heartbeat = now + vt / 3
                prune = now >= next_prune
                if prune:
                    next_prune = now + self._opts.prune_interval
                try:
                    await self._run(
                        self._heartbeat_job,
                        [(g.gid, e) for g in groups for e in g.held],
                        [g.gid for g in groups],
                        prune,
                    )
                except BackendUnavailable as exc:
                    logger.warning("cannot extend claims in %s: %s", self._file, exc)

    # -- closing -----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop delivery, hand back claimed events, stop the thread; later calls raise ``BackendClosed``."""
        if self._closed:
            return
        self._closed = True
        background = [t for t in (self._maintenance_task, self._refresh_task) if t is not None]
        groups = [g for gs in self._topics.values() for g in gs.values()]
        self._topics.clear()
        for task in background:
            task.cancel()
        workers = [t for g in groups for t in g.workers.values()]
        for task in workers:
            task.cancel()
        await asyncio.gather(*background, *workers, return_exceptions=True)
        self._waiters.wake_all()
        if self._worker.thread is None:
            return
        try:
            for group in groups:
                await self._leave(group)
            await self._acks_idle.wait()
        except BackendUnavailable as exc:
            logger.warning("could not hand back claimed events on close: %s", exc)
        finally:
            await self._worker.stop()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        worker = getattr(self, "_worker", None)
        if getattr(self, "_closed", True) or worker is None or worker.thread is None:
            return
        worker.stop_soon()
        _warn(f"unclosed {self!r}: its thread was stopped", ResourceWarning, stacklevel=1)


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
