"""Fencing: guard downstream writes with a lease's token.

:class:`SqlFence` checks and records "the highest token that has written key
K" inside the caller's own transaction (psycopg 3, sqlite3, aiosqlite) and
raises :class:`FenceRefused` for a lower token or none; the fenced stores and
the LangGraph savers (:mod:`tenure.integrations.langgraph`) are built on it.
"""

from ._sql import FenceRefused, SqlFence
from ._stores import FencedStore, FencedValue, MemoryFencedStore, PostgresFencedStore

__all__ = [
    "FenceRefused",
    "FencedStore",
    "FencedValue",
    "MemoryFencedStore",
    "PostgresFencedStore",
    "SqlFence",
]
