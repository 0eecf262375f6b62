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
(one process) and :class:`PostgresFencedStore` (the fence's check and the write
in one transaction). For your own tables, :class:`SqlFence` puts the check into
your transaction (psycopg 3, sqlite3, aiosqlite); the LangGraph savers in
:mod:`tenure.integrations.langgraph` are built on it.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .._errors import BackendClosed, ConfigurationError, InvalidArgument
from .._lifecycle import AsyncCloseable
from .._validate import check_name
from ._sql import check_token

T = TypeVar("T")

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,49}")

__all__ = ["FencedStore", "FencedValue", "MemoryFencedStore", "PostgresFencedStore"]


@dataclass(frozen=True, slots=True)
class FencedValue:
    """What a fenced store holds for a key: the value and the token that wrote it."""

    token: int
    value: Any


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
        check_token(token)
        current = self._data.get(key)
        if current is not None and token < current.token:
            return False
        self._data[key] = FencedValue(token, value)
        return True

    async def read(self, key: str) -> FencedValue | None:
        check_name(key, "key")
        return self._data.get(key)


class PostgresFencedStore(FencedStore):
    """A fenced store in PostgreSQL: ``key bytea primary key, token bigint, value json``.

    ``conninfo`` is a libpq URL or DSN (``postgresql://user@host/db``). The
    table (default ``tenure_fenced`` in ``schema``, default the search path)
    and its fence (:class:`~tenure.fencing.SqlFence`, table ``<table>_fence``)
    are created on first use. A write is the fence's check and the upsert of
    the value in one pipeline: one round trip, one transaction, so a stale
    write changes nothing even with many writers. Keys are stored as UTF-8
    bytes, so any key (NUL included) round-trips. Values must be
    JSON-serialisable; they are kept as ``json`` (not ``jsonb``, which cannot
    hold a NUL in a string).

    Connections come from a pool on tenure's PostgreSQL connection layer
    (``max_size`` connections, opened on first use); each call ends within
    ``call_timeout`` seconds, and database errors raise
    :class:`~tenure.BackendUnavailable` (or ConfigurationError for wrong
    credentials) without the password.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = "tenure_fenced",
        schema: str | None = None,
        max_size: int = 4,
        call_timeout: float = 10.0,
    ) -> None:
        from ._sql import SqlFence

        for name, ident in (("table", table), ("schema", schema)):
            if ident is not None and not _IDENTIFIER.fullmatch(ident):
                raise InvalidArgument(
                    f"{name} must be a plain SQL identifier of at most 50 characters, got {ident!r}"
                )
        try:
            from ..backends.postgres._connection import PgConnection
        except ImportError:  # pragma: no cover - the extra is installed in the tests
            raise ConfigurationError(
                "PostgresFencedStore needs psycopg: pip install 'tenure[postgres]'"
            ) from None
        self._fence = SqlFence(f"{table}_fence", schema=schema)
        self._table = table
        self._schema = schema
        self._pg = PgConnection(
            conninfo,
            pool=None,
            schema=schema or "public",
            table=table,
            min_size=0,
            max_size=max_size,
            pool_timeout=call_timeout,
            call_timeout=call_timeout,
            prepare_threshold=None,
            listen_conninfo=None,
            on_notify=lambda _channel: None,
            on_gap=lambda: None,
            component="PostgresFencedStore",
        )

    def __repr__(self) -> str:
        return f"PostgresFencedStore({self._pg.where!r}, table={self._table!r})"

    @property
    def _qualified(self) -> str:
        # Identifiers are checked against _IDENTIFIER: quoting them is enough.
        if self._schema is None:
            return f'"{self._table}"'
        return f'"{self._schema}"."{self._table}"'

    async def _create(self, conn: Any) -> None:
        """The fence's tables and the value table, unless they exist."""
        await self._fence.asetup(conn)
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self._qualified}"
            " (key bytea PRIMARY KEY, token bigint NOT NULL, value json)"
        )

    async def _run(self, op: str, work: Callable[[Any], Awaitable[T]]) -> T:
        import psycopg
        from psycopg_pool import PoolTimeout

        if self._pg.closed:
            raise BackendClosed("PostgresFencedStore is closed")
        await self._pg.prepare(op, self._create)

        async def call() -> T:
            async with self._pg.pool.connection() as conn:
                return await work(conn)

        try:
            return await self._pg.bounded(op, call())
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._pg.error(op, exc) from exc

    async def write(self, key: str, token: int, value: Any) -> bool:
        from psycopg.types.json import Json

        check_name(key, "key")
        check_token(token)
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"value must be JSON-serialisable: {exc}") from None
        upsert = (
            f"INSERT INTO {self._qualified} (key, token, value) VALUES (%s, %s, %s)"
            " ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, value = EXCLUDED.value"
        )

        async def work(conn: Any) -> bool:
            try:
                # One implicit transaction up to the pipeline's sync: a refused
                # check aborts the upsert queued behind it.
                async with conn.pipeline():
                    await conn.execute(self._fence.pg_check, (key.encode("utf-8"), token))
                    await conn.execute(upsert, (key.encode("utf-8"), token, Json(value)))
            except Exception as exc:
                if self._fence.refusal(exc, key, token) is None:
                    raise
                return False
            return True

        return await self._run("write", work)

    async def read(self, key: str) -> FencedValue | None:
        check_name(key, "key")

        async def work(conn: Any) -> list[tuple[Any, ...]]:
            query = f"SELECT token, value FROM {self._qualified} WHERE key = %s"
            cur = await conn.execute(query, (key.encode("utf-8"),))
            rows: list[tuple[Any, ...]] = await cur.fetchall()
            return rows

        rows = await self._run("read", work)
        if not rows:
            return None
        token, value = rows[0]
        return FencedValue(int(token), value)

    async def aclose(self) -> None:
        await self._pg.aclose()
