"""The output store on a Redis Cluster (three primaries of the test's own).

The thread runtime refuses a cluster (it has no backlog scan there), so the store
is exercised directly: the fenced append runs in the lease key's slot on every
node, a reader on another client reads and waits, and a stale writer is refused.
"""

from __future__ import annotations

import asyncio

import pytest

from tenure import Fenced
from tenure.backends.redis import RedisClusterPubSub
from tenure.backends.redis._output import RedisOutput
from tenure.runtime._output import Retention, WriteFence

from ..support.redis_server import ClusterServers
from .conftest import MakeBackend
from .test_cluster import cluster

__all__ = ["cluster"]  # the fixture


@pytest.mark.asyncio
async def test_fenced_appends_and_blocking_reads_in_each_keys_slot(
    cluster: ClusterServers, make_backend: MakeBackend
) -> None:
    writer_backend = make_backend(cluster.url)
    reader_backend = make_backend(cluster.url)
    assert isinstance(writer_backend, RedisClusterPubSub)
    writer, reader = RedisOutput(writer_backend), RedisOutput(reader_backend)
    for i in range(6):  # keys spread over the slots of the 3 nodes
        key = f"thread-{i}"
        granted = await writer_backend.acquire_lease(key, "owner", 30_000)
        assert granted.acquired and granted.token is not None
        fence = WriteFence(key, "owner", granted.token)
        waiting = asyncio.ensure_future(reader.wait(key, 0, 20))
        assert await writer.append(key, fence, ['{"a":1}', '{"a":2}'], Retention()) == 2
        assert [p for p, _ in await waiting] == [1, 2]
        assert await reader.read(key, 1, 10) == (2, [(2, '{"a":2}')])
        with pytest.raises(Fenced):
            await writer.append(
                key, WriteFence(key, "owner", granted.token - 1), ["{}"], Retention()
            )
        assert (await reader.read(key, 0, 10))[0] == 2
        await writer_backend.release_lease(key, "owner")
