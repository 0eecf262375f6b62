"""``SqlitePubSub``: the lease half and the event half on one worker-thread connection."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sqlite3
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from ..._contract import Capability
from ..._doctor import Finding
from ..._errors import BackendUnavailable, ConfigurationError
from ..._output import OutputStore
from ..._url_options import parse_query, redact_url, to_bool
from .._core import LEASE_CAPABILITIES
from ._connection import SYNCHRONOUS, Options, Worker, execute_chunked, load_sql
from ._events import SqliteEvents
from ._leases import SqliteLeases, encode_many
from ._wake import FREED, PUBLISHED, TRANSFERRED

__all__ = ["SqlitePubSub"]

logger = logging.getLogger("tenure.sqlite")

_CHECK_LEASES = load_sql("lease_check_many")
_EVENTS_AFTER = load_sql("event_tops_after")

_OPTION_NAMES: Final = frozenset(Options.__dataclass_fields__)
# The URL's query values stay text here; the constructor converts them, as it
# does keyword values, so both are checked and reported the same way.
_URL_OPTIONS: Final = dict.fromkeys(_OPTION_NAMES, str)


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
        if name == "create_dirs":
            if isinstance(value, str):
                return to_bool(value)
            if not isinstance(value, bool):
                raise TypeError
            return value
        if name == "synchronous":
            if not isinstance(value, str) or value.lower() not in SYNCHRONOUS:
                raise ValueError
            return value.lower()
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError
        seconds = float(value)
        low_ok = seconds >= 0 if name == "group_retention" else seconds > 0
        if not (low_ok and seconds < math.inf):
            raise ValueError
        return seconds
    except (TypeError, ValueError):
        expected = {
            "busy_timeout_ms": "an int >= 0 (milliseconds)",
            "max_attempts": "an int >= 1",
            "synchronous": "'normal' or 'full'",
            "create_dirs": "true or false",
            "group_retention": "a finite number of seconds >= 0 (0: off)",
        }.get(name, "a finite number of seconds > 0")
        raise ConfigurationError(
            f"sqlite option {name} must be {expected}, got {value!r}"
        ) from None


def _from_url(url: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The path and the options a ``sqlite://`` URL gives (see ``from_url``)."""
    if not isinstance(url, str):
        raise ConfigurationError(f"url must be a str, got {type(url).__name__}")
    path = _path_from_url(url)
    query = parse_query(url, _URL_OPTIONS, what="sqlite").ours
    for name in options:
        if name in query:
            raise ConfigurationError(f"sqlite option {name!r} is given in the URL and as a keyword")
    return path, query


def _path_from_url(url: str) -> str:
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigurationError(f"cannot parse the sqlite URL {shown!r}") from None
    if parts.scheme.lower() != "sqlite":
        raise ConfigurationError(f"not a sqlite:// URL: {shown!r}")
    if parts.netloc:
        raise ConfigurationError(
            f"sqlite URLs take no host: use sqlite:///relative.db or sqlite:////absolute.db, got {shown!r}"
        )
    if parts.fragment:
        raise ConfigurationError(f"sqlite URLs take no fragment, got {shown!r}")
    # urlsplit keeps the slash that ends the empty host: '/x.db' is relative,
    # '//abs/x.db' (four slashes in the URL) is absolute.
    path = unquote(parts.path)[1:]
    if not path or path.endswith("/"):
        raise ConfigurationError(f"sqlite URL names no database file: {shown!r}")
    if path == ":memory:" or path.startswith("file:"):
        raise ConfigurationError(
            "sqlite:// needs a file that processes can share; use memory:// for one process"
        )
    return path


def _look(
    conn: sqlite3.Connection,
    worker: Worker,
    clock: Callable[[], float],
    keys: list[bytes],
    after_event: int | None,
) -> tuple[dict[bytes, int | None], list[tuple[bytes, int]]]:
    """On the worker thread: the live token of each of ``keys`` (``None``: free),
    and the topics with events after ``after_event`` (with the newest id), in one snapshot."""
    states: dict[bytes, int | None] = dict.fromkeys(keys)
    # Read before the snapshot starts: a commit after it changes the
    # number again, so the next poll does not skip it.
    worker.data_version = conn.execute("PRAGMA data_version").fetchone()[0]
    conn.execute("BEGIN")  # one snapshot for everything read below
    now = clock()
    rows = execute_chunked(conn, _CHECK_LEASES, keys)
    states.update({k: token for k, token, deadline in rows if deadline > now})
    topics: list[tuple[bytes, int]] = []
    if after_event is not None:
        topics = conn.execute(_EVENTS_AFTER, (after_event,)).fetchall()
    conn.execute("COMMIT")
    return states, topics


class SqlitePubSub(SqliteLeases, SqliteEvents):
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

    **Waiting.** ``wait_lease_released``: a release or transfer by this
    instance wakes one local waiter at once; one by another instance, in any
    process, wakes one local waiter as soon as its wake-up datagram arrives
    (see below), at the latest at the next safety poll.

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
    (default 10), and any event stored more than ``retention`` ago (default 7
    days; counted from when the log stored it, not from its ``created_at``, so a
    replayed old event is delivered) is pruned even if unacknowledged, so the
    file does not grow without bound.

    **Group retention.** Named groups are kept for good by default: a drained
    group is one row, so a runtime's thread leaves one behind. With
    ``group_retention`` (seconds, default 0: off), the prune (every
    ``prune_interval``) also deletes a named group that has had no live member
    for that long (none subscribed, in any process: a member's heartbeat, and
    each join, keep it alive for ``5 * visibility_timeout``), has read every
    event of its topic and holds no claim. Its events go with it at the same
    prune. A group subscribed to after that is made anew at the log's end, and
    a publish while the topic has no group is not stored, as for any topic
    without a group; :attr:`forgets_idle_groups` says so, and the thread runtime
    then stores a signal only once a session of its thread has joined the
    group. A process stopped (not heart-beating) for ``5 * visibility_timeout``
    plus ``group_retention`` joins again at the log's end, as a fan-out
    subscriber does. Once an instance with ``group_retention`` had a
    subscriber, it prunes every ``prune_interval`` until closed, subscribers or
    not; publishes prune too. Do not set it while processes of a version
    before it use the file: their joins do not refresh a group's liveness.

    **Deduplication** (``DEDUPE``). A publish whose caller set ``event.id``
    stores nothing if the topic's log still keeps an event with that id, and
    returns that first event (same id, ``created_at`` and data). The check is a
    unique index on (topic, id), inside the publishing transaction, so two
    concurrent publishes of one id, from any processes, store one event. Such
    events are kept (even acknowledged) for ``dedupe_window`` seconds after
    they were stored (default 24 hours; at most ``retention``; removed by the
    first prune after that), so a retry within that window is recognised. An
    event that was not stored (its topic had no group) is not remembered.
    Events without a caller id cost nothing more: they are not in the index.

    **Reclaim** (``RECLAIM``). ``reclaim(topic, group)`` makes every event of
    the named ``group`` that a member took (delivered or queued in that
    member's process) and has not acknowledged claimable at once, without
    waiting for ``visibility_timeout``; one write transaction. The next fetch
    of any member takes such claims before new events, oldest first, as one
    more attempt (``attempt`` = deliveries so far + 1; the ``max_attempts``
    limit counts it). Returns how many; 0 if the topic or group does not exist.
    Members of this instance fetch at once; members in other processes at
    their next maintenance tick (at most ``min(0.5, visibility_timeout / 4)``
    seconds). Every acknowledgement or failure names the delivery (consumer
    and attempt) it settles, so one from a reclaimed delivery that ends late
    changes nothing: the event is not lost and is delivered once more, to
    the member that fetches it. A reclaimed member that is still alive stops
    delivering the events it had queued but not started as soon as it notices
    (at once in the reclaiming instance, at its next heartbeat, every
    ``visibility_timeout / 3``, in another process); meant for a sole consumer
    elected by a lease, whose predecessor is dead or has lost the lease.

    **Backlog** (``BACKLOG``). ``backlog(prefix, group)`` lists the topics
    starting with ``prefix`` whose ``group`` has events published after the
    group was created and not yet taken, or taken and not acknowledged, in
    one read (one snapshot: every event committed before the call counts; a
    topic that drained meanwhile may be listed). Cost: one search of an index
    that holds only groups with unread events (a trigger keeps each group's
    newest event id), plus one pass over the claims in flight of all groups;
    idle topics and their groups cost nothing.

    **Fenced takes** (``FENCED_TAKES``). ``subscribe(..., fence=LeaseFence(key,
    owner_prefix))``: each fetch of that subscription checks, inside its write
    transaction, that the lease ``key`` is live (on the lease clock) and held
    by an owner with that prefix, and takes nothing otherwise; a subscriber
    whose lease expired cannot take what the next holder reclaimed. The thread
    runtime subscribes this way.

    **Change detection.** SQLite has no notifications, so the instances of a
    file tell each other (:class:`~tenure.backends.sqlite._wake.WakeChannel`):
    while an instance has subscribers or lease waiters it listens on a
    Unix-domain datagram socket in ``<file>.tenure-wake/``, and every instance
    that commits a release, transfer, revoke or publish sends the key or topic
    to every such socket right after the commit. The receiving event loop wakes
    the key's waiter or the topic's subscribers at once: no polling, no thread
    woken while idle. A socket left by a killed process is removed by the
    first sender that finds it dead. Behind that, the worker thread reads
    ``PRAGMA data_version`` (it changes when another connection commits) every
    ``max(0.5, poll_interval)`` seconds, a safety poll that catches a datagram
    dropped because a receiver's queue was full (so a wake-up is late, never
    lost). Where the sockets cannot be used (a socket path longer than the
    107 bytes an address holds, a directory that cannot be created or written,
    no ``AF_UNIX``), that is logged once per file at WARNING and the thread
    polls every ``poll_interval`` seconds (default 0.01) instead, as before:
    changes are then noticed within about ``poll_interval`` plus one
    transaction, for about 1 to 2 percent of one core per idle subscriber
    (``benchmarks/sqlite.py`` measures both). With no subscriber and no waiter
    nothing listens and the thread sleeps until the next operation.

    **Default.** ``tenure.from_url()`` with no URL and no ``TENURE_URL``
    environment variable opens ``$XDG_DATA_HOME/tenure/tenure.db`` (by default
    ``~/.local/share/tenure/tenure.db``), creating the directory on first use,
    so every process of the user on the host shares it.

    Options (keyword arguments or URL query parameters): ``busy_timeout_ms``,
    ``visibility_timeout``, ``max_attempts``, ``poll_interval``,
    ``prune_interval``, ``retention``, ``dedupe_window``, ``group_retention``, ``synchronous``
    (``normal`` or ``full``), ``create_dirs`` (see :meth:`from_url`).

    **Files of earlier versions** are brought up to date by the first
    connection that opens them (a new column per table, indexes and a trigger,
    in one write transaction; ``PRAGMA user_version`` records it). Processes of
    the earlier version may keep using the file (the trigger serves their
    publishes too); their events are never deduplicated, and their pruning
    may drop the events kept for deduplication before ``dedupe_window``.
    """

    capabilities = LEASE_CAPABILITIES | Capability.RUNTIME_LOG | Capability.FENCED_TAKES

    def output_store(self) -> OutputStore:
        """A store of thread output streams on this backend (``ThreadRuntime(output=...)``)."""
        from ._output import SqliteOutput

        return SqliteOutput(self)

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
        opts = Options(**{name: _convert_option(name, v) for name, v in options.items()})
        self._path = os.fspath(path)
        if not self._path or self._path == ":memory:":
            raise ConfigurationError("SqlitePubSub needs the path of a database file")
        super().__init__()
        self._opts = opts
        self._file = os.path.abspath(self._path)
        self._clock = clock
        # The worker thread holds only a weak reference to this object, so a
        # backend dropped without aclose() is collected, warns and stops it.
        self._worker = Worker(self._file, opts, weakref.WeakMethod(self._on_external_change))
        self._init_leases()
        # A private group whose instance stops heart-beating (every
        # visibility_timeout / 3) is deleted by any instance after this long;
        # the owner writes the deadline, so instances may use different settings.
        self._init_events(uuid.uuid4().hex, 5 * opts.visibility_timeout)
        self._refresh_task: asyncio.Task[None] | None = None
        self._refresh_again = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SqlitePubSub:
        """``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``.

        After ``sqlite://`` comes an empty host and a ``/``; what follows is the
        path, relative to the working directory unless it starts with ``/``
        (SQLAlchemy's convention: three slashes for a relative path, four for
        an absolute one, so ``"sqlite:///" + "/abs/x.db"`` is absolute).
        Percent-escapes in the path are decoded. Query parameters set options
        (see the class docstring); keyword ``options`` too, plus ``clock``. An
        unknown option, an option given twice (in the query, or in the query
        and as a keyword) or a bad value raises
        :class:`~tenure.ConfigurationError`. A file whose directory does not
        exist is refused with :class:`~tenure.ConfigurationError` (a typo in
        the path would otherwise give a second, private database), unless
        ``create_dirs=1``: then missing directories are created at first use.
        """
        path, query = _from_url(url, options)
        return cls(path, **query, **options)

    async def diagnose(self) -> list[Finding]:
        """What ``tenure doctor`` reports about this file (:mod:`tenure._doctor`)."""
        from ._doctor import diagnose

        return await diagnose(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"SqlitePubSub({self._path!r}, {state})"

    @property
    def path(self) -> str:
        """The database file, as given."""
        return self._path

    # -- change detection: releases and events committed by other connections ---------

    def _update_polling(self) -> None:
        self._worker.set_polling(bool(self._topics) or len(self._waiters) > 0)

    def _on_external_change(self, messages: Sequence[bytes]) -> None:
        """Another connection committed something: wake who waits for it.

        ``messages``: the wake-up datagrams read (:mod:`._wake`), each naming a
        key freed or transferred, or a topic published to; those wake the
        key's longest-waiting waiter or the topic's groups without a look at
        the file. Without messages (a change the safety poll saw), or with one
        not understood (``LOOK``: some may have been dropped), look for
        released leases and new events.
        """
        if self._closed:
            return
        if messages and self._woken_by(messages):
            return
        if self._refresh_task is not None and not self._refresh_task.done():
            self._refresh_again = True
            return
        self._refresh_task = asyncio.get_running_loop().create_task(
            self._refresh(), name="tenure-sqlite-refresh"
        )

    def _woken_by(self, messages: Sequence[bytes]) -> bool:
        """Act on each datagram; ``False`` if one was not understood."""
        understood = True
        for message in messages:
            what, name = message[:1], message[1:].decode("utf-8", "replace")
            if what and what[0] == PUBLISHED:
                self._wake(name)
            elif what and what[0] in (FREED, TRANSFERRED):
                if self._waiters.wake_one(name) and name in self._watched:
                    # What a look would now find, so the next one wakes nobody
                    # else for this change: free, or an owner not seen yet.
                    if what[0] == FREED:
                        self._watched[name] = None
                    else:
                        del self._watched[name]
            else:
                understood = False
        return understood

    async def _refresh(self) -> None:
        while True:
            self._refresh_again = False
            waited = self._waiters.keys()
            for stale in set(self._watched) - set(waited):
                del self._watched[stale]
            try:
                states, topics = await self._run(
                    _look, self._worker, self._clock, encode_many(waited), self._last_event_id
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
            self._new_events(topics)
            self._update_polling()
            if not self._refresh_again:
                return

    # -- closing -----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop delivery, hand back claimed events, stop the thread; later calls raise ``BackendClosed``."""
        if self._closed:
            return
        self._closed = True
        if self._refresh_task is not None:
            self._refresh_task.cancel()
        groups = await self._stop_events()
        if self._refresh_task is not None:
            await asyncio.gather(self._refresh_task, return_exceptions=True)
        self._waiters.wake_all()
        if self._worker.thread is None:
            await self._worker.stop()
            return
        try:
            await self._hand_back(groups)
        except BackendUnavailable as exc:
            logger.warning("could not hand back claimed events on close: %s", exc)
        finally:
            await self._worker.stop()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        worker = getattr(self, "_worker", None)
        if getattr(self, "_closed", True) or worker is None:
            return
        if worker.thread is None:
            worker.wake.close_soon()
            return
        worker.stop_soon()
        _warn(f"unclosed {self!r}: its thread was stopped", ResourceWarning, stacklevel=1)
