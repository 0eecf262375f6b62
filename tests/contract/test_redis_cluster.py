"""The contract suite against a Redis Cluster (``redis+cluster://``).

Three primaries started once for this module by tests/support (never the shared
server); each test has a key prefix of its own, so its keys spread over the
three nodes. The quarantine is on: the nodes count as new (no marker,
appendfsync always). ``RedisClusterPubSub`` declares no ``BACKLOG`` (its index
would span slots): in place of the suite's backlog test, one that checks the
declaration and that the thread runtime refuses the backend (nothing skipped).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from tenure import Capability, ConfigurationError, ThreadRuntime, capabilities_of
from tenure.backends.redis import RedisClusterPubSub
from tenure.testing import LeaseContract, PubSubContract
from tests.support.redis_server import ClusterServers

from ..redis.helpers import backend_on_prefix


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterServers]:
    with ClusterServers(persistence=True) as servers:
        yield servers


@pytest_asyncio.fixture
async def cluster_backend(
    cluster: ClusterServers, unique: str
) -> AsyncIterator[RedisClusterPubSub]:
    nodes = [server.url for server in cluster.servers]
    async with backend_on_prefix(cluster.url, unique, nodes, one_by_one=True) as backend:
        assert isinstance(backend, RedisClusterPubSub)
        yield backend


class TestRedisClusterLeases(LeaseContract):
    ttl_ms = 800

    @pytest_asyncio.fixture
    async def lease_provider(
        self, cluster_backend: RedisClusterPubSub
    ) -> AsyncIterator[RedisClusterPubSub]:
        yield cluster_backend


class TestRedisClusterPubSub(PubSubContract):
    @pytest_asyncio.fixture
    async def pubsub(
        self, cluster_backend: RedisClusterPubSub
    ) -> AsyncIterator[RedisClusterPubSub]:
        yield cluster_backend

    @pytest.mark.asyncio
    async def test_backlog_lists_topics_with_unacknowledged_events(
        self, pubsub: RedisClusterPubSub, topic: str
    ) -> None:
        assert Capability.BACKLOG not in capabilities_of(pubsub)

        async def handler(run: object) -> None:
            pass

        with pytest.raises(ConfigurationError, match="BACKLOG"):
            ThreadRuntime(pubsub, handler)
