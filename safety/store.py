"""The fenced store of the counter workload: a SQLite file shared by the clients.

Every access carries the caller's fencing token. With ``fencing=True`` the store
remembers the highest token it has seen (per counter) and rejects any read or
write with a lower one. Reads register their token too: a write-only check lets a
stale owner that read before its successor's read overwrite the successor's
increment. With ``fencing=False`` (the control) tokens are ignored.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["FencedStore"]


class FencedStore:
    def __init__(self, path: Path, *, fencing: bool = True) -> None:
        self.fencing = fencing
        self._db = sqlite3.connect(path, timeout=10, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout = 10000")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS counters "
            "(name TEXT PRIMARY KEY, value INTEGER NOT NULL, max_token INTEGER NOT NULL)"
        )

    def _row(self, name: str) -> tuple[int, int]:
        row = self._db.execute(
            "SELECT value, max_token FROM counters WHERE name = ?", (name,)
        ).fetchone()
        return (0, -(2**63)) if row is None else (int(row[0]), int(row[1]))

    def read(self, name: str, token: int) -> int | None:
        """The counter's value, or ``None`` when ``token`` is stale."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            value, top = self._row(name)
            if self.fencing and token < top:
                return None
            self._db.execute(
                "INSERT INTO counters (name, value, max_token) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET max_token = max(max_token, excluded.max_token)",
                (name, value, token),
            )
            return value
        finally:
            self._db.execute("COMMIT")

    def write(self, name: str, value: int, token: int) -> bool:
        """Store ``value``; ``False`` (nothing written) when ``token`` is stale."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            _, top = self._row(name)
            if self.fencing and token < top:
                return False
            self._db.execute(
                "INSERT INTO counters (name, value, max_token) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value, "
                "max_token = max(max_token, excluded.max_token)",
                (name, value, token),
            )
            return True
        finally:
            self._db.execute("COMMIT")

    def total(self) -> int:
        return int(self._db.execute("SELECT coalesce(sum(value), 0) FROM counters").fetchone()[0])

    def close(self) -> None:
        self._db.close()
