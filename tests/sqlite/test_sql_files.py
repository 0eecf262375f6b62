"""The SQLite backend's SQL lives in package data files, each one used and valid."""

from __future__ import annotations

import re
import sqlite3
from importlib import resources
from pathlib import Path

import pytest

from tenure import Capability, capabilities_of
from tenure.backends.sqlite import SqlitePubSub
from tenure.backends.sqlite._connection import create_schema, in_list, in_rows, load_sql

PACKAGE = "tenure.backends.sqlite"
SQL_NAMES = sorted(
    entry.name.removesuffix(".sql")
    for entry in (resources.files(PACKAGE) / "sql").iterdir()
    if entry.name.endswith(".sql")
)


def _module_sources() -> str:
    root = resources.files(PACKAGE)
    return "\n".join(
        entry.read_text("utf-8") for entry in root.iterdir() if entry.name.endswith(".py")
    )


def test_every_sql_file_is_loaded_by_the_backend() -> None:
    sources = _module_sources()
    unused = [name for name in SQL_NAMES if f'load_sql("{name}")' not in sources]
    assert SQL_NAMES and not unused


def test_no_sql_statement_is_left_inline() -> None:
    statements = re.compile(
        r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE)\b [^\n]*\b(FROM|INTO|SET|TABLE)\b"
    )
    inline = [
        line.strip()
        for line in _module_sources().splitlines()
        if statements.search(line) and not line.lstrip().startswith("#")
    ]
    assert inline == []


# Schema scripts: the backend's own, and the output streams' (created on first use).
SCHEMAS = [n for n in SQL_NAMES if n.startswith("schema") or n.endswith("_schema")]


# The columns of each row a ``{rows}`` marker stands for.
ROW_WIDTHS = {"lease_renew_owned": 2, "claim_extend": 3}


@pytest.mark.parametrize("name", [n for n in SQL_NAMES if n not in SCHEMAS])
def test_each_statement_prepares_against_the_schema(tmp_path: Path, name: str) -> None:
    conn = sqlite3.connect(tmp_path / "schema.db", isolation_level=None)
    try:
        create_schema(conn)
        conn.executescript(load_sql("output_schema"))
        sql = load_sql(name)
        if "{keys}" in sql:
            sql = in_list(sql, 3)
        sql = in_rows(sql, 3, ROW_WIDTHS.get(name, 1))
        assert "{" not in sql
        # EXPLAIN prepares the statement (names, columns, one statement only) without running it.
        numbered = [int(n) for n in re.findall(r"\?(\d+)", sql)]
        count = max(numbered) if numbered else sql.count("?")
        conn.execute("EXPLAIN " + sql, [None] * count).fetchall()
    finally:
        conn.close()


def test_in_list_expands_the_marker() -> None:
    assert in_list("SELECT 1 WHERE x IN ({keys})", 3) == "SELECT 1 WHERE x IN (?,?,?)"


def test_the_backend_declares_its_capabilities(tmp_path: Path) -> None:
    backend = SqlitePubSub(tmp_path / "c.db")
    assert capabilities_of(backend) == (
        Capability.RECORD
        | Capability.RENEW_MANY
        | Capability.RENEW_OWNED
        | Capability.RELEASE_WAKEUPS
        | Capability.ATOMIC_TRANSFER
        | Capability.OPERATIONS
        | Capability.EVENTS
        | Capability.DURABLE_GROUPS
        | Capability.DEDUPE
        | Capability.RECLAIM
        | Capability.BACKLOG
        | Capability.FENCED_TAKES
    )
