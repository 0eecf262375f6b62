"""Leases on PostgreSQL (``postgresql://``), with psycopg 3 and a connection pool.

Every lease operation is one SQL statement (``src/tenure/backends/sql/postgres_*.sql``)
in its own short transaction. There are no advisory locks and no session state
in lease operations, so the pool may sit behind PgBouncer in transaction pooling
mode (see :class:`PostgresLeaseProvider` for the prepared-statement setting).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from .._contract import AcquireResult, LeaseRecord
from .._errors import BackendClosed, BackendUnavailable, ConfigurationError, InvalidArgument
from .._lifecycle import AsyncCloseable
from .._validate import check_keys, check_name, check_timeout, check_ttl
from .._waiters import KeyWaiters

__all__ = ["PostgresLeaseProvider"]

logger = logging.getLogger("tenure.postgres")

# Options tenure reads from the URL query; everything else goes to libpq.
_URL_OPTIONS = frozenset(
    {"schema", "table", "pool_min_size", "pool_max_size", "pool_timeout", "prepare"}
)
_KWARGS = frozenset(
    {
        "schema",
        "table",
        "min_size",
        "max_size",
        "timeout",
        "prepare_threshold",
        "pool",
        "listen_conninfo",
    }
)
# One lock id for every tenure table: DDL is rare, so serialising all of it is fine.
_DDL_LOCK_ID = 0x74656E757265  # "tenure"
_MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: PostgreSQL truncates longer names silently


def _load(name: str) -> str:
    return (resources.files("tenure.backends") / "sql" / f"postgres_{name}.sql").read_text("utf-8")


def _check_identifier(value: Any, what: str) -> str:
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


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigurationError(f"URL option {name} must be true or false, got {value!r}")


def _parse_number(name: str, value: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise ConfigurationError(f"URL option {name} must be a number, got {value!r}") from None


def _describe(conninfo: str) -> tuple[str, str | None]:
    """A password-free description of ``conninfo`` and the password (to scrub)."""
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
    return where, (str(password) if password else None)


# Pooled connections whose server process said it is going away (a FATAL
# message that arrived while they sat idle in the pool).
_DOOMED: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()


async def _configure_connection(conn: psycopg.AsyncConnection[Any]) -> None:
    """Pool ``configure``: remember when the server announces it closes this connection."""
    ref = weakref.ref(conn)

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        target = ref()
        if target is not None and diag.severity_nonlocalized in {"FATAL", "PANIC"}:
            _DOOMED.add(target)

    conn.add_notice_handler(on_notice)


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


class PostgresLeaseProvider(AsyncCloseable):
    """Leases in a PostgreSQL table (``postgresql://`` or ``postgres://``).

    **Guarantees.** Each operation is one statement (``INSERT … ON CONFLICT …
    DO UPDATE … RETURNING`` or ``UPDATE … RETURNING``) in its own transaction;
    row locks make it atomic. Expiry is judged on the server clock,
    ``clock_timestamp()`` read through the function ``<schema>.lease_now()``
    (never ``now()``, the start of the transaction), after the row lock was
    taken, so a statement that waited for a lock decides on the current time.
    Fencing tokens live in the lease row: a change of owner (acquire of a free
    or expired key, transfer) adds one; a re-acquire by the holder and a renew
    keep it. Rows are never deleted by tenure, so tokens increase across
    release and expiry. A new row's token starts at the server time in
    microseconds, so even a key whose row an operator deleted gets a higher
    token later, unless the server clock went back.

    Keys and owners are stored as UTF-8 ``bytea``: NUL round-trips and
    comparison is byte-wise. The table (default ``tenure.leases``, URL options
    ``schema`` and ``table``) and the clock function are created on first use,
    in one transaction under a transaction-scoped advisory lock (DDL only), so
    several processes may start at once. It grows by one small row per key
    ever leased.

    **Connections.** A ``psycopg_pool.AsyncConnectionPool`` in autocommit mode
    (``pool_min_size``, default 1; ``pool_max_size``, default 10;
    ``pool_timeout`` seconds to get a connection, default 10), or one you pass
    as ``pool=`` (you open and close it; its connections should be autocommit,
    otherwise each statement is committed explicitly). libpq options in the
    URL (``sslmode``, ``connect_timeout``, ``application_name``, …) pass
    through. A pooled connection the server closed (``pg_terminate_backend``,
    restart) is detected when it is taken from the pool; if a connection breaks
    during a statement, the idempotent operations (acquire, renew, release,
    reads) are retried once on a fresh connection. A retried acquire that is
    refused, or a retried renew that fails, raises
    :class:`~tenure.BackendUnavailable` instead: the first attempt may have
    been applied, so the refusal would not be the truth about the call (the
    safety harness found this). ``transfer_lease`` is not retried (a lost
    reply would make a retry report ``False`` after a successful hand-over):
    it raises :class:`~tenure.BackendUnavailable`.

    **PgBouncer.** Lease operations work in transaction pooling mode. psycopg
    prepares a statement after it ran 5 times on a connection; that needs
    PgBouncer >= 1.21 with ``max_prepared_statements`` set. With an older
    PgBouncer pass ``?prepare=false`` (or ``prepare_threshold=None``).
    ``wait_lease_released`` uses one dedicated ``LISTEN`` connection outside
    the pool, which needs a session (direct or session-pooled) connection:
    pass ``listen_conninfo=`` when the main URL goes through PgBouncer in
    transaction mode.

    **Wake-ups.** Release and transfer also ``pg_notify`` a channel named after
    the table (payload: the key in hex). PostgreSQL serialises the commits of
    notifying transactions, which costs some throughput when many processes
    release at once (see ``benchmarks/postgres.py``).

    **When a lease can be lost.** Only when its owner does not renew within
    the TTL (measured on the server clock), or when someone changes the table
    by hand. A failover to a replica that had not received the last commits
    (asynchronous replication) can forget recent grants.

    **Errors.** Driver and pool errors become :class:`~tenure.BackendUnavailable`
    (outcome unknown; every operation is safe to retry), with the password
    removed from the message; ``repr`` never shows it.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        schema: str = "tenure",
        table: str = "leases",
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 10.0,
        prepare_threshold: int | None = 5,
        listen_conninfo: str | None = None,
    ) -> None:
        self._schema = _check_identifier(schema, "schema")
        self._table = _check_identifier(table, "table")
        if not isinstance(conninfo, str):
            raise ConfigurationError(f"conninfo must be a str, got {type(conninfo).__name__}")
        if type(min_size) is not int or min_size < 0:
            raise ConfigurationError(f"min_size must be an int >= 0, got {min_size!r}")
        if type(max_size) is not int or max_size < max(1, min_size):
            raise ConfigurationError(
                f"max_size must be an int >= max(1, min_size), got {max_size!r}"
            )
        try:
            self._timeout = check_timeout(timeout, "timeout")
        except InvalidArgument as exc:
            raise ConfigurationError(str(exc)) from None
        if prepare_threshold is not None and (
            type(prepare_threshold) is not int or prepare_threshold < 0
        ):
            raise ConfigurationError(
                f"prepare_threshold must be None or an int >= 0, got {prepare_threshold!r}"
            )
        if pool is not None:
            if not isinstance(pool, AsyncConnectionPool):
                raise ConfigurationError(
                    f"pool must be a psycopg_pool.AsyncConnectionPool, got {type(pool).__name__}"
                )
            if not conninfo and isinstance(pool.conninfo, str):
                conninfo = pool.conninfo
            self._pool = pool
            self._owns_pool = False
        else:
            try:
                conninfo_to_dict(conninfo)
            except psycopg.Error as exc:
                _, password = _describe(conninfo)
                raise ConfigurationError(
                    f"invalid PostgreSQL conninfo: {_scrub(str(exc), password)}"
                ) from None
            self._pool = AsyncConnectionPool(
                conninfo,
                min_size=min_size,
                max_size=max_size,
                open=False,
                timeout=self._timeout,
                kwargs={"autocommit": True, "prepare_threshold": prepare_threshold},
                configure=_configure_connection,
                name=f"tenure-{self._schema}.{self._table}",
            )
            self._owns_pool = True
        self._conninfo = conninfo
        self._max_size = pool.max_size if pool is not None else max_size
        self._listen_conninfo = listen_conninfo if listen_conninfo is not None else conninfo
        self._where, self._password = _describe(conninfo)
        _, self._listen_password = _describe(self._listen_conninfo)
        # A NOTIFY channel is an identifier of at most 63 bytes; a hash of the
        # qualified table name fits whatever the names are.
        digest = hashlib.sha256(f"{self._schema}\0{self._table}".encode()).hexdigest()[:24]
        self._channel = f"tenure_{digest}"

        names = {
            "schema": sql.Identifier(self._schema),
            "table": sql.Identifier(self._schema, self._table),
            "now": sql.Identifier(self._schema, "lease_now"),
        }

        def render(name: str) -> str:
            return sql.SQL(_load(name)).format(**names).as_string(None)

        self._q_acquire = render("acquire")
        self._q_get = render("get")
        self._q_release = render("release")
        self._q_renew = render("renew")
        self._q_renew_many = render("renew_many")
        self._q_transfer = render("transfer")
        self._ddl = [
            sql.SQL(part.strip()).format(**names)
            for part in _load("schema").split("\n--;\n")
            if part.strip()
        ]

        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._closed = False
        self._opened = False
        self._waiters = KeyWaiters()
        self._listen_task: asyncio.Task[None] | None = None
        self._listen_ready: asyncio.Future[None] | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresLeaseProvider:
        """Build from ``postgresql://user:password@host:port/dbname?…``.

        tenure's query options (``schema``, ``table``, ``pool_min_size``,
        ``pool_max_size``, ``pool_timeout``, ``prepare``) are removed before the
        URL goes to libpq; every other option must be a libpq parameter
        (``sslmode``, ``connect_timeout``, …), else :class:`~tenure.ConfigurationError`.
        Keyword ``options`` (the constructor's) override the URL.
        """
        unknown = sorted(set(options) - _KWARGS)
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) for postgresql://: {', '.join(unknown)}; "
                f"known: {', '.join(sorted(_KWARGS))}"
            )
        _, password = _describe(url)
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise ConfigurationError(
                f"invalid PostgreSQL URL: {_scrub(str(exc), password)}"
            ) from None
        if parts.scheme.lower() not in {"postgresql", "postgres"}:
            raise ConfigurationError(
                f"not a postgresql:// URL: {parts.scheme}:// (expected postgresql:// or postgres://)"
            )
        ours: dict[str, str] = {}
        rest: list[tuple[str, str]] = []
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name in _URL_OPTIONS:
                if name in ours:
                    raise ConfigurationError(f"URL option {name} is given twice")
                ours[name] = value
            else:
                rest.append((name, value))
        conninfo = urlunsplit(
            (parts.scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment)
        )
        try:
            conninfo_to_dict(conninfo)
        except psycopg.Error as exc:
            raise ConfigurationError(
                f"invalid PostgreSQL URL option: {_scrub(str(exc), password)} (tenure's own "
                f"options are {', '.join(sorted(_URL_OPTIONS))})"
            ) from None
        kwargs: dict[str, Any] = {}
        if "schema" in ours:
            kwargs["schema"] = ours["schema"]
        if "table" in ours:
            kwargs["table"] = ours["table"]
        if "pool_min_size" in ours:
            kwargs["min_size"] = _parse_number("pool_min_size", ours["pool_min_size"], int)
        if "pool_max_size" in ours:
            kwargs["max_size"] = _parse_number("pool_max_size", ours["pool_max_size"], int)
        if "pool_timeout" in ours:
            kwargs["timeout"] = _parse_number("pool_timeout", ours["pool_timeout"], float)
        if "prepare" in ours:
            kwargs["prepare_threshold"] = 5 if _parse_bool("prepare", ours["prepare"]) else None
        kwargs.update(options)
        return cls(conninfo, **kwargs)

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return (
            f"PostgresLeaseProvider({self._where!r}, schema={self._schema!r}, "
            f"table={self._table!r}{state})"
        )

    @property
    def schema(self) -> str:
        return self._schema

    @property
    def table(self) -> str:
        return self._table

    # -- plumbing ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosed("PostgresLeaseProvider is closed")

    def _unavailable(
        self, op: str, exc: BaseException, password: str | None = None, detail: str | None = None
    ) -> BackendUnavailable | BackendClosed:
        if self._closed and isinstance(exc, PoolClosed):
            return BackendClosed("PostgresLeaseProvider is closed")
        message = str(exc).strip() or type(exc).__name__
        if detail:
            message = f"{message} ({detail})"
        message = _scrub(_scrub(message, self._password), password)
        return BackendUnavailable(
            f"PostgreSQL at {self._where} failed during {op}: {type(exc).__name__}: {message}"
        )

    async def _prepare(self, op: str) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            self._check_open()
            if self._owns_pool and not self._opened:
                await self._pool.open(wait=False)
                self._opened = True
            try:
                await self._create_schema()
            except PoolTimeout as exc:
                raise self._unavailable(op, exc, detail=await self._diagnose()) from exc
            except psycopg.Error as exc:
                raise self._unavailable(op, exc) from exc
            self._ready = True

    async def _create_schema(self) -> None:
        exists = sql.SQL(
            "SELECT"
            " EXISTS (SELECT FROM pg_catalog.pg_class c"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %(schema)s AND c.relname = %(table)s),"
            " EXISTS (SELECT FROM pg_catalog.pg_proc p"
            " JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = %(schema)s AND p.proname = 'lease_now' AND p.pronargs = 0)"
        )
        params = {"schema": self._schema, "table": self._table}
        async with self._pool.connection() as conn, conn.transaction():
            row = await (await conn.execute(exists, params)).fetchone()
            assert row is not None
            if row[0] and row[1]:
                return
            # CREATE … IF NOT EXISTS still races on the catalogs' unique
            # indexes when two sessions run it at once; the lock serialises them.
            await conn.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s)", (_DDL_LOCK_ID,))
            row = await (await conn.execute(exists, params)).fetchone()
            assert row is not None
            has_table, has_clock = row
            *tables, clock = self._ddl
            if not has_table:
                for statement in tables:
                    await conn.execute(statement)
            if not has_clock:
                await conn.execute(clock)
            logger.info("created the lease table %s.%s", self._schema, self._table)

    async def _execute(
        self,
        op: str,
        query: str,
        params: Mapping[str, Any],
        *,
        retry: bool,
        definite: Callable[[list[tuple[Any, ...]]], bool] | None = None,
    ) -> list[tuple[Any, ...]]:
        """Run one statement; with ``retry``, once more if the connection broke under it.

        The first attempt may have been applied before the connection broke.
        Re-running an idempotent operation is safe, but its answer can then be
        wrong about the first attempt: an acquire that was granted, whose
        lease expired and went to someone else before the retry, would come
        back "refused". So when ``definite`` says a retried answer does not
        settle the outcome, the call raises BackendUnavailable (outcome
        unknown) instead of reporting it.
        """
        await self._prepare(op)
        attempt = 0
        dead = 0
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                async with self._pool.connection() as conn:
                    if not _usable(conn) and dead <= self._max_size:
                        # Closed, so that the pool drops it; try the next one.
                        dead += 1
                        await conn.close()
                        continue
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
                raise self._unavailable(op, exc, detail=await self._diagnose()) from exc
            except psycopg.Error as exc:
                if retry and attempt == 0 and conn is not None and conn.broken:
                    # The connection died under us (terminated backend,
                    # restart). The operation is idempotent, so running it
                    # again on a fresh connection is safe whether or not the
                    # first attempt was applied.
                    attempt += 1
                    logger.info("connection lost during %s; retrying once: %s", op, exc)
                    continue
                raise self._unavailable(op, exc) from exc

    async def _diagnose(self) -> str | None:
        """Why the pool cannot connect, from one direct attempt (a pool timeout says nothing)."""
        if not self._conninfo or self._closed:
            return None
        try:
            conn = await asyncio.wait_for(
                psycopg.AsyncConnection.connect(self._conninfo), max(1.0, self._timeout)
            )
        except TimeoutError:
            return "connecting directly timed out too"
        except psycopg.Error as exc:
            return f"connecting directly: {str(exc).strip()}"
        await conn.close()
        return None  # the server is fine: every pooled connection was busy

    async def _get(self, key: str, op: str) -> LeaseRecord | None:
        rows = await self._execute(op, self._q_get, {"key": key.encode()}, retry=True)
        if not rows:
            return None
        owner, token, ttl_ms = rows[0]
        return LeaseRecord(bytes(owner).decode(), int(token), max(1, int(ttl_ms)))

    # -- the five lease methods ------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        check_name(key, "key")
        check_name(owner, "owner")
        ttl_ms = check_ttl(ttl_ms)
        self._check_open()
        wanted = owner.encode()
        rows = await self._execute(
            "acquire_lease",
            self._q_acquire,
            {"key": key.encode(), "owner": wanted, "ttl_ms": ttl_ms},
            retry=True,
            definite=lambda rows: bool(rows) and rows[0][0] == wanted,
        )
        holder, token = rows[0]
        if holder == wanted:
            return AcquireResult(True, owner, int(token))
        return AcquireResult(False, bytes(holder).decode(), None)

    async def get_lease_owner(self, key: str) -> str | None:
        check_name(key, "key")
        self._check_open()
        record = await self._get(key, "get_lease_owner")
        return None if record is None else record.owner

    async def release_lease(self, key: str, owner: str) -> None:
        check_name(key, "key")
        check_name(owner, "owner")
        self._check_open()
        await self._execute(
            "release_lease",
            self._q_release,
            {"key": key.encode(), "owner": owner.encode(), "channel": self._channel},
            retry=True,
        )

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        check_name(key, "key")
        check_name(owner, "owner")
        ttl_ms = check_ttl(ttl_ms)
        self._check_open()
        rows = await self._execute(
            "renew_lease",
            self._q_renew,
            {"key": key.encode(), "owner": owner.encode(), "ttl_ms": ttl_ms},
            retry=True,
            definite=bool,
        )
        return bool(rows)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``key`` to ``to_owner`` atomically (one row update, no gap).

        Not retried after a broken connection: the outcome is then unknown and
        :class:`~tenure.BackendUnavailable` is raised.
        """
        check_name(key, "key")
        check_name(from_owner, "from_owner")
        check_name(to_owner, "to_owner")
        ttl_ms = check_ttl(ttl_ms)
        self._check_open()
        rows = await self._execute(
            "transfer_lease",
            self._q_transfer,
            {
                "key": key.encode(),
                "from_owner": from_owner.encode(),
                "to_owner": to_owner.encode(),
                "ttl_ms": ttl_ms,
                "channel": self._channel,
            },
            retry=False,
        )
        return bool(rows)

    # -- extensions --------------------------------------------------------

    async def get_lease(self, key: str) -> LeaseRecord | None:
        """The live lease of ``key`` (owner, token, remaining ms) in one read, or ``None``."""
        check_name(key, "key")
        self._check_open()
        return await self._get(key, "get_lease")

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many of ``owner``'s leases in one statement; one ``bool`` per key, in order.

        A key given twice gets the same answer twice.
        """
        keys = check_keys(keys)
        check_name(owner, "owner")
        ttl_ms = check_ttl(ttl_ms)
        self._check_open()
        if not keys:
            return []
        encoded = [key.encode() for key in keys]
        # Each key once; the statement locks rows in key order, so concurrent
        # batches do not deadlock.
        unique = sorted(set(encoded))
        rows = await self._execute(
            "renew_leases",
            self._q_renew_many,
            {"keys": unique, "owner": owner.encode(), "ttl_ms": ttl_ms},
            retry=True,
            definite=lambda rows: len(rows) == len(unique),
        )
        renewed = {bytes(key) for (key,) in rows}
        return [key in renewed for key in encoded]

    async def wait_lease_released(self, key: str, timeout: float) -> bool:
        """Wait until ``key`` is released or transferred, at most ``timeout`` seconds.

        ``True`` at once if the key has no live lease, or when a release or
        transfer (by any process) wakes this waiter: one local waiter per
        notification, the longest-waiting first. ``False`` on timeout. When the
        ``LISTEN`` connection is lost and comes back every waiter is woken
        (releases in between may have been missed), so a ``True`` means "look
        again", not "the key is free". Expiry sends no notification: waiters
        learn of it only by their timeout.
        """
        check_name(key, "key")
        timeout = check_timeout(timeout)
        self._check_open()
        await self._prepare("wait_lease_released")
        fut = self._waiters.register(key)
        try:
            await self._ensure_listener()
            free = await self._get(key, "wait_lease_released") is None
        except BaseException:
            self._waiters.discard(key, fut)
            raise
        if free:
            self._waiters.discard(key, fut)
            return True
        return await self._waiters.wait(key, fut, timeout)

    async def _ensure_listener(self) -> None:
        task = self._listen_task
        if task is None or task.done():
            self._listen_ready = asyncio.get_running_loop().create_future()
            self._listen_task = asyncio.create_task(
                self._listen(self._listen_ready), name=f"tenure-postgres-listen-{self._channel}"
            )
        assert self._listen_ready is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._listen_ready), self._timeout)
        except TimeoutError:
            raise BackendUnavailable(
                f"PostgreSQL at {self._where}: LISTEN connection not ready after {self._timeout} s"
            ) from None

    async def _listen(self, ready: asyncio.Future[None]) -> None:
        listen = sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))
        delay = 0.1
        while not self._closed:
            try:
                conn = await psycopg.AsyncConnection.connect(self._listen_conninfo, autocommit=True)
                try:
                    await conn.execute(listen)
                    if ready.done():
                        # Reconnected: releases may have been missed meanwhile.
                        self._waiters.wake_all()
                    else:
                        ready.set_result(None)
                    delay = 0.1
                    async for note in conn.notifies():
                        self._on_notify(note.payload)
                finally:
                    await conn.close()
            except psycopg.Error as exc:
                if not ready.done():
                    ready.set_exception(self._unavailable("LISTEN", exc, self._listen_password))
                    return
                self._waiters.wake_all()
                logger.warning(
                    "LISTEN connection to PostgreSQL at %s lost (%s); reconnecting in %.1f s",
                    self._where,
                    _scrub(_scrub(str(exc), self._password), self._listen_password),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _on_notify(self, payload: str) -> None:
        try:
            key = bytes.fromhex(payload).decode("utf-8")
        except ValueError:
            logger.warning("ignoring a malformed notification on %s", self._channel)
            return
        self._waiters.wake_one(key)

    # -- life cycle --------------------------------------------------------

    async def aclose(self) -> None:
        """Close the pool (if this provider made it) and the LISTEN connection."""
        if self._closed:
            return
        self._closed = True
        task, self._listen_task = self._listen_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._owns_pool:
            await self._pool.close()
        self._waiters.wake_all()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        if getattr(self, "_opened", False) and not getattr(self, "_closed", True):
            _warn(f"unclosed {self!r}", ResourceWarning, stacklevel=1)


def _scrub(message: str, password: str | None) -> str:
    if password:
        message = message.replace(password, "***")
    return message
