"""What ``tenure doctor`` checks on a PostgreSQL database (see :mod:`tenure._doctor`).

It reads through one direct connection of its own and creates nothing (the
backend creates its tables on first use).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import psycopg

from ..._doctor import Finding, ok, unsafe, warn

if TYPE_CHECKING:
    from ._leases import PostgresLeaseProvider

__all__ = ["diagnose"]

_SKEW_WARN_S = 1.0


async def diagnose(backend: PostgresLeaseProvider) -> list[Finding]:
    link = backend._conn
    try:
        conn = await psycopg.AsyncConnection.connect(
            link._conninfo, autocommit=True, connect_timeout=int(max(1, link.call_timeout))
        )
    except psycopg.Error as exc:
        raise link.error("tenure doctor", exc) from exc
    try:
        return await _checks(conn, backend)
    except psycopg.Error as exc:
        raise link.error("tenure doctor", exc) from exc
    finally:
        await conn.close()


async def _one(conn: psycopg.AsyncConnection[Any], query: str, *params: Any) -> Any:
    row = await (await conn.execute(query, params or None)).fetchone()
    assert row is not None
    return row[0]


async def _checks(
    conn: psycopg.AsyncConnection[Any], backend: PostgresLeaseProvider
) -> list[Finding]:
    link = backend._conn
    version = await _one(conn, "SHOW server_version")
    findings = [ok("server", f"PostgreSQL {version} at {link.where}")]
    tables = [link.table, link._table_names["waiters"]]
    if getattr(backend, "capabilities", None) is not None and hasattr(backend, "publish"):
        tables += [link._table_names[t] for t in ("events", "groups", "claims")]
    missing = [
        t
        for t in tables
        if await _one(conn, "SELECT to_regclass(%s)", f'"{link.schema}"."{t}"') is None
    ]
    if missing:
        findings.append(
            warn(
                "tables",
                f"not created yet in schema {link.schema!r}: {', '.join(missing)} (tenure "
                "creates them on first use, which needs CREATE on the schema)",
            )
        )
    else:
        findings.append(ok("tables", f"{len(tables)} tables in schema {link.schema!r}"))
    isolation = await _one(conn, "SHOW default_transaction_isolation")
    findings.append(
        ok("isolation", f"server default {isolation}; tenure pins read committed per connection")
    )
    commit = await _one(conn, "SHOW synchronous_commit")
    if commit == "off":
        findings.append(
            unsafe(
                "durability",
                "synchronous_commit off: a crash can undo committed grants, and their fencing "
                "tokens could be given again",
                "ALTER DATABASE ... SET synchronous_commit = on (or for tenure's role)",
            )
        )
    else:
        findings.append(ok("durability", f"synchronous_commit {commit}"))
    timeout = await _one(conn, "SHOW statement_timeout")
    ms = await _one(conn, "SELECT current_setting('statement_timeout')::interval")
    if ms and ms.total_seconds() < 1:
        findings.append(
            warn(
                "statement_timeout",
                f"{timeout}: a lease statement waiting on a busy row can be cancelled",
                "at least 1s, or 0",
            )
        )
    else:
        findings.append(ok("statement_timeout", str(timeout)))
    first = await _one(conn, "SELECT pg_backend_pid()")
    second = await _one(conn, "SELECT pg_backend_pid()")
    if first != second:
        findings.append(
            warn(
                "pooling",
                "each statement ran on another server connection: a transaction-pooling "
                "proxy (PgBouncer). Leases work; LISTEN (wake-ups, events) needs a session",
                "pass listen_conninfo= with a direct connection string",
            )
        )
    else:
        findings.append(ok("pooling", "a session connection (or session pooling)"))
    sent = time.time()
    server = float(await _one(conn, "SELECT extract(epoch FROM clock_timestamp())"))
    skew = server - (sent + time.time()) / 2
    text = f"the server's clock is {skew * 1000:+.0f} ms from this host's"
    if abs(skew) > _SKEW_WARN_S:
        findings.append(warn("clock", text, "run NTP on both hosts"))
    else:
        findings.append(ok("clock", text))
    return findings
