"""``min_replicas``: an acknowledged grant is on the replicas, so a failover keeps it.

A master with one replica of the test's own; the replica is paused (SIGSTOP)
to stand for one that lags.
"""

from __future__ import annotations

import pytest

from tenure import BackendUnavailable, InvalidArgument
from tenure.backends.redis import RedisStreamsPubSub

from ..support.redis_server import RedisServer
from .conftest import MakeBackend

TTL = 5000


@pytest.mark.asyncio
async def test_min_replicas_grants_only_what_a_replica_has(make_backend: MakeBackend) -> None:
    with RedisServer(persistence=True) as master, RedisServer() as replica:
        replica.replicate(master)
        backend = make_backend(master.url + "?min_replicas=1&replica_wait_ms=300")
        granted = await backend.acquire_lease("k", "alice", TTL)
        assert granted.acquired
        assert await backend.renew_lease("k", "alice", TTL)
        # The replica has the grant the caller saw: a failover keeps it.
        assert replica.command("GET", "tenure:{k}:lease") is not None

        replica.pause()  # a replica that lags
        try:
            with pytest.raises(BackendUnavailable, match="reached 0 of min_replicas=1"):
                await backend.acquire_lease("new", "bob", TTL)
            # The grant nobody was told of was undone: the key is free.
            assert await backend.get_lease("new") is None
            with pytest.raises(BackendUnavailable, match="renewal of lease 'k'"):
                await backend.renew_lease("k", "alice", TTL)
            # A renewal is not undone: alice still holds the key.
            record = await backend.get_lease("k")
            assert record is not None and record.owner == "alice"
            with pytest.raises(BackendUnavailable, match="transfer"):
                await backend.transfer_lease("k", "alice", "carol", TTL)
            assert await backend.get_lease("k") is None
        finally:
            replica.resume()


@pytest.mark.asyncio
async def test_a_failover_after_an_acknowledged_grant_keeps_the_holder(
    make_backend: MakeBackend,
) -> None:
    with RedisServer(persistence=True) as master, RedisServer() as replica:
        replica.replicate(master)
        backend = make_backend(master.url, min_replicas=1, max_ttl_ms=TTL)
        granted = await backend.acquire_lease("k", "alice", TTL)
        assert granted.acquired
        master.kill()
        replica.command("REPLICAOF", "NO", "ONE")
        promoted = make_backend(replica.url, max_ttl_ms=TTL)
        refused = await promoted.acquire_lease("k", "bob", TTL)
        assert (refused.acquired, refused.owner) == (False, "alice")


def test_min_replicas_options_are_checked() -> None:
    for bad in ({"min_replicas": -1}, {"min_replicas": True}, {"replica_wait_ms": 0}):
        with pytest.raises(InvalidArgument):
            RedisStreamsPubSub.from_url("redis://127.0.0.1:1/0", **bad)
