"""The pool of one backend instance: building it (or checking an injected one),
setting its connections up, and telling a dead pooled connection without a
round trip."""

from __future__ import annotations

import weakref
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from ..._errors import ConfigurationError
from ..._url_options import redact, url_secrets

__all__ = ["ConnectionHealth", "check_settings", "make_pool"]

# Under REPEATABLE READ or SERIALIZABLE a conflicting update fails with a
# serialization error instead of waiting and deciding on the new row, so the
# lease statements must not inherit a stricter default from the server.
_PIN = "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED"


def check_settings(
    *,
    conninfo: str,
    min_size: int,
    max_size: int,
    pool_timeout: float,
    call_timeout: float,
    prepare_threshold: int | None,
) -> None:
    """Raise :class:`ConfigurationError` for a pool or time-limit setting out of range."""
    if not isinstance(conninfo, str):
        raise ConfigurationError(f"conninfo must be a str, got {type(conninfo).__name__}")
    if type(min_size) is not int or min_size < 0:
        raise ConfigurationError(f"min_size must be an int >= 0, got {min_size!r}")
    if type(max_size) is not int or max_size < max(1, min_size):
        raise ConfigurationError(f"max_size must be an int >= max(1, min_size), got {max_size!r}")
    for name, value in (("timeout", pool_timeout), ("call_timeout", call_timeout)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
            raise ConfigurationError(f"{name} must be a number of seconds > 0, got {value!r}")
    if prepare_threshold is not None and (
        type(prepare_threshold) is not int or prepare_threshold < 0
    ):
        raise ConfigurationError(
            f"prepare_threshold must be None or an int >= 0, got {prepare_threshold!r}"
        )


class ConnectionHealth:
    """Which pooled connections are set up for tenure, and which the server
    announced it is closing, for the pools of one backend instance."""

    def __init__(self) -> None:
        # Connections whose server process said it is going away (a FATAL
        # message that arrived while they sat idle in the pool), and those
        # already set up (notice handler, isolation level).
        self._doomed: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()
        self._adopted: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()

    def adopted(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        return conn in self._adopted

    async def adopt(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Set a pooled connection up: remember when the server announces it closes
        it, and pin READ COMMITTED (the pool's ``configure``; on first sight for an
        injected pool)."""
        ref = weakref.ref(conn)
        doomed = self._doomed

        def on_notice(diag: psycopg.errors.Diagnostic) -> None:
            target = ref()
            if target is not None and diag.severity_nonlocalized in {"FATAL", "PANIC"}:
                doomed.add(target)

        conn.add_notice_handler(on_notice)
        await conn.execute(_PIN)
        if not conn.autocommit:
            await conn.commit()
        self._adopted.add(conn)

    def usable(self, conn: psycopg.AsyncConnection[Any]) -> bool:
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
            if conn in self._doomed:
                return False
            pgconn.consume_input()
        except psycopg.Error:
            return False
        return pgconn.transaction_status == pq.TransactionStatus.IDLE


def make_pool(
    conninfo: str,
    health: ConnectionHealth,
    *,
    min_size: int,
    max_size: int,
    pool_timeout: float,
    prepare_threshold: int | None,
    name: str,
) -> AsyncConnectionPool[Any]:
    """A pool for ``conninfo`` (not opened), its connections set up by ``health``.

    A connection string libpq cannot parse raises :class:`ConfigurationError`,
    without its secrets (libpq quotes the token it refused, which can be the
    password).
    """
    try:
        conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        raise ConfigurationError(
            f"invalid PostgreSQL URL or conninfo: {redact(str(exc), url_secrets(conninfo))}"
        ) from None
    return AsyncConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        open=False,
        timeout=float(pool_timeout),
        kwargs={"autocommit": True, "prepare_threshold": prepare_threshold},
        configure=health.adopt,
        name=name,
    )
