"""Where the shared test servers are, and the checks that fail (never skip) without them."""

from __future__ import annotations

import os
import socket
import uuid
from urllib.parse import urlsplit

import pytest

__all__ = [
    "AMQP_URL",
    "POSTGRES_URL",
    "REDIS_URL",
    "RUN_TAG",
    "drop_postgres_schema",
    "leftovers",
    "require_tcp",
    "unique_name",
]

REDIS_URL = os.environ.get("TENURE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("TENURE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
POSTGRES_URL = os.environ.get(
    "TENURE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

# Every name this test run makes on a shared server (a Redis key prefix, a
# PostgreSQL schema) carries this tag, so that what the run left behind can be
# listed once it is over (``leftovers``), whatever else uses the servers.
RUN_TAG = "r" + uuid.uuid4().hex[:6]


def unique_name() -> str:
    """A short name no other test uses, tagged with this run's :data:`RUN_TAG`."""
    return f"t{RUN_TAG}{uuid.uuid4().hex[:8]}"


def leftovers() -> list[str]:
    """What this run left on the shared Redis and PostgreSQL: keys, then schemas.

    Servers that do not answer are not looked at (the tests that need them
    failed already).
    """
    import psycopg

    import redis

    found: list[str] = []
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_timeout=5, socket_connect_timeout=2)
        try:
            found += sorted(k.decode() for k in client.scan_iter(match=f"*{RUN_TAG}*", count=1000))
        finally:
            client.close()
    except redis.RedisError:
        pass
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=2) as conn:
            rows = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s ORDER BY 1",
                (f"%{RUN_TAG}%",),
            ).fetchall()
        found += [f"schema {name}" for (name,) in rows]
    except psycopg.Error:
        pass
    return found


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
