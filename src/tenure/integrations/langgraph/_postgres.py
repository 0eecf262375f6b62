"""LangGraph's PostgreSQL savers, fenced: the check is the last statement of the
write's own pipeline.

The savers run each write's statements through ``_cursor(pipeline=True)``: in
one pipeline (one implicit transaction up to its sync), or in a transaction
where the server has no pipeline mode. The check joins them there, so it costs
no round trip of its own; a refusal is an error raised by the server, which
aborts the statements before it, and the saver's exit from the pipeline raises
it. The check locks the thread's row in the fence table until the commit, so
fenced writes of one thread commit in the order of their tokens. The price:
a writer stopped between its check and its pipeline's sync (a pause in those
few lines of Python) keeps the row locked, and the thread's next owner waits
until it resumes (its write, checked first, then commits first) or its
connection closes.

A write whose block ends early (its run cancelled when the lease was lost,
or any error) has sent some of its statements and not the check. psycopg
syncs a pipeline however its block ends, and the sync would commit them,
unchecked: the wrapper sends a statement that fails after them instead, and
syncs, so that the server aborts the write whole (:data:`ABANDON`).

``prune`` runs its own transactions (one per thread, at an isolation level of
its choosing), into which nothing can be placed: it is fenced by a check made
on a second connection whose transaction, holding the threads' fence rows,
stays open until the prune is done. A write of a newer owner waits for it;
one that came first has recorded its token, and the prune is refused. A
write of a pruned thread through the *same* saver object while its prune
runs would wait for the prune, which waits for the saver's lock that the
write holds: prune a thread from a saver that is not writing it at the time.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import AsyncConnection, AsyncCursor, AsyncPipeline, Connection, Cursor, Pipeline
from psycopg.conninfo import make_conninfo
from psycopg.pq import PipelineStatus
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ...fencing import FenceRefused, SqlFence
from ._fence import FENCING_TOKEN, PENDING, fence_writes, no_fence

__all__ = ["FencedAsyncPostgresSaver", "FencedPostgresSaver"]

# A run's checkpoints (by their metadata's run_id) in one thread, with their
# writes, and the blobs they used that no checkpoint of another run uses.
DELETE_FOR_RUN = (
    """
    DELETE FROM checkpoint_blobs b
    USING checkpoints c CROSS JOIN LATERAL jsonb_each_text(c.checkpoint -> 'channel_versions') v
    WHERE c.thread_id = %(thread)s AND c.metadata ->> 'run_id' = %(run)s
      AND b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
      AND b.channel = v.key AND b.version = v.value
      AND NOT EXISTS (
        SELECT 1 FROM checkpoints k
        WHERE k.thread_id = c.thread_id AND k.checkpoint_ns = c.checkpoint_ns
          AND (k.metadata ->> 'run_id') IS DISTINCT FROM %(run)s
          AND k.checkpoint -> 'channel_versions' ->> v.key = v.value)
    """,
    """
    DELETE FROM checkpoint_writes w USING checkpoints c
    WHERE c.thread_id = %(thread)s AND c.metadata ->> 'run_id' = %(run)s
      AND w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
      AND w.checkpoint_id = c.checkpoint_id
    """,
    "DELETE FROM checkpoints WHERE thread_id = %(thread)s AND metadata ->> 'run_id' = %(run)s",
)


# Sent into the pipeline of a fenced write that ends before its check: it
# fails, and the server aborts the statements before it up to the sync.
ABANDON = (
    "DO $$ BEGIN RAISE EXCEPTION 'tenure: a fenced write ended before its check; "
    "nothing of it is applied'; END $$"
)


def _in_pipeline(conn: Connection[Any] | AsyncConnection[Any]) -> bool:
    return conn.pgconn.pipeline_status != PipelineStatus.OFF


async def _aabandon(cur: AsyncCursor[DictRow]) -> None:
    """Abort what a fenced write sent into its pipeline (see the module's docstring).

    Outside a pipeline (a server without pipeline mode: the saver then writes in a
    transaction), the statement fails at once and the transaction rolls back."""
    conn = cur.connection
    with contextlib.suppress(psycopg.Error):
        await cur.execute(ABANDON)
        if _in_pipeline(conn):
            async with conn.pipeline() as pipe:
                await pipe.sync()


def _abandon(cur: Cursor[DictRow]) -> None:
    """:func:`_aabandon` for the sync saver."""
    conn = cur.connection
    with contextlib.suppress(psycopg.Error):
        cur.execute(ABANDON)
        if _in_pipeline(conn):
            with conn.pipeline() as pipe:
                pipe.sync()


def _conninfo(conn: Connection[Any] | AsyncConnection[Any]) -> str:
    """How to open a second connection like ``conn`` (``info.dsn`` leaves out the password)."""
    password = conn.info.password
    return make_conninfo(conn.info.dsn, **({"password": password} if password else {}))


def _mark_checked() -> None:
    """The prune was checked on its second connection (the wrapper's pending fence)."""
    pending = PENDING.get()
    if pending is not None:
        pending.checked = True


def _prune_keys(thread_ids: Sequence[str]) -> list[str]:
    if isinstance(thread_ids, str):
        return []
    return sorted({str(t) for t in thread_ids})  # one order: two prunes cannot deadlock


@fence_writes
class FencedAsyncPostgresSaver(AsyncPostgresSaver):
    """:class:`~langgraph.checkpoint.postgres.aio.AsyncPostgresSaver` with fenced writes.

    Constructed like it (a connection or a pool, ``from_conn_string``, then
    ``await setup()``, which also creates the fence); ``fence`` names the
    table of tokens (default :class:`~tenure.fencing.SqlFence()`, in the same
    database). Every write (``aput``, ``aput_writes``, ``adelete_thread``,
    ``aprune`` and their sync bridges) is refused with
    :class:`~tenure.fencing.FenceRefused`, and nothing of it applied, when its
    token is lower than the highest that has written the thread, or missing.
    The token comes from ``config["configurable"]["fencing_token"]``, else from
    :func:`~tenure.integrations.langgraph.fencing_token`.
    """

    def __init__(
        self,
        conn: Any,
        pipe: AsyncPipeline | None = None,
        serde: SerializerProtocol | None = None,
        *,
        fence: SqlFence | None = None,
    ) -> None:
        super().__init__(conn, pipe, serde)
        self.fence = fence or SqlFence()

    async def setup(self) -> None:
        with no_fence():
            await super().setup()
            async with self._cursor(pipeline=True) as cur:
                await self.fence.asetup(cur.connection)

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[DictRow]]:
        async with super()._cursor(pipeline=pipeline) as cur:
            pending = PENDING.get() if pipeline else None
            try:
                yield cur
            except BaseException:
                if pending is not None:
                    await _aabandon(cur)
                raise
            if pending is not None:
                for key in pending.keys:
                    await self.fence.acheck(cur.connection, key, pending.token)
                pending.checked = True

    async def aclaim_thread(self, thread_id: str) -> None:
        """Record the current token as the highest that has written ``thread_id``,
        writing nothing else (as ``FencedAsyncSqliteSaver.aclaim_thread``, which
        says why), in a pipeline of its own."""
        async with self._cursor(pipeline=True):
            pass  # the pending fence's check, in a pipeline of its own

    async def adelete_for_run(self, thread_id: str, run_id: str) -> None:
        """Delete the checkpoints of ``thread_id`` whose metadata ``run_id`` is
        ``run_id``, with their writes and the blobs no other checkpoint uses:
        ``adelete_for_runs`` within one thread, in one pipeline, so that it is
        fenced like the thread's other writes (the token comes from
        :func:`~tenure.integrations.langgraph.fencing_token`)."""
        params = {"thread": str(thread_id), "run": str(run_id)}
        async with self._cursor(pipeline=True) as cur:
            for statement in DELETE_FOR_RUN:
                await cur.execute(statement, params)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        keys = _prune_keys(thread_ids)
        token = FENCING_TOKEN.get()
        if not keys:
            return await super().aprune(thread_ids, strategy=strategy)
        if token is None:
            raise FenceRefused(", ".join(keys), None, None)
        async with self._second() as conn, conn.transaction():
            for key in keys:
                await self.fence.acheck(conn, key, token)
            with no_fence():
                await super().aprune(thread_ids, strategy=strategy)
        _mark_checked()

    @asynccontextmanager
    async def _second(self) -> AsyncIterator[AsyncConnection[Any]]:
        if isinstance(self.conn, AsyncConnectionPool):
            async with self.conn.connection() as conn:
                yield conn
            return
        conn = await AsyncConnection.connect(_conninfo(self.conn), autocommit=True)
        async with conn:
            yield conn


@fence_writes
class FencedPostgresSaver(PostgresSaver):
    """:class:`~langgraph.checkpoint.postgres.PostgresSaver` with fenced writes.

    As :class:`FencedAsyncPostgresSaver`, for the sync saver: ``put``,
    ``put_writes``, ``delete_thread`` and ``prune`` are fenced.
    """

    def __init__(
        self,
        conn: Any,
        pipe: Pipeline | None = None,
        serde: SerializerProtocol | None = None,
        *,
        fence: SqlFence | None = None,
    ) -> None:
        super().__init__(conn, pipe, serde)
        self.fence = fence or SqlFence()

    def setup(self) -> None:
        with no_fence():
            super().setup()
            with self._cursor(pipeline=True) as cur:
                self.fence.setup(cur.connection)

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[Cursor[DictRow]]:
        with super()._cursor(pipeline=pipeline) as cur:
            pending = PENDING.get() if pipeline else None
            try:
                yield cur
            except BaseException:
                if pending is not None:
                    _abandon(cur)
                raise
            if pending is not None:
                for key in pending.keys:
                    self.fence.check(cur.connection, key, pending.token)
                pending.checked = True

    def claim_thread(self, thread_id: str) -> None:
        """As :meth:`FencedAsyncPostgresSaver.aclaim_thread`."""
        with self._cursor(pipeline=True):
            pass  # the pending fence's check, in a pipeline of its own

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        keys = _prune_keys(thread_ids)
        token = FENCING_TOKEN.get()
        if not keys:
            return super().prune(thread_ids, strategy=strategy)
        if token is None:
            raise FenceRefused(", ".join(keys), None, None)
        with self._second() as conn, conn.transaction():
            for key in keys:
                self.fence.check(conn, key, token)
            with no_fence():
                super().prune(thread_ids, strategy=strategy)
        _mark_checked()

    @contextmanager
    def _second(self) -> Iterator[Connection[Any]]:
        if isinstance(self.conn, ConnectionPool):
            with self.conn.connection() as conn:
                yield conn
            return
        with Connection.connect(_conninfo(self.conn), autocommit=True) as conn:
            yield conn
