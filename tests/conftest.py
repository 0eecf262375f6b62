"""Shared fixtures: where the test servers are, and per-test isolated backend URLs.

Tests that need a server fail loudly when it is missing: they never skip.
The shared servers (Redis on 6379, PostgreSQL on 5432) are only used with a
prefix or schema of the test's own. Tests that kill, pause or restart a
server start their own (see ``tests/support``).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

REDIS_URL = os.environ.get("TENURE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "TENURE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

BACKENDS = ["memory", "sqlite", "redis", "postgres"]


def _require_tcp(url: str, what: str) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    assert port is not None, url
    try:
        with socket.create_connection((host, port), timeout=2):
            pass
    except OSError as exc:
        pytest.fail(f"{what} is required by this test but {host}:{port} is unreachable: {exc}")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The shared Redis server's URL (``TENURE_TEST_REDIS_URL``); fails if unreachable."""
    _require_tcp(REDIS_URL, "Redis")
    return REDIS_URL


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The shared PostgreSQL server's URL (``TENURE_TEST_POSTGRES_URL``); fails if unreachable."""
    _require_tcp(POSTGRES_URL, "PostgreSQL")
    return POSTGRES_URL


@pytest.fixture
def unique() -> str:
    """A short name no other test uses (for key prefixes, schemas, topics)."""
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "tenure.db"


def isolated_url(kind: str, *, unique: str, tmp_path: Path) -> str:
    """A URL of backend ``kind`` that shares no state with any other test.

    sqlite: a file in the test's tmp dir; redis: a key prefix of its own;
    postgres: a schema of its own (dropped by the ``backend_url`` fixture).
    """
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / f'{unique}.db'}"
    if kind == "redis":
        _require_tcp(REDIS_URL, "Redis")
        sep = "&" if "?" in REDIS_URL else "?"
        # The shared server may have started moments ago (CI): its restart
        # quarantine is tested on servers of the tests' own, not here.
        return f"{REDIS_URL}{sep}prefix=tenure-test-{unique}:&quarantine=off"
    if kind == "postgres":
        _require_tcp(POSTGRES_URL, "PostgreSQL")
        sep = "&" if "?" in POSTGRES_URL else "?"
        return f"{POSTGRES_URL}{sep}schema=tenure_test_{unique}"
    raise AssertionError(kind)


def drop_postgres_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                psycopg.sql.Identifier(schema)
            )
        )


@pytest.fixture(params=BACKENDS)
def backend_url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    """One isolated URL per backend; tests using it run once for each backend."""
    kind: str = request.param
    yield isolated_url(kind, unique=unique, tmp_path=tmp_path)
    if kind == "postgres":
        drop_postgres_schema(f"tenure_test_{unique}")
