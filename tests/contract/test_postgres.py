"""The contract suites against PostgreSQL (the shared server, a schema per class).

Leases twice: real time (the server's ``clock_timestamp()``), and a frozen clock
moved by the tests (``<schema>.lease_now()`` replaced, see ``SqlClock``). Events
on real time.
Every test uses keys of its own, so one schema per class is enough; it is
dropped at the end. The server must be reachable: these tests fail, never skip.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from tenure import from_url
from tenure.backends.postgres import PostgresLeaseProvider, PostgresPubSub
from tenure.testing import Advance, LeaseContract, PubSubContract
from tests.postgres.helpers import SqlClock, drop_schema, new_schema
from tests.support.servers import POSTGRES_URL, drop_postgres_schema, require_tcp
from tests.support.targets import BackendTarget


def _isolated_url(unique: str, tmp_path: Path) -> str:
    url = require_tcp(POSTGRES_URL, "PostgreSQL")
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}schema=tenure_test_{unique}"


TARGET = BackendTarget(
    "postgres",
    isolated_url=_isolated_url,
    cleanup=lambda unique: drop_postgres_schema(f"tenure_test_{unique}"),
)


@pytest.fixture(scope="class")
def schema(postgres_url: str) -> Iterator[str]:
    name = new_schema()
    yield name
    drop_schema(postgres_url, name)


class TestPostgresLeasesRealTime(LeaseContract):
    ttl_ms = 400

    @pytest_asyncio.fixture
    async def lease_provider(
        self, postgres_url: str, schema: str
    ) -> AsyncIterator[PostgresLeaseProvider]:
        async with from_url(f"{postgres_url}?schema={schema}") as backend:
            assert isinstance(backend, PostgresLeaseProvider)
            yield backend


class TestPostgresLeasesControlledClock(LeaseContract):
    @pytest_asyncio.fixture
    async def lease_provider(
        self, postgres_url: str, schema: str
    ) -> AsyncIterator[PostgresLeaseProvider]:
        async with PostgresLeaseProvider.from_url(postgres_url, schema=schema) as backend:
            yield backend

    @pytest_asyncio.fixture
    async def sql_clock(
        self, postgres_url: str, schema: str, lease_provider: PostgresLeaseProvider
    ) -> SqlClock:
        await lease_provider.get_lease_owner("create the schema")
        clock = SqlClock(postgres_url, schema)
        await clock.set(0)
        return clock

    @pytest.fixture
    def advance(self, sql_clock: SqlClock) -> Advance:
        return sql_clock.advance

    @pytest.mark.asyncio
    async def test_the_clock_really_is_frozen(
        self, lease_provider: PostgresLeaseProvider, sql_clock: SqlClock, key: str
    ) -> None:
        # Guards the variant itself: without a frozen clock this class would
        # silently test real time with waits that are too short.
        await lease_provider.acquire_lease(key, "alice", 1000)
        first = await lease_provider.get_lease(key)
        await sql_clock.advance(250)
        second = await lease_provider.get_lease(key)
        assert first is not None and second is not None
        assert (first.ttl_ms, second.ttl_ms) == (1000, 750)


class TestPostgresPubSub(PubSubContract):
    @pytest_asyncio.fixture
    async def pubsub(self, postgres_url: str, schema: str) -> AsyncIterator[PostgresPubSub]:
        async with from_url(f"{postgres_url}?schema={schema}") as backend:
            assert isinstance(backend, PostgresPubSub)
            yield backend
