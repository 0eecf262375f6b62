"""The lease half of the PostgreSQL backend: one SQL file per operation, on the shared core."""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit, urlunsplit

from psycopg_pool import AsyncConnectionPool

from ..._contract import AcquireResult, Capability, LeaseRecord, RefusalReason, capabilities_of
from ..._doctor import Finding
from ..._errors import ConfigurationError
from ..._url_options import parse_query, to_bool, to_int, to_seconds
from .._core import LEASE_CAPABILITIES, PAGE, LeaseCore, prefix_range
from ._connection import PgConnection
from ._sql import Statements

__all__ = ["PostgresLeaseProvider"]

logger = logging.getLogger("tenure.postgres")

# tenure's URL query options and the constructor keyword each one sets; every
# other query parameter goes to libpq as written (libpq checks it).
_URL_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "schema": ("schema", str),
    "table": ("table", str),
    "pool_min_size": ("min_size", to_int(0)),
    "pool_max_size": ("max_size", to_int(0)),
    "pool_timeout": ("timeout", float),
    "call_timeout": ("call_timeout", to_seconds),
    "prepare": ("prepare_threshold", lambda text: 5 if to_bool(text) else None),
}
_KWARGS = frozenset(
    {
        "schema",
        "table",
        "min_size",
        "max_size",
        "timeout",
        "call_timeout",
        "prepare_threshold",
        "pool",
        "listen_conninfo",
    }
)


def _split_url(
    url: str,
    options: dict[str, Any],
    url_options: dict[str, tuple[str, Callable[[str], Any]]],
    keywords: frozenset[str],
) -> tuple[str, dict[str, Any]]:
    """The libpq conninfo of ``url`` (tenure's options removed) and the constructor's
    keywords (the URL's options, overridden by ``options``)."""
    unknown = sorted(set(options) - keywords)
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) for postgresql://: {', '.join(unknown)}; "
            f"known: {', '.join(sorted(keywords))}"
        )
    query = parse_query(
        url, {name: parse for name, (_, parse) in url_options.items()}, pass_unknown=True
    )
    parts = urlsplit(url)  # parse_query has parsed it already
    if parts.scheme.lower() not in {"postgresql", "postgres"}:
        raise ConfigurationError(
            f"not a postgresql:// URL: {parts.scheme}:// (expected postgresql:// or postgres://)"
        )
    conninfo = urlunsplit(parts._replace(query=query.rest_query()))
    kwargs: dict[str, Any] = {url_options[name][0]: value for name, value in query.ours.items()}
    kwargs.update(options)
    return conninfo, kwargs


@dataclass(frozen=True, slots=True)
class _Statements(Statements):
    """The lease statements of ``sql/``, rendered for one instance's names."""

    acquire: str
    get: str
    release: str
    renew: str
    renew_many: str
    renew_owned: str
    transfer: str
    waiter_register: str
    scan: str
    revoke: str


def _record(key: bytes, owner: bytes, token: int, ttl: int) -> tuple[str, LeaseRecord]:
    """A row of the scan as (key, record)."""
    return bytes(key).decode(), LeaseRecord(bytes(owner).decode(), int(token), max(1, int(ttl)))


class PostgresLeaseProvider(LeaseCore):
    """Leases in a PostgreSQL table (``postgresql://`` or ``postgres://``).

    **Guarantees.** Each operation is one statement (``INSERT … ON CONFLICT …
    DO UPDATE … RETURNING`` or ``UPDATE … RETURNING``) in its own transaction;
    row locks make it atomic. Statements run at READ COMMITTED whatever the
    server's default (the backend pins it on its connections: under
    REPEATABLE READ or SERIALIZABLE a contended acquire would fail instead of
    naming the holder). Expiry is judged on the server clock,
    ``clock_timestamp()`` read through the function ``<schema>.lease_now()``
    (never ``now()``, the start of the transaction), after the row lock was
    taken, so a statement that waited for a lock decides on the current time.
    Fencing tokens live in the lease row: a change of owner (acquire of a free
    or expired key, transfer) adds one; a re-acquire by the holder and a renew
    keep it. Rows are never deleted by tenure, so tokens increase across
    release and expiry. A new row's token starts at the server time in
    microseconds, so even a key whose row an operator deleted gets a higher
    token later, unless the server clock went back.

    **Durability.** Grants, renewals and transfers commit synchronously (a
    crash must not undo a token or a deadline someone was told of). A release
    does not wait for the WAL flush (``synchronous_commit`` off for that
    transaction only): one lost in a crash leaves the lease to expire at its
    deadline, which is safe, and the next grant's synchronous commit flushes
    it. A hand-off so waits for one flush, not two.

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
    otherwise each statement is committed explicitly). Query parameters of the
    URL other than tenure's options (``sslmode``, ``connect_timeout``,
    ``application_name``, ``options``, …) reach libpq exactly as written. The
    first use makes one direct connection (to check the credentials and create
    the table) before the pool starts. A pooled connection the server closed
    (``pg_terminate_backend``, restart) is detected when it is taken from the
    pool; if a connection breaks during a statement, the idempotent operations
    (acquire, renew, release, reads) are retried once on a fresh connection. A
    retried acquire that is refused, or a retried renew that fails, raises
    :class:`~tenure.BackendUnavailable` instead: the first attempt may have
    been applied, so the refusal would not be the truth about the call (the
    safety harness found this). ``transfer_lease`` is not retried (a lost
    reply would make a retry report ``False`` after a successful hand-over):
    it raises :class:`~tenure.BackendUnavailable`.

    **Time limit.** Every call (waiting for a connection, retries and, for
    ``wait_lease_released``, setting up the ``LISTEN`` connection included)
    answers within ``call_timeout`` seconds (URL option ``call_timeout``,
    default 5): past it, it raises :class:`~tenure.BackendUnavailable`
    (outcome unknown) and the statement is cancelled on the server in the
    background. A call waiting longer than that for a row lock held by a long
    transaction elsewhere fails the same way.

    **PgBouncer.** Lease operations work in transaction pooling mode. psycopg
    prepares a statement after it ran 5 times on a connection; that needs
    PgBouncer >= 1.21 with ``max_prepared_statements`` set. With an older
    PgBouncer pass ``?prepare=false`` (or ``prepare_threshold=None``). The
    isolation level is pinned with a session ``SET`` on each new connection,
    which transaction pooling does not keep: behind it, leave the server's
    ``default_transaction_isolation`` at ``read committed`` (PostgreSQL's
    default). ``wait_lease_released`` uses one dedicated ``LISTEN`` connection
    outside the pool, which needs a session (direct or session-pooled)
    connection: pass ``listen_conninfo=`` when the main URL goes through
    PgBouncer in transaction mode.

    **Wake-ups, paid only when someone waits.** A waiter first registers
    (a row ``(key, instance, until)`` in ``<table>_waiters``, committed, kept
    until its wait times out), then reads the lease. Release and transfer
    ``pg_notify`` a channel named after the table (payload: the key in hex)
    only when a live registration for the key exists, in the same statement;
    each listening process wakes one of its waiters. A release that commits
    after the registration sees it and notifies; one before it is seen by the
    waiter's read. So a release nobody waits for sends no notification:
    PostgreSQL serialises the commits of notifying transactions, which would
    cost every release throughput (see ``benchmarks/postgres.py``). A
    registration outlives a waiter woken early until its timeout (a later
    release then still notifies); expired ones are deleted by later
    registrations and by the event half's pruning. When the ``LISTEN``
    connection is lost and comes back every waiter is woken (releases in
    between may have been missed); the connection is pinged every 5 s, so one
    that died silently is replaced. Expiry sends no notification: waiters
    learn of it by their timeout.

    **When a lease can be lost.** Only when its owner does not renew within
    the TTL (measured on the server clock), or when someone changes the table
    by hand. A failover to a replica that had not received the last commits
    (asynchronous replication) can forget recent grants.

    **Errors.** A wrong password, role or database (and a bad ``options``
    parameter) raises :class:`~tenure.ConfigurationError` at the first call.
    Other driver and pool errors, and the time limit, raise
    :class:`~tenure.BackendUnavailable` (outcome unknown; every operation is
    safe to retry). Messages never show the password; neither does ``repr``.
    """

    capabilities = LEASE_CAPABILITIES
    # The URL query options and keywords from_url accepts (a subclass adds its own).
    _url_options: ClassVar[dict[str, tuple[str, Callable[[str], Any]]]] = _URL_OPTIONS
    _kwargs: ClassVar[frozenset[str]] = _KWARGS

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
        call_timeout: float = 5.0,
        prepare_threshold: int | None = 5,
        listen_conninfo: str | None = None,
    ) -> None:
        super().__init__()
        self._conn = PgConnection(
            conninfo,
            pool=pool,
            schema=schema,
            table=table,
            min_size=min_size,
            max_size=max_size,
            pool_timeout=timeout,
            call_timeout=call_timeout,
            prepare_threshold=prepare_threshold,
            listen_conninfo=listen_conninfo,
            on_notify=self._on_notify,
            on_gap=self._waiters.wake_all,
        )
        self._channel = self._conn.names.channel
        self._q = _Statements.rendered(self._conn.names.render)
        # This instance's name in the waiters table.
        self._waiter_id = uuid.uuid4()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Build from ``postgresql://user:password@host:port/dbname?…``.

        tenure's query options (``schema``, ``table``, ``pool_min_size``,
        ``pool_max_size``, ``pool_timeout``, ``call_timeout``, ``prepare``) are
        removed before the URL goes to libpq; every other parameter goes to
        libpq exactly as written, and must be one of its parameters
        (``sslmode``, ``connect_timeout``, ``options``, …), else
        :class:`~tenure.ConfigurationError`. Keyword ``options`` (the
        constructor's) override the URL.
        """
        conninfo, kwargs = _split_url(url, options, cls._url_options, cls._kwargs)
        return cls(conninfo, **kwargs)

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return (
            f"PostgresLeaseProvider({self._conn.where!r}, schema={self.schema!r}, "
            f"table={self.table!r}{state})"
        )

    @property
    def schema(self) -> str:
        return self._conn.names.schema

    @property
    def table(self) -> str:
        return self._conn.names.table

    # -- the lease methods ---------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        ttl = self._args(key, owner, ttl_ms)
        wanted = owner.encode()
        rows = await self._conn.execute(
            "acquire_lease",
            self._q.acquire,
            {"key": key.encode(), "owner": wanted, "ttl_ms": ttl},
            retry=True,
            definite=lambda rows: bool(rows) and rows[0][0] == wanted,
        )
        holder, token = rows[0]
        if holder == wanted:
            return AcquireResult(True, owner, int(token))
        return AcquireResult(False, bytes(holder).decode(), None, reason=RefusalReason.HELD)

    async def _read(self, key: str) -> LeaseRecord | None:
        rows = await self._conn.execute("get_lease", self._q.get, {"key": key.encode()}, retry=True)
        if not rows:
            return None
        owner, token, ttl_ms = rows[0]
        return LeaseRecord(bytes(owner).decode(), int(token), max(1, int(ttl_ms)))

    async def diagnose(self) -> list[Finding]:
        """What ``tenure doctor`` reports about this database (:mod:`tenure._doctor`)."""
        from ._doctor import diagnose

        return await diagnose(self._conn, events=Capability.EVENTS in capabilities_of(self))

    async def _scan(self, prefix: str) -> AsyncGenerator[list[tuple[str, LeaseRecord]], None]:
        low, high = prefix_range(prefix.encode())
        while True:
            rows = await self._conn.execute(
                "scan_leases",
                self._q.scan,
                {"low": low, "high": high, "page": PAGE},
                retry=True,
            )
            yield [_record(*row) for row in rows]
            if len(rows) < PAGE:
                return
            low = bytes(rows[-1][0]) + b"\0"  # the first key after the page's last

    async def _revoke(self, key: str, token: int | None) -> bool:
        rows = await self._conn.execute(
            "revoke_lease",
            self._q.revoke,
            {"key": key.encode(), "token": token, "channel": self._channel},
            retry=True,
            # A retried revoke that finds nothing may follow a first attempt that revoked.
            definite=bool,
        )
        return bool(rows)

    async def release_lease(self, key: str, owner: str) -> None:
        # No local wake-up: the notification reaches this process's listener too.
        self._args_owner(key, owner)
        await self._conn.execute(
            "release_lease",
            self._q.release,
            {"key": key.encode(), "owner": owner.encode(), "channel": self._channel},
            retry=True,
        )

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        ttl = self._args(key, owner, ttl_ms)
        rows = await self._conn.execute(
            "renew_lease",
            self._q.renew,
            {"key": key.encode(), "owner": owner.encode(), "ttl_ms": ttl},
            retry=True,
            definite=bool,
        )
        return bool(rows)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``key`` to ``to_owner`` atomically (one row update, no gap).

        Not retried after a broken connection: the outcome is then unknown and
        :class:`~tenure.BackendUnavailable` is raised.
        """
        ttl = self._args_transfer(key, from_owner, to_owner, ttl_ms)
        rows = await self._conn.execute(
            "transfer_lease",
            self._q.transfer,
            {
                "key": key.encode(),
                "from_owner": from_owner.encode(),
                "to_owner": to_owner.encode(),
                "ttl_ms": ttl,
                "channel": self._channel,
            },
            retry=False,
        )
        return bool(rows)

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many of ``owner``'s leases in one statement; one ``bool`` per key, in order.

        A key given twice gets the same answer twice.
        """
        key_list, ttl = self._args_batch(keys, owner, ttl_ms)
        if not key_list:
            return []
        encoded = [key.encode() for key in key_list]
        # Each key once; the statement locks rows in key order, so concurrent
        # batches do not deadlock.
        unique = sorted(set(encoded))
        rows = await self._conn.execute(
            "renew_leases",
            self._q.renew_many,
            {"keys": unique, "owner": owner.encode(), "ttl_ms": ttl},
            retry=True,
            definite=lambda rows: len(rows) == len(unique),
        )
        renewed = {bytes(key) for (key,) in rows}
        return [key in renewed for key in encoded]

    async def _renew_owned(self, pairs: list[tuple[str, str]], ttl_ms: int) -> list[bool]:
        """Every pair's renewal in one statement (``sql/renew_owned.sql``).

        A key given twice is renewed by the pair whose owner holds it, if any.
        """
        encoded = [(key.encode(), owner.encode()) for key, owner in pairs]
        unique = sorted(set(encoded))
        if len({key for key, _ in unique}) != len(unique):
            # One key under two owners: at most one holds it; each pair on its own.
            return await super()._renew_owned(pairs, ttl_ms)
        rows = await self._conn.execute(
            "renew_owned",
            self._q.renew_owned,
            {
                "keys": [key for key, _ in unique],
                "owners": [owner for _, owner in unique],
                "ttl_ms": ttl_ms,
            },
            retry=True,
            definite=lambda rows: len(rows) == len(unique),
        )
        renewed = {bytes(key) for (key,) in rows}
        return [key in renewed for key, _ in encoded]

    # -- waiting -----------------------------------------------------------------

    async def _watch(self, key: str, timeout: float) -> None:
        await self._conn.listen("wait_lease_released")
        # Registered after LISTEN is up and before the lease is read: a
        # release committed after this registration notifies, one before it
        # is seen by the read. A little longer than the wait, for the time
        # between here and the wait's start.
        await self._conn.execute(
            "wait_lease_released",
            self._q.waiter_register,
            {"key": key.encode(), "waiter": self._waiter_id, "seconds": timeout + 1.0},
            retry=True,
        )

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
        await self._conn.aclose()
        self._waiters.wake_all()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None and conn.opened and not self._closed:
            _warn(f"unclosed {self!r}", ResourceWarning, stacklevel=1)
