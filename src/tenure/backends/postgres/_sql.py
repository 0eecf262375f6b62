"""The SQL of ``sql/`` and the names composed into it: one backend instance's
schema, table, derived tables and indexes, clock function and NOTIFY channels,
and the creation of its tables at first use."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any, Self

import psycopg
from psycopg import sql

from ..._errors import ConfigurationError

__all__ = ["PgNames", "Statements", "check_identifier", "derived_name", "load"]

logger = logging.getLogger("tenure.postgres")

# One lock id for every tenure table: DDL is rare, so serialising all of it is fine.
_DDL_LOCK_ID = 0x74656E757265  # "tenure"
_MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: PostgreSQL truncates longer names silently

_TABLES = {
    "waiters": "_waiters",
    "live": "_live",
    "events": "_events",
    "groups": "_groups",
    "claims": "_claims",
}
_INDEXES = {
    "events_source": "_events_source",
    "events_keep": "_events_keep",
    "groups_alive": "_groups_alive",
    "claims_event": "_claims_event",
}

_EXISTS = sql.SQL(
    "SELECT"
    " (SELECT count(*) FROM pg_catalog.pg_class c"
    " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = %(schema)s AND c.relname = ANY(%(tables)s)) = %(n)s,"
    " EXISTS (SELECT FROM pg_catalog.pg_proc p"
    " JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace"
    " WHERE n.nspname = %(schema)s AND p.proname = 'lease_now' AND p.pronargs = 0)"
)


def load(name: str) -> str:
    """The text of ``sql/<name>.sql``, shipped as package data."""
    return (resources.files("tenure.backends.postgres") / "sql" / f"{name}.sql").read_text("utf-8")


@dataclass(frozen=True, slots=True)
class Statements:
    """A set of statements, one per field of a subclass: ``sql/<field name>.sql``."""

    @classmethod
    def rendered(cls, render: Callable[[str], str]) -> Self:
        """Every field's file, rendered by ``render`` (one instance's names composed in)."""
        return cls(**{f.name: render(f.name) for f in fields(cls)})


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


class PgNames:
    """The identifiers of one backend instance, and its statements rendered with them."""

    def __init__(self, schema: str, table: str) -> None:
        self.schema = check_identifier(schema, "schema")
        self.table = check_identifier(table, "table")
        # A NOTIFY channel is an identifier of at most 63 bytes; a hash of the
        # qualified table name fits whatever the names are.
        digest = hashlib.sha256(f"{self.schema}\0{self.table}".encode()).hexdigest()[:24]
        self.channel = f"tenure_{digest}"
        # Events have a channel of their own (payload: the topic in hex); the
        # one LISTEN connection listens on both.
        self.event_channel = f"tenure_{digest}_e"
        #: The tables that belong with ``table``, by role.
        self.tables = {k: derived_name(self.table, v) for k, v in _TABLES.items()}
        self._names = {
            "schema": sql.Identifier(self.schema),
            "table": sql.Identifier(self.schema, self.table),
            "now": sql.Identifier(self.schema, "lease_now"),
            **{k: sql.Identifier(self.schema, v) for k, v in self.tables.items()},
            # Index names take no schema: an index lives in its table's schema.
            **{k: sql.Identifier(derived_name(self.table, v)) for k, v in _INDEXES.items()},
        }

    def identifiers(self) -> dict[str, sql.Composable]:
        """The names statements are composed with (``{table}``, ``{schema}``...), by placeholder."""
        return dict(self._names)

    def render(self, name: str) -> str:
        """``sql/<name>.sql`` with the schema, table and clock names composed in."""
        return sql.SQL(load(name)).format(**self._names).as_string(None)

    async def create_leases(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The lease tables and the clock function, unless they exist."""
        tables = [self.table, self.tables["waiters"], self.tables["live"]]
        await self._ensure(conn, "schema", tables, clock=True)

    async def create_events(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The event tables, unless they exist."""
        tables = [self.tables[t] for t in ("events", "groups", "claims")]
        await self._ensure(conn, "events_schema", tables)

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
        params = {"schema": self.schema, "tables": tables, "n": len(tables)}
        async with conn.transaction():
            # The second check below must see what another session committed
            # while this one waited for the lock: a fresh snapshot per statement.
            await conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            row = await (await conn.execute(_EXISTS, params)).fetchone()
            assert row is not None
            if row[0] and (row[1] or not clock):
                return
            # CREATE … IF NOT EXISTS still races on the catalogs' unique
            # indexes when two sessions run it at once; the lock serialises them.
            await conn.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s)", (_DDL_LOCK_ID,))
            row = await (await conn.execute(_EXISTS, params)).fetchone()
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
