"""Fencing: guard downstream writes with a lease's token.

A lease alone cannot stop a holder that was paused (a GC pause, a stopped VM,
``SIGSTOP``) for longer than its TTL: when it wakes up it still believes it
owns the key and writes, while another process has taken over. The fencing
token fixes that. Every grant carries a token that strictly increases each time
the key changes hands; the store that receives the writes remembers the highest
token it has seen per key and rejects a write that carries a lower one. The
check and the write must be one atomic step *in the store*.

::

    async with tenure.hold(provider, key, owner, ttl_ms=10_000) as lease:
        result = await compute()
        if not await store.write(key, lease.token, result):
            ...  # a newer owner has written: our result is stale, drop it

This module ships two stores that show the pattern: :class:`MemoryFencedStore`
(one process) and :class:`PostgresFencedStore` (one ``INSERT … ON CONFLICT``
statement). Apply the same idea to your own store: keep the token next to the
data and make the write conditional on ``stored_token <= new_token``.
"""

from __future__ import annotations

import abc
import asyncio
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._errors import BackendClosed, BackendUnavailable, InvalidArgument
from ._lifecycle import AsyncCloseable
from ._url_options import redact, redact_url
from ._validate import check_name

if TYPE_CHECKING:
    import psycopg

__all__ = ["FencedStore", "FencedValue", "MemoryFencedStore", "PostgresFencedStore"]


@dataclass(frozen=True, slots=True)
class FencedValue:
    """What a fenced store holds for a key: the value and the token that wrote it."""

    token: int
    value: Any


def _check_token(token: Any) -> int:
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidArgument(
            f"token must be an int (the lease's fencing token), got {type(token).__name__}"
        )
    if not 0 <= token < 2**63:
        raise InvalidArgument(f"token must be between 0 and 2**63 - 1, got {token}")
    return token


class FencedStore(AsyncCloseable, abc.ABC):
    """A store that rejects writes carrying a token lower than the highest it has seen for the key.

    ``write`` applies the value when ``token`` is at least the highest token
    seen for ``key`` (the same holder can write many times) and returns True;
    otherwise it changes nothing and returns False. The comparison and the
    write are one atomic step.
    """

    @abc.abstractmethod
    async def write(self, key: str, token: int, value: Any) -> bool:
        """Write ``value`` under ``key`` if ``token`` is not stale; True when applied."""

    @abc.abstractmethod
    async def read(self, key: str) -> FencedValue | None:
        """The current value and the token that wrote it, or None if never written."""

    async def aclose(self) -> None:
        """Release the store's resources."""


class MemoryFencedStore(FencedStore):
    """A fenced store in this process's memory (for tests and examples)."""

    def __init__(self) -> None:
        self._data: dict[str, FencedValue] = {}

    async def write(self, key: str, token: int, value: Any) -> bool:
        check_name(key, "key")
        _check_token(token)
        current = self._data.get(key)
        if current is not None and token < current.token:
            return False
        self._data[key] = FencedValue(token, value)
        return True

    async def read(self, key: str) -> FencedValue | None:
        check_name(key, "key")
        return self._data.get(key)


def _password(conninfo: str) -> str | None:
    try:
        from psycopg.conninfo import conninfo_to_dict

        password = conninfo_to_dict(conninfo).get("password")
    except Exception:  # unparsable (or no driver): redact() still hides password=… fields
        return None
    return str(password) if password else None


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class PostgresFencedStore(FencedStore):
    """A fenced store in a PostgreSQL table: ``key bytea primary key, token bigint, value json``.

    ``conninfo`` is a libpq URL or DSN (``postgresql://user@host/db``). The table
    (default ``tenure_fenced`` in ``schema``, default the search path) is created
    on first use. A write is one ``INSERT … ON CONFLICT DO UPDATE … WHERE
    stored.token <= new.token`` statement, so the check and the write are
    atomic even with many writers. Keys are stored as UTF-8 bytes, so any key
    (NUL included) round-trips. Values must be JSON-serialisable; they are
    kept as ``json`` (not ``jsonb``, which cannot hold a NUL in a string).

    Uses one connection (autocommit), opened lazily; database errors raise
    :class:`~tenure.BackendUnavailable` without the password.
    """

    def __init__(
        self, conninfo: str, *, table: str = "tenure_fenced", schema: str | None = None
    ) -> None:
        for name, ident in (("table", table), ("schema", schema)):
            if ident is not None and not _IDENTIFIER.fullmatch(ident):
                raise InvalidArgument(f"{name} must be a plain SQL identifier, got {ident!r}")
        self._conninfo = conninfo
        self._secrets = [_password(conninfo)]
        shown = redact_url(conninfo) if "://" in conninfo else conninfo
        self._shown = redact(shown, self._secrets)
        self._table = table
        self._schema = schema
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"PostgresFencedStore({self._shown!r}, table={self._table!r})"

    def _qualified(self) -> Any:
        from psycopg import sql

        if self._schema is None:
            return sql.Identifier(self._table)
        return sql.Identifier(self._schema, self._table)

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._closed:
            raise BackendClosed("PostgresFencedStore is closed")
        if self._conn is not None and not self._conn.closed:
            return self._conn
        import psycopg
        from psycopg import sql

        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        try:
            if self._schema is not None:
                await conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema))
                )
            await conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} ("
                    " key bytea PRIMARY KEY, token bigint NOT NULL, value json)"
                ).format(self._qualified())
            )
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        return conn

    async def _run(self, query: Any, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        import psycopg

        async with self._lock:
            try:
                conn = await self._connection()
                cur = await conn.execute(query, params)
                return await cur.fetchall()
            except psycopg.Error as exc:
                if self._conn is not None and self._conn.closed:
                    self._conn = None
                detail = redact(str(exc).strip(), self._secrets)
                raise BackendUnavailable(
                    f"PostgreSQL fenced store at {self._shown} failed: "
                    f"{type(exc).__name__}: {detail}"
                ) from exc

    async def write(self, key: str, token: int, value: Any) -> bool:
        from psycopg import sql
        from psycopg.types.json import Json

        check_name(key, "key")
        _check_token(token)
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"value must be JSON-serialisable: {exc}") from None
        query = sql.SQL(
            "INSERT INTO {t} AS s (key, token, value) VALUES (%s, %s, %s)"
            " ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, value = EXCLUDED.value"
            " WHERE s.token <= EXCLUDED.token RETURNING 1"
        ).format(t=self._qualified())
        rows = await self._run(query, (key.encode("utf-8"), token, Json(value)))
        return bool(rows)

    async def read(self, key: str) -> FencedValue | None:
        from psycopg import sql

        check_name(key, "key")
        query = sql.SQL("SELECT token, value FROM {t} WHERE key = %s").format(t=self._qualified())
        rows = await self._run(query, (key.encode("utf-8"),))
        if not rows:
            return None
        token, value = rows[0]
        return FencedValue(int(token), value)

    async def aclose(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
