"""The fence for SQL writes: the highest token that has written a key, checked
and recorded inside the writer's own transaction.

A check made before a write, in a transaction of its own, leaves a gap in which
a newer owner can write first; the stale write then lands after it. Here the
check is one statement in the caller's transaction: it records the token when
it is at least the highest recorded for the key, and otherwise refuses. On
PostgreSQL the recorded row stays locked until the transaction ends, so fenced
transactions on one key commit in token order; SQLite has one writer at a time.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from typing import Any

from .._errors import InvalidArgument, TenureError
from .._validate import check_name

__all__ = ["FenceRefused", "SqlFence", "check_token"]

# The SQLSTATE of a refusal raised by the PostgreSQL fence function (class
# "TF" is not used by PostgreSQL): a refusal inside a pipeline aborts the
# statements around it, which a result checked in Python could not do.
REFUSED_SQLSTATE = "TF409"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,55}")


class FenceRefused(TenureError):
    """A fenced write was refused: its transaction must not commit.

    Either ``token`` is lower than ``highest``, the highest token that has
    written ``key``, or the write carried no token at all (``token is None``):
    a fence fails closed. The fenced stores and savers have rolled the write
    back when they raise it; a caller of :meth:`SqlFence.check` rolls back its
    own transaction. The writer has lost the key: retrying with the same
    token can never succeed.
    """

    def __init__(self, key: str, token: int | None, highest: int | None) -> None:
        self.key = key
        self.token = token
        self.highest = highest
        if token is None:
            message = f"fenced write to {key!r} refused: it carries no fencing token"
        else:
            message = (
                f"fenced write to {key!r} refused: token {token} is lower than {highest}, "
                "the highest token that has written it (a newer owner has taken over)"
            )
        super().__init__(message)


def check_token(token: object) -> int:
    """``token`` as a fencing token (an int in 0 .. 2**63 - 1), else InvalidArgument."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidArgument(
            f"token must be an int (the lease's fencing token), got {type(token).__name__}"
        )
    if not 0 <= token < 2**63:
        raise InvalidArgument(f"token must be between 0 and 2**63 - 1, got {token}")
    return token


def _fenced(key: str, token: int | None) -> tuple[bytes, int]:
    check_name(key, "key")
    if token is None:
        raise FenceRefused(key, None, None)
    return key.encode("utf-8"), check_token(token)


def _driver(conn: object) -> str:
    """Which of the four supported drivers ``conn`` belongs to."""
    if isinstance(conn, sqlite3.Connection):
        return "sqlite3"
    module = type(conn).__module__
    if module.startswith("psycopg"):
        return "psycopg"
    if module.startswith("aiosqlite"):
        return "aiosqlite"
    raise InvalidArgument(
        "conn must be a psycopg 3 connection, a sqlite3 connection or an aiosqlite "
        f"connection, got {type(conn).__name__}"
    )


@dataclass(frozen=True, slots=True)
class SqlFence:
    """Fences writes by key in a table of the database being written to.

    ``table`` (default ``tenure_fence``) holds, per key, the highest token
    that has written it; ``schema`` is the PostgreSQL schema (default: the
    search path) or the SQLite database name (``main``, an attached one).
    :meth:`setup` creates the table (on PostgreSQL also the function
    ``<table>_check`` that the check calls); it is idempotent.

    :meth:`check` runs in the caller's transaction, on the connection that
    makes the write, and raises :class:`FenceRefused` when the token is lower
    than the highest recorded for the key, or None. An equal token passes: one
    owner writes many times. After a refusal the transaction must be rolled
    back (on PostgreSQL it is already aborted); on SQLite the check can come
    anywhere before the commit, on PostgreSQL anywhere in the transaction,
    pipelines included (there the refusal is raised at the pipeline's sync:
    :meth:`refusal` turns that error into :class:`FenceRefused`).

    Keys are any non-empty str and are stored as UTF-8 bytes, so they
    round-trip exactly (NUL included).
    """

    table: str = "tenure_fence"
    schema: str | None = None

    def __post_init__(self) -> None:
        for name, ident in (("table", self.table), ("schema", self.schema)):
            if ident is not None and (
                not isinstance(ident, str) or not _IDENTIFIER.fullmatch(ident)
            ):
                raise InvalidArgument(
                    f"{name} must be a plain SQL identifier of at most 56 characters, got {ident!r}"
                )

    # -- statements ------------------------------------------------------------------

    def _qualified(self, name: str) -> str:
        # Identifiers are checked against _IDENTIFIER: quoting them is enough.
        return f'"{self.schema}"."{name}"' if self.schema else f'"{name}"'

    @property
    def _pg_function(self) -> str:
        return self._qualified(f"{self.table}_check")

    def _pg_setup(self) -> list[str]:
        table = self._qualified(self.table)
        statements = [
            f"CREATE TABLE IF NOT EXISTS {table} (key bytea PRIMARY KEY, token bigint NOT NULL)",
            f"""CREATE OR REPLACE FUNCTION {self._pg_function}(fence_key bytea, fence_token bigint)
RETURNS bigint LANGUAGE plpgsql AS $fence$
DECLARE highest bigint;
BEGIN
  -- The row stays locked until the commit: fenced writes of one key commit
  -- in the order they took it. It is rewritten only when the token rises,
  -- not at each write of one owner.
  SELECT f.token INTO highest FROM {table} AS f WHERE f.key = fence_key FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    INSERT INTO {table} AS f (key, token) VALUES (fence_key, fence_token)
    ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token WHERE f.token < EXCLUDED.token
    RETURNING f.token INTO highest;
    IF highest IS NULL THEN  -- written meanwhile (and now locked): look again
      SELECT f.token INTO highest FROM {table} AS f WHERE f.key = fence_key;
    END IF;
  END IF;
  IF highest > fence_token THEN
    RAISE EXCEPTION 'fenced write refused: token % is lower than %', fence_token, highest
      USING ERRCODE = '{REFUSED_SQLSTATE}', DETAIL = highest::text;
  ELSIF highest < fence_token THEN
    UPDATE {table} AS f SET token = fence_token WHERE f.key = fence_key;
  END IF;
  RETURN fence_token;
END
$fence$""",
        ]
        if self.schema:
            statements.insert(0, f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        return statements

    @property
    def pg_check(self) -> str:
        """The PostgreSQL check, one statement with two parameters: key (bytes), token."""
        return f"SELECT {self._pg_function}(%s, %s)"

    def _sqlite_setup(self) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {self._qualified(self.table)}"
            " (key BLOB PRIMARY KEY, token INTEGER NOT NULL) WITHOUT ROWID"
        )

    @property
    def _sqlite_check(self) -> str:
        return (
            f"INSERT INTO {self._qualified(self.table)} AS f (key, token) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET token = excluded.token"
            " WHERE f.token <= excluded.token RETURNING token"
        )

    @property
    def _sqlite_highest(self) -> str:
        return f"SELECT token FROM {self._qualified(self.table)} WHERE key = ?"

    # -- setup -------------------------------------------------------------------------

    def setup(self, conn: Any) -> None:
        """Create the fence's table (and function) on a sqlite3 or psycopg connection."""
        driver = _driver(conn)
        if driver == "sqlite3":
            conn.execute(self._sqlite_setup())
            conn.commit()
            return
        if driver != "psycopg" or not hasattr(conn, "transaction"):
            raise InvalidArgument("setup() takes a sqlite3 or psycopg.Connection; use asetup()")
        with conn.transaction():
            # Concurrent CREATE OR REPLACE FUNCTION fails on the catalog row: serialise.
            conn.execute("SELECT pg_catalog.pg_advisory_xact_lock(hashtext(%s))", (self.table,))
            for statement in self._pg_setup():
                conn.execute(statement)

    async def asetup(self, conn: Any) -> None:
        """Create the fence's table (and function) on an aiosqlite or psycopg async connection."""
        driver = _driver(conn)
        if driver == "aiosqlite":
            await conn.execute(self._sqlite_setup())
            await conn.commit()
            return
        if driver != "psycopg":
            raise InvalidArgument("asetup() takes an aiosqlite or psycopg.AsyncConnection")
        async with conn.transaction():
            await conn.execute(
                "SELECT pg_catalog.pg_advisory_xact_lock(hashtext(%s))", (self.table,)
            )
            for statement in self._pg_setup():
                await conn.execute(statement)

    # -- the check ------------------------------------------------------------------

    def check(self, conn: Any, key: str, token: int | None) -> None:
        """Record ``token`` for ``key`` in ``conn``'s transaction, or raise FenceRefused."""
        raw, checked = _fenced(key, token)
        driver = _driver(conn)
        if driver == "sqlite3":
            if conn.execute(self._sqlite_check, (raw, checked)).fetchone() is None:
                row = conn.execute(self._sqlite_highest, (raw,)).fetchone()
                raise FenceRefused(key, checked, None if row is None else int(row[0]))
            return
        try:
            conn.execute(self.pg_check, (raw, checked))
        except Exception as exc:
            refused = self.refusal(exc, key, checked)
            if refused is None:
                raise
            raise refused from None

    async def acheck(self, conn: Any, key: str, token: int | None) -> None:
        """Record ``token`` for ``key`` in ``conn``'s transaction, or raise FenceRefused."""
        raw, checked = _fenced(key, token)
        driver = _driver(conn)
        if driver == "aiosqlite":
            # One hop to aiosqlite's thread (a cursor's execute, fetch and close are three).
            if not await conn.execute_fetchall(self._sqlite_check, (raw, checked)):
                rows = list(await conn.execute_fetchall(self._sqlite_highest, (raw,)))
                raise FenceRefused(key, checked, int(rows[0][0]) if rows else None)
            return
        try:
            await conn.execute(self.pg_check, (raw, checked))
        except Exception as exc:
            refused = self.refusal(exc, key, checked)
            if refused is None:
                raise
            raise refused from None

    @staticmethod
    def refusal(exc: BaseException, key: str, token: int | None) -> FenceRefused | None:
        """The FenceRefused that a PostgreSQL error ``exc`` stands for, or None."""
        if getattr(exc, "sqlstate", None) != REFUSED_SQLSTATE:
            return None
        detail = getattr(getattr(exc, "diag", None), "message_detail", None)
        highest = int(detail) if detail and detail.isdigit() else None
        return FenceRefused(key, token, highest)
