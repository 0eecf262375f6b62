"""The contract suite against etcd: one private node per test process
(``tests/support/etcd_server.py``), a key prefix per test.

Fault tests on a 3-member cluster are in ``tests/etcd``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tenure import from_url
from tenure.backends.etcd import EtcdLeases
from tenure.testing import LeaseContract
from tests.support.etcd_server import shared_etcd
from tests.support.targets import BackendTarget


def _isolated_url(unique: str, tmp_path: Path) -> str:
    return f"{shared_etcd().url}?prefix=tenure-test-{unique}/"


TARGET = BackendTarget("etcd", isolated_url=_isolated_url)


@pytest_asyncio.fixture
async def etcd_backend(unique: str, tmp_path: Path) -> AsyncIterator[EtcdLeases]:
    backend = from_url(_isolated_url(unique, tmp_path))
    assert isinstance(backend, EtcdLeases)
    try:
        yield backend
    finally:
        await backend.aclose()


class TestEtcdLeases(LeaseContract):
    ttl_ms = 800

    @pytest_asyncio.fixture
    async def lease_provider(self, etcd_backend: EtcdLeases) -> AsyncIterator[EtcdLeases]:
        yield etcd_backend
