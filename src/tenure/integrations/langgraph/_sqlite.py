"""LangGraph's SQLite savers, fenced: the check runs just before the write's commit.

Both savers end every write with a commit on their connection, after its
statements (the async one on ``self.conn``, the sync one at the end of
``self.cursor()``). SQLite lets one writer at a time hold the database from a
transaction's first write to its commit, so a check made just before the
commit sees every write committed before and keeps out every later one.

A write cancelled between its statements and its commit leaves them in the
connection's open transaction; each fenced write rolls such leftovers back
before its own first statement (or its commit, for a claim), so the next
commit, checked for its own token, never carries a stale one's rows.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import aiosqlite
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from ...fencing import SqlFence
from ._fence import PENDING, Pending, fence_writes, no_fence

__all__ = ["FencedAsyncSqliteSaver", "FencedSqliteSaver"]

# A run's checkpoints (by their metadata's run_id) and their writes, in one thread.
_OF_RUN = (
    "SELECT checkpoint_ns, checkpoint_id FROM checkpoints WHERE thread_id = ?1 "
    "AND json_extract(CAST(metadata AS TEXT), '$.run_id') = ?2"
)
DELETE_FOR_RUN = (
    f"DELETE FROM writes WHERE thread_id = ?1 AND (checkpoint_ns, checkpoint_id) IN ({_OF_RUN})",
    "DELETE FROM checkpoints WHERE thread_id = ?1 "
    "AND json_extract(CAST(metadata AS TEXT), '$.run_id') = ?2",
)


# What a write's first statement goes through on aiosqlite's connection, and
# the arguments of each, in order (aiosqlite's signatures).
_STATEMENTS: dict[str, tuple[str, ...]] = {
    "execute": ("sql", "parameters"),
    "executemany": ("sql", "parameters"),
    "executescript": ("sql_script",),
    "cursor": (),
}


def _roll_back_leftovers(raw: sqlite3.Connection) -> None:
    if raw.in_transaction:
        raw.rollback()


def _leftovers_then(raw: sqlite3.Connection, name: str, args: list[Any]) -> sqlite3.Cursor:
    """On aiosqlite's thread: roll back what an earlier write left open, then run
    the sqlite3 method ``name`` (one hop for both)."""
    _roll_back_leftovers(raw)
    return cast(sqlite3.Cursor, getattr(raw, name)(*args))


class _AfterLeftovers:
    """A fenced write's first statement (``conn.execute(...)`` and the like, awaited
    or entered), once a transaction that an earlier write left open is rolled back.

    A write cancelled between its statements and its commit (a run cancelled on
    losing its lease) leaves them in the connection's open transaction, and the
    next write's commit, checked for that write's token only, would commit them
    too: a stale run's checkpoint stored after its successor's. The roll-back
    runs on aiosqlite's thread, after any statement still queued there, in the
    same hop as the statement (where its private ``_execute`` and ``_conn`` are
    there to do it; otherwise in a hop of its own).
    """

    def __init__(
        self, conn: aiosqlite.Connection, name: str, one_hop: bool, *args: Any, **kwargs: Any
    ) -> None:
        self._conn = conn
        self._name = name
        self._one_hop = one_hop
        self._args = args
        self._kwargs = kwargs
        self._cursor: aiosqlite.Cursor | None = None

    async def clean(self) -> None:
        raw: sqlite3.Connection | None = getattr(self._conn, "_conn", None)
        execute = getattr(self._conn, "_execute", None)
        if raw is not None and execute is not None:
            await execute(_roll_back_leftovers, raw)
        elif self._conn.in_transaction:
            await self._conn.rollback()

    async def _run(self) -> aiosqlite.Cursor:
        raw: sqlite3.Connection | None = getattr(self._conn, "_conn", None)
        execute = getattr(self._conn, "_execute", None)
        if self._one_hop and raw is not None and execute is not None:
            cursor = await execute(_leftovers_then, raw, self._name, self._positional())
            return aiosqlite.Cursor(self._conn, cursor)
        await self.clean()
        method = getattr(self._conn, self._name)
        return cast(aiosqlite.Cursor, await method(*self._args, **self._kwargs))

    def _positional(self) -> list[Any]:
        """The call's arguments in order, as aiosqlite passes them to sqlite3."""
        names = _STATEMENTS[self._name]
        args = list(self._args)
        args.extend(self._kwargs.get(name) for name in names[len(args) :])
        if self._name == "execute" and args[1] is None:
            args[1] = []  # aiosqlite's default
        return args

    def __await__(self) -> Any:
        return self._run().__await__()

    async def __aenter__(self) -> aiosqlite.Cursor:
        self._cursor = await self._run()
        return self._cursor

    async def __aexit__(self, *exc: object) -> None:
        if self._cursor is not None:  # as aiosqlite's own context manager does
            await self._cursor.close()


class _CheckedCommit:
    """An aiosqlite connection whose ``commit`` first runs the pending write's check.

    Everything else is the connection's own. The check and the commit go to
    aiosqlite's thread together, in one hop, where its private ``_execute``
    and ``_conn`` are there to do it (each hop costs about as much as a
    statement); otherwise the check takes a hop of its own.
    """

    one_hop = True

    def __init__(self, conn: aiosqlite.Connection, fence: SqlFence) -> None:
        self._conn = conn
        self._fence = fence

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._conn, name)
        pending = PENDING.get()
        if name in _STATEMENTS and pending is not None and not pending.started:
            pending.started = True
            return functools.partial(_AfterLeftovers, self._conn, name, self.one_hop)
        return attr

    def __await__(self) -> Any:
        return self._conn.__await__()

    async def commit(self) -> None:
        pending = PENDING.get()
        if pending is None:
            await self._conn.commit()
            return
        # A write of no statement of its own (a claim) cleans up before its check.
        clean, pending.started = not pending.started, True
        execute = getattr(self._conn, "_execute", None)
        if self.one_hop and execute is not None and hasattr(type(self._conn), "_conn"):
            await execute(self._check_and_commit, pending, clean)
            return
        if clean:
            await _AfterLeftovers(self._conn, "cursor", False).clean()
        try:
            for key in pending.keys:
                await self._fence.acheck(self._conn, key, pending.token)
        except BaseException:
            await self._conn.rollback()
            raise
        pending.checked = True
        await self._conn.commit()

    def _check_and_commit(self, pending: Pending, clean: bool) -> None:
        """On aiosqlite's thread, with its sqlite3 connection."""
        raw = self._conn._conn
        if clean:
            _roll_back_leftovers(raw)
        try:
            for key in pending.keys:
                self._fence.check(raw, key, pending.token)
        except BaseException:
            raw.rollback()
            raise
        pending.checked = True
        raw.commit()


@fence_writes
class FencedAsyncSqliteSaver(AsyncSqliteSaver):
    """:class:`~langgraph.checkpoint.sqlite.aio.AsyncSqliteSaver` with fenced writes.

    Constructed like it (``FencedAsyncSqliteSaver(conn)``,
    ``FencedAsyncSqliteSaver.from_conn_string(path)``); ``fence`` names the
    table of tokens (default :class:`~tenure.fencing.SqlFence()`, in the same
    database). Every write (``aput``, ``aput_writes``, ``adelete_thread`` and
    their sync bridges) is refused with :class:`~tenure.fencing.FenceRefused`,
    and nothing of it applied, when its token is lower than the highest that
    has written the thread, or missing. The token comes from
    ``config["configurable"]["fencing_token"]``, else from
    :func:`~tenure.integrations.langgraph.fencing_token`.
    """

    def __init__(
        self,
        conn: aiosqlite.Connection,
        *,
        serde: SerializerProtocol | None = None,
        fence: SqlFence | None = None,
    ) -> None:
        self.fence = fence or SqlFence()
        self._raw_conn = conn
        super().__init__(cast(aiosqlite.Connection, _CheckedCommit(conn, self.fence)), serde=serde)
        self._fence_ready = False

    async def setup(self) -> None:
        with no_fence():
            await super().setup()
            if not self._fence_ready:
                async with self.lock:
                    await self.fence.asetup(self._raw_conn)
                self._fence_ready = True

    async def aclaim_thread(self, thread_id: str) -> None:
        """Record the current token (:func:`~tenure.integrations.langgraph.fencing_token`)
        as the highest that has written ``thread_id``, writing nothing else, or
        raise :class:`~tenure.fencing.FenceRefused` if a higher one has.

        A new owner calls it before it reads the thread's state: from then on a
        stale owner's writes are refused, even before the new owner's first
        checkpoint (else one written between that read and that checkpoint
        would fork the thread's history). :func:`graph_handler` calls it at
        the start of every run."""
        await self.setup()
        async with self.lock:
            await self.conn.commit()  # the pending fence's check, and its commit

    async def adelete_for_run(self, thread_id: str, run_id: str) -> None:
        """Delete the checkpoints of ``thread_id`` whose metadata ``run_id`` is
        ``run_id``, with their writes: ``adelete_for_runs`` within one thread, so
        that it is fenced like the thread's other writes (the token comes from
        :func:`~tenure.integrations.langgraph.fencing_token`)."""
        async with self.lock, self.conn.cursor() as cur:
            for statement in DELETE_FOR_RUN:
                await cur.execute(statement, (str(thread_id), str(run_id)))
            await self.conn.commit()


@fence_writes
class FencedSqliteSaver(SqliteSaver):
    """:class:`~langgraph.checkpoint.sqlite.SqliteSaver` with fenced writes.

    Constructed like it (``FencedSqliteSaver(conn)``,
    ``FencedSqliteSaver.from_conn_string(path)``); ``fence`` as for
    :class:`FencedAsyncSqliteSaver`. Every write (``put``, ``put_writes``,
    ``delete_thread``) is refused, and nothing of it applied, when its token is
    lower than the highest that has written the thread, or missing.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        serde: SerializerProtocol | None = None,
        fence: SqlFence | None = None,
    ) -> None:
        self.fence = fence or SqlFence()
        super().__init__(conn, serde=serde)
        self._fence_ready = False

    def setup(self) -> None:
        with no_fence():
            super().setup()
            if not self._fence_ready:
                self.fence.setup(self.conn)
                self._fence_ready = True

    def claim_thread(self, thread_id: str) -> None:
        """As :meth:`FencedAsyncSqliteSaver.aclaim_thread`."""
        with self.cursor():
            pass  # the pending fence's check, and its commit

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        with super().cursor(transaction) as cur:
            yield cur
            pending = PENDING.get()
            if transaction and pending is not None:
                try:
                    for key in pending.keys:
                        self.fence.check(self.conn, key, pending.token)
                except BaseException:
                    self.conn.rollback()  # the commit that follows then commits nothing
                    raise
                pending.checked = True
