"""tenure's link to one PostgreSQL database: :class:`PgConnection`.

What it is made of, one job per module: the pool and its connections'
health (``_pool``), the names and statements (``_sql``), the translation of
errors (``_errors``) and the LISTEN connection (``_listen``). This module
puts them together: first use (credentials checked directly, the tables
created), the per-call time limit, and running statements.

Other layers that work on the same database (a fenced store, say) use a
:class:`PgConnection` through :meth:`PgConnection.execute` (one statement,
pooled, time-limited, errors translated), :meth:`PgConnection.bounded` (any
awaitable under the time limit), :meth:`PgConnection.error` (the one
translation of a psycopg error) and :attr:`PgConnection.pool` (the
``psycopg_pool.AsyncConnectionPool``, for a transaction of several
statements on one connection).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..._errors import BackendClosed, BackendUnavailable, ConfigurationError, TenureError
from ._errors import PgErrors, misconfigured
from ._listen import PgListener
from ._pool import ConnectionHealth, check_settings, make_pool
from ._sql import PgNames

__all__ = ["PgConnection"]

logger = logging.getLogger("tenure.postgres")

T = TypeVar("T")
Rows = list[tuple[Any, ...]]
#: What first use runs on one connection to create the tables it needs.
Create = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]

# How long a statement past its time limit may take to be cancelled on the
# server before its connection is closed instead.
_CANCEL_GRACE = 0.05


class PgConnection:
    """The pool (made here or injected), first use, LISTEN, and error translation.

    Every call through :meth:`execute` and :meth:`listen` ends within
    ``call_timeout`` seconds: past it the caller gets
    :class:`~tenure.BackendUnavailable` (outcome unknown) at once, and the
    abandoned statement is cancelled on the server in the background (psycopg
    closes the connection if the server does not answer the cancellation).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        pool: AsyncConnectionPool[Any] | None,
        schema: str,
        table: str,
        min_size: int,
        max_size: int,
        pool_timeout: float,
        call_timeout: float,
        prepare_threshold: int | None,
        listen_conninfo: str | None,
        on_notify: Callable[[str], None],
        on_gap: Callable[[], None],
        ping_interval: float = 5.0,
        component: str = "PostgresLeaseProvider",
    ) -> None:
        self.names = PgNames(schema, table)
        self._component = component  # what is closed, for BackendClosed
        check_settings(
            conninfo=conninfo,
            min_size=min_size,
            max_size=max_size,
            pool_timeout=pool_timeout,
            call_timeout=call_timeout,
            prepare_threshold=prepare_threshold,
        )
        self.call_timeout = float(call_timeout)
        self._health = ConnectionHealth()
        self._owns_pool = pool is None
        if pool is None:
            pool = make_pool(
                conninfo,
                self._health,
                min_size=min_size,
                max_size=max_size,
                pool_timeout=pool_timeout,
                prepare_threshold=prepare_threshold,
                name=f"tenure-{self.names.schema}.{self.names.table}",
            )
        elif not isinstance(pool, AsyncConnectionPool):
            raise ConfigurationError(
                f"pool must be a psycopg_pool.AsyncConnectionPool, got {type(pool).__name__}"
            )
        elif not conninfo and isinstance(pool.conninfo, str):
            conninfo = pool.conninfo
        self.pool = pool
        self._conninfo = conninfo
        self._max_size = pool.max_size
        listen_conninfo = listen_conninfo if listen_conninfo is not None else conninfo
        self.errors = PgErrors(conninfo, listen_conninfo)
        self.closed = False
        self.opened = False
        self._ready = False
        self.events_ready = False
        self._ready_lock = asyncio.Lock()
        self.listener = self._listener(listen_conninfo, on_notify, on_gap, ping_interval)

    def _listener(
        self,
        conninfo: str,
        on_notify: Callable[[str], None],
        on_gap: Callable[[], None],
        ping_interval: float,
    ) -> PgListener:
        """The LISTEN connection, handed what it needs of this one."""
        return PgListener(
            conninfo,
            channels=(self.names.channel, self.names.event_channel),
            errors=self.errors,
            call_timeout=self.call_timeout,
            prepare=self.prepare,
            is_closed=lambda: self.closed,
            on_notify=on_notify,
            on_gap=on_gap,
            ping_interval=ping_interval,
        )

    @property
    def where(self) -> str:
        """The database, for messages: ``postgresql://user@host:port/db`` without secrets."""
        return self.errors.where

    # -- errors ----------------------------------------------------------------

    def error(self, op: str, exc: BaseException, detail: str | None = None) -> TenureError:
        """The one translation of a driver or pool error: the most specific tenure error."""
        return self.errors.error(op, exc, detail, closed=self.closed)

    async def _diagnosed(self, op: str, exc: PoolTimeout) -> TenureError:
        """Why the pool cannot connect, from one direct attempt (a pool timeout says nothing)."""
        if self.closed:
            return self.error(op, exc)
        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo)
        except psycopg.Error as failure:
            if misconfigured(failure):
                return self.error(op, failure)
            return self.error(op, exc, f"connecting directly: {str(failure).strip()}")
        await conn.close()
        return self.error(op, exc)  # the server is fine: every pooled connection was busy

    # -- the time limit ----------------------------------------------------------

    async def bounded(self, op: str, work: Coroutine[Any, Any, T]) -> T:
        """``await work``, but at most ``call_timeout`` seconds (plus a short grace).

        ``work`` runs in the caller's task (a task of its own per statement
        cost about a tenth of the sequential lease rate). Past the limit the
        task is cancelled: psycopg then asks the server to cancel the
        statement, and if that has not finished within :data:`_CANCEL_GRACE`
        (a paused server, a black hole in the network) a second cancellation
        makes psycopg close the connection instead of waiting for it. Either
        way the caller gets :class:`~tenure.BackendUnavailable` (outcome
        unknown) on time, and a cancellation from outside passes through.
        """
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        fired = 0  # how many cancellations this call requested
        second: asyncio.TimerHandle | None = None

        def cancel() -> None:
            nonlocal fired
            fired += 1
            task.cancel()

        def expire() -> None:
            nonlocal second
            cancel()
            second = loop.call_later(_CANCEL_GRACE, cancel)

        first = loop.call_later(self.call_timeout, expire)
        try:
            return await work
        except asyncio.CancelledError:
            if not fired:
                raise
            for _ in range(fired):
                task.uncancel()
            fired = 0
            if task.cancelling():
                raise  # cancelled from outside as well
            raise BackendUnavailable(
                f"PostgreSQL at {self.where}: no answer to {op} within "
                f"{self.call_timeout:g} s (outcome unknown)"
            ) from None
        finally:
            first.cancel()
            if second is not None:
                second.cancel()
            # Our cancellation was swallowed below us (the work returned or
            # raised something else: Python 3.11's asyncio.wait_for, which
            # psycopg_pool uses, can lose a cancellation that races with its
            # result). Withdraw it all the same: a request left counted makes
            # every later time limit in this task look like a cancellation
            # from outside, and a CancelledError escapes to the caller.
            for _ in range(fired):
                task.uncancel()

    # -- first use -----------------------------------------------------------------

    async def prepare(self, op: str, create: Create | None = None) -> None:
        """First use, once: check the credentials and ``create`` the tables (by
        default the lease tables; a fenced store on this connection creates its own)."""
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            if self.closed:
                raise BackendClosed(f"{self._component} is closed")
            create = create or self.names.create_leases
            if self._owns_pool:
                await self._prepare_directly(op, create)
            else:
                await self._create(op, create)
            self._ready = True

    async def _prepare_directly(self, op: str, create: Create) -> None:
        """One direct connection first: a wrong password, role or database is then
        a prompt ConfigurationError, not a pool timeout, and the pool starts only
        once it can connect."""
        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            try:
                await create(conn)
            finally:
                await conn.close()
        except psycopg.Error as exc:
            raise self.error(op, exc) from exc
        if not self.opened:
            await self.pool.open(wait=False)
            self.opened = True

    async def prepare_events(self, op: str) -> None:
        """First use of the event half: create the event tables (once)."""
        if self.events_ready:
            return
        await self.prepare(op)
        async with self._ready_lock:
            if self.events_ready:
                return
            await self._create(op, self.names.create_events)
            self.events_ready = True

    async def _create(self, op: str, create: Create) -> None:
        """``create`` (some tables) on a pooled connection, its failures translated."""
        try:
            async with self.pool.connection() as conn:
                await create(conn)
        except PoolTimeout as exc:
            raise await self._diagnosed(op, exc) from exc
        except psycopg.Error as exc:
            raise self.error(op, exc) from exc

    # -- statements ------------------------------------------------------------------

    async def execute(
        self,
        op: str,
        query: str,
        params: Mapping[str, Any],
        *,
        retry: bool,
        definite: Callable[[Rows], bool] | None = None,
    ) -> Rows:
        """Run one statement within the call time limit; see :meth:`_execute`."""
        return await self.bounded(op, self._execute(op, query, params, retry, definite))

    async def _execute(
        self,
        op: str,
        query: str,
        params: Mapping[str, Any],
        retry: bool,
        definite: Callable[[Rows], bool] | None,
    ) -> Rows:
        """Run one statement; with ``retry``, once more if the connection broke under it.

        The first attempt may have been applied before the connection broke.
        Re-running an idempotent operation is safe, but its answer can then be
        wrong about the first attempt: an acquire that was granted, whose
        lease expired and went to someone else before the retry, would come
        back "refused". So when ``definite`` says a retried answer does not
        settle the outcome, the call raises BackendUnavailable (outcome
        unknown) instead of reporting it.
        """
        await self.prepare(op)
        attempt = 0
        dead = 0
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                async with self.pool.connection() as conn:
                    if not self._health.usable(conn) and dead <= self._max_size:
                        # Closed, so that the pool drops it; try the next one.
                        dead += 1
                        await conn.close()
                        continue
                    if not self._health.adopted(conn):
                        await self._health.adopt(conn)
                    cur = await conn.execute(query, params)
                    rows = await cur.fetchall() if cur.description is not None else []
                    if not conn.autocommit:
                        await conn.commit()
                if attempt and definite is not None and not definite(rows):
                    raise BackendUnavailable(
                        f"{op}: the connection broke during the call and the retry "
                        "cannot tell whether the first attempt was applied (outcome unknown)"
                    )
                return rows
            except PoolTimeout as exc:
                raise await self._diagnosed(op, exc) from exc
            except psycopg.Error as exc:
                if retry and attempt == 0 and conn is not None and conn.broken:
                    # The connection died under us (terminated backend,
                    # restart). The operation is idempotent, so running it
                    # again on a fresh connection is safe whether or not the
                    # first attempt was applied.
                    attempt += 1
                    logger.info(
                        "connection lost during %s; retrying once: %s",
                        op,
                        self.errors.redact(str(exc)),
                    )
                    continue
                raise self.error(op, exc) from exc

    # -- LISTEN (see _listen.py) ------------------------------------------------------

    def on_events(self, notify: Callable[[str], None], gap: Callable[[], None]) -> None:
        """Also deliver notifications of the event channel to ``notify``; ``gap``
        is called when the LISTEN connection came back (some may have been missed)."""
        self.listener.on_events(notify, gap)

    async def listen(self, op: str) -> None:
        """Make sure the LISTEN connection is up, within the call time limit."""
        await self.bounded(op, self.listener.ensure(op))

    # -- life cycle ------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop the LISTEN connection and abandoned calls; close the pool if it is ours."""
        self.closed = True
        await self.listener.aclose()
        if self._owns_pool:
            await self.pool.close()
