"""Where the shared test servers are, and the checks that fail (never skip) without them."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

import pytest

__all__ = ["AMQP_URL", "POSTGRES_URL", "REDIS_URL", "drop_postgres_schema", "require_tcp"]

REDIS_URL = os.environ.get("TENURE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("TENURE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
POSTGRES_URL = os.environ.get(
    "TENURE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def require_tcp(url: str, what: str) -> str:
    """``url`` if its server answers on TCP; otherwise the test fails, loudly."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    assert port is not None, url
    try:
        with socket.create_connection((host, port), timeout=2):
            pass
    except OSError as exc:
        pytest.fail(f"{what} is required by this test but {host}:{port} is unreachable: {exc}")
    return url


def drop_postgres_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                psycopg.sql.Identifier(schema)
            )
        )
