"""What ``tenure doctor`` checks on a PostgreSQL database (see :mod:`tenure._doctor`).

It reads through one direct connection of its own and creates nothing (the
backend creates its tables on first use).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from ..._doctor import Finding, clock_finding, ok, unsafe, warn
from ._connection import PgConnection

__all__ = ["diagnose"]


Conn = psycopg.AsyncConnection[Any]


async def diagnose(link: PgConnection, *, events: bool) -> list[Finding]:
    """The findings for ``link``'s database; ``events``: the backend keeps events too."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            link._conninfo, autocommit=True, connect_timeout=int(max(1, link.call_timeout))
        )
    except psycopg.Error as exc:
        raise link.error("tenure doctor", exc) from exc
    try:
        version = await _one(conn, "SHOW server_version")
        findings = [ok("server", f"PostgreSQL {version} at {link.where}")]
        findings.append(await _tables(conn, link, events))
        findings += [await check(conn) for check in _CHECKS]
        return findings
    except psycopg.Error as exc:
        raise link.error("tenure doctor", exc) from exc
    finally:
        await conn.close()


async def _one(conn: Conn, query: str, *params: Any) -> Any:
    row = await (await conn.execute(query, params or None)).fetchone()
    assert row is not None
    return row[0]


async def _tables(conn: Conn, link: PgConnection, events: bool) -> Finding:
    names = link.names
    tables = [names.table, names.tables["waiters"]]
    if events:
        tables += [names.tables[t] for t in ("events", "groups", "claims")]
    missing = [
        t
        for t in tables
        if await _one(conn, "SELECT to_regclass(%s)", f'"{names.schema}"."{t}"') is None
    ]
    if missing:
        return warn(
            "tables",
            f"not created yet in schema {names.schema!r}: {', '.join(missing)} (tenure "
            "creates them on first use, which needs CREATE on the schema)",
        )
    return ok("tables", f"{len(tables)} tables in schema {names.schema!r}")


async def _isolation(conn: Conn) -> Finding:
    isolation = await _one(conn, "SHOW default_transaction_isolation")
    return ok("isolation", f"server default {isolation}; tenure pins read committed per connection")


async def _durability(conn: Conn) -> Finding:
    commit = await _one(conn, "SHOW synchronous_commit")
    if commit == "off":
        return unsafe(
            "durability",
            "synchronous_commit off: a crash can undo committed grants, and their fencing "
            "tokens could be given again",
            "ALTER DATABASE ... SET synchronous_commit = on (or for tenure's role)",
        )
    return ok("durability", f"synchronous_commit {commit}")


async def _statement_timeout(conn: Conn) -> Finding:
    timeout = await _one(conn, "SHOW statement_timeout")
    ms = await _one(conn, "SELECT current_setting('statement_timeout')::interval")
    if ms and ms.total_seconds() < 1:
        return warn(
            "statement_timeout",
            f"{timeout}: a lease statement waiting on a busy row can be cancelled",
            "at least 1s, or 0",
        )
    return ok("statement_timeout", str(timeout))


async def _pooling(conn: Conn) -> Finding:
    first = await _one(conn, "SELECT pg_backend_pid()")
    second = await _one(conn, "SELECT pg_backend_pid()")
    if first != second:
        return warn(
            "pooling",
            "each statement ran on another server connection: a transaction-pooling "
            "proxy (PgBouncer). Leases work; LISTEN (wake-ups, events) needs a session",
            "pass listen_conninfo= with a direct connection string",
        )
    return ok("pooling", "a session connection (or session pooling)")


async def _clock(conn: Conn) -> Finding:
    sent = time.time()
    server = float(await _one(conn, "SELECT extract(epoch FROM clock_timestamp())"))
    return clock_finding(server - (sent + time.time()) / 2)


_CHECKS: tuple[Callable[[Conn], Awaitable[Finding]], ...] = (
    _isolation,
    _durability,
    _statement_timeout,
    _pooling,
    _clock,
)
