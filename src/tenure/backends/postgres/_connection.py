"""tenure's link to one PostgreSQL database.

The pool and its connections (liveness without a round trip, the pinned
isolation level), first use (credentials checked directly, the tables created),
the LISTEN connection, the per-call time limit, and the one place where
psycopg's and the pool's errors become tenure's, with secrets removed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import weakref
from collections.abc import Callable, Coroutine, Mapping
from importlib import resources
from typing import Any, TypeVar

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from ..._errors import BackendClosed, BackendUnavailable, ConfigurationError, TenureError
from ..._url_options import redact, url_secrets
from ._listen import PgListener

__all__ = ["PgConnection", "check_identifier"]

logger = logging.getLogger("tenure.postgres")

T = TypeVar("T")
Rows = list[tuple[Any, ...]]

# One lock id for every tenure table: DDL is rare, so serialising all of it is fine.
_DDL_LOCK_ID = 0x74656E757265  # "tenure"
_MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: PostgreSQL truncates longer names silently
# How long a statement past its time limit may take to be cancelled on the
# server before its connection is closed instead.
_CANCEL_GRACE = 0.05

# Under REPEATABLE READ or SERIALIZABLE a conflicting update fails with a
# serialization error instead of waiting and deciding on the new row, so the
# lease statements must not inherit a stricter default from the server.
_PIN = "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED"

# Wrong password, role or database: no retry will fix them.
_MISCONFIGURED_STATES = frozenset({"28P01", "28000", "3D000"})
# libpq reports a refused start-up as text only (no SQLSTATE): the server's
# messages for those states, plus a bad ``options`` parameter.
_MISCONFIGURED_TEXT = re.compile(
    r'authentication failed for user|role "[^"]*" does not exist|database "[^"]*" does not exist'
    r"|no pg_hba\.conf entry|pg_hba\.conf rejects|no password supplied"
    r"|unrecognized configuration parameter|invalid command-line argument"
)


def load(name: str) -> str:
    """The text of ``sql/<name>.sql``, shipped as package data."""
    return (resources.files("tenure.backends.postgres") / "sql" / f"{name}.sql").read_text("utf-8")


def check_identifier(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty str, got {value!r}")
    if "\0" in value:
        raise ConfigurationError(f"{what} must not contain NUL")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigurationError(f"{what} must be encodable as UTF-8") from None
    if size > _MAX_IDENTIFIER_BYTES:
        raise ConfigurationError(
            f"{what} must be at most {_MAX_IDENTIFIER_BYTES} bytes in UTF-8, got {size}"
        )
    return value


def derived_name(table: str, suffix: str) -> str:
    """The name of a table or index that belongs with ``table`` (``<table><suffix>``).

    A name that would pass PostgreSQL's 63-byte limit is built from a hash of
    ``table`` instead, so that it is never truncated into another table's name.
    """
    name = table + suffix
    if len(name.encode("utf-8")) <= _MAX_IDENTIFIER_BYTES:
        return name
    return f"tenure_{hashlib.sha256(table.encode()).hexdigest()[:24]}{suffix}"


def _describe(conninfo: str) -> tuple[str, str | None]:
    """A password-free description of ``conninfo`` and the password (to redact)."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "postgresql://<unparseable conninfo>", None
    password = params.get("password")
    user = params.get("user")
    host = params.get("host") or "localhost"
    port = params.get("port")
    dbname = params.get("dbname") or ""
    where = f"postgresql://{f'{user}@' if user else ''}{host}{f':{port}' if port else ''}/{dbname}"
    # libpq's reading of a badly written URL can put the password in any field.
    secret = str(password) if password else None
    return redact(where, [secret, *url_secrets(conninfo)]), secret


def _misconfigured(exc: BaseException) -> bool:
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate is not None:
        return exc.sqlstate in _MISCONFIGURED_STATES
    return _MISCONFIGURED_TEXT.search(str(exc)) is not None


# Pooled connections whose server process said it is going away (a FATAL
# message that arrived while they sat idle in the pool), and those already
# set up for tenure (notice handler, isolation level).
_DOOMED: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()
_ADOPTED: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()


async def _adopt(conn: psycopg.AsyncConnection[Any]) -> None:
    """Set a pooled connection up: remember when the server announces it closes
    it, and pin READ COMMITTED (the pool's ``configure``; on first sight for an
    injected pool)."""
    ref = weakref.ref(conn)

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        target = ref()
        if target is not None and diag.severity_nonlocalized in {"FATAL", "PANIC"}:
            _DOOMED.add(target)

    conn.add_notice_handler(on_notice)
    await conn.execute(_PIN)
    if not conn.autocommit:
        await conn.commit()
    _ADOPTED.add(conn)


def _usable(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether a pooled connection is still alive, found without a round trip.

    libpq sockets are non-blocking, so ``consume_input`` only reads what is
    already there. A terminated backend (``pg_terminate_backend``, server
    shutdown) sends a FATAL message, which libpq hands to the notice handler
    when it arrives on an idle connection, then closes the socket, which the
    next read reports. Either one marks the connection dead, so a statement is
    not sent to a backend that is already going away. (Not done as the pool's
    ``check`` callback: the pool backs off for a second after a failed check.)
    """
    pgconn = conn.pgconn
    try:
        if pgconn.status != pq.ConnStatus.OK:
            return False
        pgconn.consume_input()
        pgconn.is_busy()  # parses what was read: runs the notice handler
        if conn in _DOOMED:
            return False
        pgconn.consume_input()
    except psycopg.Error:
        return False
    return pgconn.transaction_status == pq.TransactionStatus.IDLE


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
    ) -> None:
        self.schema = check_identifier(schema, "schema")
        self.table = check_identifier(table, "table")
        if not isinstance(conninfo, str):
            raise ConfigurationError(f"conninfo must be a str, got {type(conninfo).__name__}")
        if type(min_size) is not int or min_size < 0:
            raise ConfigurationError(f"min_size must be an int >= 0, got {min_size!r}")
        if type(max_size) is not int or max_size < max(1, min_size):
            raise ConfigurationError(
                f"max_size must be an int >= max(1, min_size), got {max_size!r}"
            )
        for name, value in (("timeout", pool_timeout), ("call_timeout", call_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
                raise ConfigurationError(f"{name} must be a number of seconds > 0, got {value!r}")
        if prepare_threshold is not None and (
            type(prepare_threshold) is not int or prepare_threshold < 0
        ):
            raise ConfigurationError(
                f"prepare_threshold must be None or an int >= 0, got {prepare_threshold!r}"
            )
        self.call_timeout = float(call_timeout)
        if pool is not None:
            if not isinstance(pool, AsyncConnectionPool):
                raise ConfigurationError(
                    f"pool must be a psycopg_pool.AsyncConnectionPool, got {type(pool).__name__}"
                )
            if not conninfo and isinstance(pool.conninfo, str):
                conninfo = pool.conninfo
            self.pool = pool
            self._owns_pool = False
        else:
            try:
                conninfo_to_dict(conninfo)
            except psycopg.Error as exc:
                # libpq quotes the token it refused, which can be the password.
                raise ConfigurationError(
                    f"invalid PostgreSQL URL or conninfo: {redact(str(exc), url_secrets(conninfo))}"
                ) from None
            self.pool = AsyncConnectionPool(
                conninfo,
                min_size=min_size,
                max_size=max_size,
                open=False,
                timeout=float(pool_timeout),
                kwargs={"autocommit": True, "prepare_threshold": prepare_threshold},
                configure=_adopt,
                name=f"tenure-{self.schema}.{self.table}",
            )
            self._owns_pool = True
        self._conninfo = conninfo
        self._max_size = pool.max_size if pool is not None else max_size
        self._listen_conninfo = listen_conninfo if listen_conninfo is not None else conninfo
        self.where, password = _describe(conninfo)
        self.secrets = (
            password,
            _describe(self._listen_conninfo)[1],
            *url_secrets(conninfo),
            *url_secrets(self._listen_conninfo),
        )
        # A NOTIFY channel is an identifier of at most 63 bytes; a hash of the
        # qualified table name fits whatever the names are.
        digest = hashlib.sha256(f"{self.schema}\0{self.table}".encode()).hexdigest()[:24]
        self.channel = f"tenure_{digest}"
        # Events have a channel of their own (payload: the topic in hex); the
        # one LISTEN connection listens on both.
        self.event_channel = f"tenure_{digest}_e"
        names = {
            "waiters": "_waiters",
            "live": "_live",
            "events": "_events",
            "groups": "_groups",
            "claims": "_claims",
        }
        indexes = {
            "events_source": "_events_source",
            "events_keep": "_events_keep",
            "groups_alive": "_groups_alive",
            "claims_event": "_claims_event",
        }
        self._names = {
            "schema": sql.Identifier(self.schema),
            "table": sql.Identifier(self.schema, self.table),
            "now": sql.Identifier(self.schema, "lease_now"),
            # Index names take no schema: an index lives in its table's schema.
            **{
                k: sql.Identifier(self.schema, derived_name(self.table, v))
                for k, v in names.items()
            },
            **{k: sql.Identifier(derived_name(self.table, v)) for k, v in indexes.items()},
        }
        self._table_names = {k: derived_name(self.table, v) for k, v in names.items()}

        self.closed = False
        self.opened = False
        self._ready = False
        self.events_ready = False
        self._ready_lock = asyncio.Lock()
        self.listener = PgListener(self, self._listen_conninfo, on_notify, on_gap, ping_interval)

    def render(self, name: str) -> str:
        """``sql/<name>.sql`` with the schema, table and clock names composed in."""
        return sql.SQL(load(name)).format(**self._names).as_string(None)

    # -- errors ----------------------------------------------------------------

    def error(self, op: str, exc: BaseException, detail: str | None = None) -> TenureError:
        """The one translation of a driver or pool error: the most specific tenure error."""
        if self.closed and isinstance(exc, PoolClosed):
            return BackendClosed("PostgresLeaseProvider is closed")
        text = str(exc).strip() or type(exc).__name__
        if detail:
            text = f"{text} ({detail})"
        text = redact(text, self.secrets)
        if _misconfigured(exc):
            return ConfigurationError(f"PostgreSQL at {self.where} refused {op}: {text}")
        return BackendUnavailable(
            f"PostgreSQL at {self.where} failed during {op}: {type(exc).__name__}: {text}"
        )

    async def _diagnosed(self, op: str, exc: PoolTimeout) -> TenureError:
        """Why the pool cannot connect, from one direct attempt (a pool timeout says nothing)."""
        if self.closed:
            return self.error(op, exc)
        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo)
        except psycopg.Error as failure:
            if _misconfigured(failure):
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

    async def prepare(self, op: str) -> None:
        """First use: check the credentials and create the table (once)."""
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            if self.closed:
                raise BackendClosed("PostgresLeaseProvider is closed")
            if self._owns_pool:
                # One direct connection first: a wrong password, role or
                # database is then a prompt ConfigurationError, not a pool
                # timeout, and the pool starts only once it can connect.
                try:
                    conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                    try:
                        await self._create_schema(conn)
                    finally:
                        await conn.close()
                except psycopg.Error as exc:
                    raise self.error(op, exc) from exc
                if not self.opened:
                    await self.pool.open(wait=False)
                    self.opened = True
            else:
                try:
                    async with self.pool.connection() as conn:
                        await self._create_schema(conn)
                except PoolTimeout as exc:
                    raise await self._diagnosed(op, exc) from exc
                except psycopg.Error as exc:
                    raise self.error(op, exc) from exc
            self._ready = True

    async def prepare_events(self, op: str) -> None:
        """First use of the event half: create the event tables (once)."""
        if self.events_ready:
            return
        await self.prepare(op)
        async with self._ready_lock:
            if self.events_ready:
                return
            try:
                async with self.pool.connection() as conn:
                    await self._ensure(
                        conn,
                        "events_schema",
                        [self._table_names[t] for t in ("events", "groups", "claims")],
                    )
            except PoolTimeout as exc:
                raise await self._diagnosed(op, exc) from exc
            except psycopg.Error as exc:
                raise self.error(op, exc) from exc
            self.events_ready = True

    async def _create_schema(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await self._ensure(
            conn,
            "schema",
            [self.table, self._table_names["waiters"], self._table_names["live"]],
            clock=True,
        )

    async def _ensure(
        self,
        conn: psycopg.AsyncConnection[Any],
        file: str,
        tables: list[str],
        *,
        clock: bool = False,
    ) -> None:
        """Run ``sql/<file>.sql`` unless every one of ``tables`` (and the clock
        function, with ``clock``) exists; the clock is the file's last statement."""
        exists = sql.SQL(
            "SELECT"
            " (SELECT count(*) FROM pg_catalog.pg_class c"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %(schema)s AND c.relname = ANY(%(tables)s)) = %(n)s,"
            " EXISTS (SELECT FROM pg_catalog.pg_proc p"
            " JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = %(schema)s AND p.proname = 'lease_now' AND p.pronargs = 0)"
        )
        params = {"schema": self.schema, "tables": tables, "n": len(tables)}
        async with conn.transaction():
            # The second check below must see what another session committed
            # while this one waited for the lock: a fresh snapshot per statement.
            await conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            row = await (await conn.execute(exists, params)).fetchone()
            assert row is not None
            if row[0] and (row[1] or not clock):
                return
            # CREATE … IF NOT EXISTS still races on the catalogs' unique
            # indexes when two sessions run it at once; the lock serialises them.
            await conn.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s)", (_DDL_LOCK_ID,))
            row = await (await conn.execute(exists, params)).fetchone()
            assert row is not None
            has_tables, has_clock = row
            statements = [
                sql.SQL(part.strip()).format(**self._names)
                for part in load(file).split("\n--;\n")
                if part.strip()
            ]
            clock_statement = statements.pop() if clock else None
            if not has_tables:
                for statement in statements:
                    await conn.execute(statement)
                logger.info("created the tables of %s in schema %s", file, self.schema)
            if clock_statement is not None and not has_clock:
                await conn.execute(clock_statement)

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
                    if not _usable(conn) and dead <= self._max_size:
                        # Closed, so that the pool drops it; try the next one.
                        dead += 1
                        await conn.close()
                        continue
                    if conn not in _ADOPTED:
                        await _adopt(conn)
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
                    logger.info("connection lost during %s; retrying once: %s", op, exc)
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
