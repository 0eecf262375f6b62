"""Redis Cluster: the URL, the client types, one slot per script, a slot
migration while a lease is held, and a FLUSHALL on one node (three primaries
of the test's own)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

import tenure
from tenure import ConfigurationError
from tenure.backends.redis import RedisClusterPubSub, RedisStreamsPubSub

from ..support.redis_server import ClusterServers, RedisServer
from .conftest import MakeBackend
from .test_state_loss import wait_uptime

SECRET = "cl-pw-9"
TTL = 3000


@pytest.fixture
def cluster() -> Iterator[ClusterServers]:
    with ClusterServers(persistence=True) as servers:
        yield servers


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis+cluster://127.0.0.1:7000/0", "one database"),
        ("redis+cluster://127.0.0.1:7000,nohost", "not host:port"),
        ("redis+cluster://127.0.0.1:7000?db=2", "db"),
        ("redis+cluster://127.0.0.1:7000?min_replicas=1", "min_replicas needs"),
        ("redis+cluster://127.0.0.1:7000?bogus=1", "unknown Redis URL option 'bogus'"),
    ],
)
def test_bad_cluster_urls_are_refused_without_the_password(url: str, match: str) -> None:
    url = url.replace("//", f"//:{SECRET}@", 1)
    with pytest.raises(ConfigurationError, match=match) as refused:
        tenure.from_url(url)
    assert SECRET not in str(refused.value)


@pytest.mark.asyncio
async def test_each_backend_class_takes_its_own_client() -> None:
    cluster = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", 7000)])
    plain = RedisStreamsPubSub.from_url("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(ConfigurationError, match="use RedisClusterPubSub"):
            RedisStreamsPubSub(cluster)
        with pytest.raises(ConfigurationError, match=r"takes a redis\.asyncio\.RedisCluster"):
            RedisClusterPubSub(plain._client)
        assert isinstance(RedisClusterPubSub(cluster), RedisClusterPubSub)
    finally:
        await cluster.aclose()
        await plain.aclose()


@pytest.mark.asyncio
async def test_keys_spread_over_nodes_and_each_script_stays_in_one_slot(
    cluster: ClusterServers, make_backend: MakeBackend
) -> None:
    backend = make_backend(cluster.url)
    assert isinstance(backend, RedisClusterPubSub)
    nodes = set()
    for key in [f"key-{i}" for i in range(30)]:
        # A script whose keys spanned slots would fail with CROSSSLOT here.
        assert (await backend.acquire_lease(key, "o", TTL)).acquired
        assert await backend.transfer_lease(key, "o", "p", TTL)
        lease, counter = backend._lease_key(key)
        assert (
            key_slot(lease) == key_slot(counter) == key_slot(backend._quarantine.marker_of(lease))
        )
        nodes.add(cluster.node_of(lease).port)
    assert len(nodes) == 3
    assert sorted(await backend.renew_leases(["key-0", "key-1"], "p", TTL)) == [True, True]
    assert len([k async for k, _ in backend.scan_leases("key-")]) == 30


def migrate_slot(
    cluster: ClusterServers, slot: int, source: RedisServer, target: RedisServer
) -> None:
    """Move ``slot`` with its keys from ``source`` to ``target`` (what
    ``redis-cli --cluster reshard`` does)."""
    source_id = source.command("CLUSTER", "MYID")
    target_id = target.command("CLUSTER", "MYID")
    target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    while keys := source.command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        source.command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
    for server in cluster.servers:
        server.command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


@pytest.mark.asyncio
async def test_a_held_lease_survives_the_migration_of_its_slot(
    cluster: ClusterServers, make_backend: MakeBackend
) -> None:
    holder = make_backend(cluster.url, max_ttl_ms=TTL)
    contender = make_backend(cluster.url, max_ttl_ms=TTL)
    async with tenure.hold(holder, "job", "alice", ttl_ms=TTL) as lease:
        assert lease.token is not None
        lease_key = holder._lease_key("job")[0]
        source = cluster.node_of(lease_key)
        target = next(s for s in cluster.servers if s is not source)
        await asyncio.to_thread(migrate_slot, cluster, key_slot(lease_key), source, target)
        assert cluster.node_of(lease_key) is target
        await asyncio.sleep(TTL / 1000)  # renewals after the move (MOVED, then the new node)
        lease.ensure_held()
        refused = await contender.acquire_lease("job", "bob", TTL)
        assert (refused.acquired, refused.owner) == (False, "alice")
        assert await holder.renew_lease("job", "alice", TTL)
    assert not lease.lost.is_set()
    after = await contender.acquire_lease("job", "bob", TTL)
    assert after.acquired and after.token is not None and after.token > lease.token


@pytest.mark.asyncio
async def test_flushall_on_one_node_quarantines_its_slots(
    cluster: ClusterServers, make_backend: MakeBackend
) -> None:
    backend = make_backend(cluster.url, max_ttl_ms=TTL)
    assert (await backend.acquire_lease("k", "alice", TTL)).acquired
    cluster.node_of(backend._lease_key("k")[0]).command("FLUSHALL")
    refused = await backend.acquire_lease("k", "bob", TTL)
    assert not refused.acquired and refused.owner is None
    assert refused.retry_after_ms is not None and 0 < refused.retry_after_ms <= TTL + 100


@pytest.mark.asyncio
async def test_promoted_replica_without_the_prefixs_first_grant_quarantines(
    make_backend: MakeBackend,
) -> None:
    """A slot's first grant writes the slot's epoch marker on its primary; the
    primary dies before its replica got it, and the replica takes over. The
    replica has no marker for the slot, has been up for long and was never
    flushed: it used to grant the key again at once, while alice held it."""
    max_ttl = 1500
    with ClusterServers(replicas=1) as cluster:
        await asyncio.to_thread(wait_uptime, *cluster.servers, seconds=3)  # uptime would do
        holder = make_backend(cluster.url, max_ttl_ms=max_ttl)
        lease = holder._lease_key("k")[0]
        primary = cluster.node_of(lease)
        replica = cluster.replica_of(primary)
        # The replica misses the grant: stopped, its link cut, then the primary dies.
        replica.pause()
        try:
            primary.command("CLIENT", "KILL", "TYPE", "replica")
            granted = await holder.acquire_lease("k", "alice", max_ttl)
            assert granted.acquired
            primary.kill()
        finally:
            replica.resume()
        replica.command("CLUSTER", "FAILOVER", "TAKEOVER")
        deadline = time.monotonic() + 20
        while cluster.node_of(lease) is not replica:
            assert time.monotonic() < deadline, "the replica never took the slot over"
            await asyncio.sleep(0.1)
        assert replica.command("EXISTS", lease) == 0  # it never saw alice's grant
        # Only live nodes as startup nodes: the dead primary's port may be reused.
        live = ",".join(f"127.0.0.1:{s.port}" for s in cluster.servers if s.running)
        contender = make_backend(f"redis+cluster://{live}", max_ttl_ms=max_ttl)
        refused = await contender.acquire_lease("k", "bob", max_ttl)
        assert not refused.acquired and refused.owner is None, refused
        assert refused.retry_after_ms is not None and 0 < refused.retry_after_ms <= max_ttl + 100


@pytest.mark.asyncio
async def test_a_quarantine_on_a_promoted_node_covers_all_its_slots_at_once(
    make_backend: MakeBackend,
) -> None:
    """Markers are per slot: each slot of a promoted node used to start its own
    quarantine at its own first grant, so a key first used after one quarantine
    ended was refused for another ``max_ttl_ms``. The first slot found in
    quarantine now starts it on every slot of the node at once."""
    max_ttl = 1500
    with ClusterServers(replicas=1) as cluster:
        await asyncio.to_thread(wait_uptime, *cluster.servers, seconds=3)
        backend = make_backend(cluster.url, max_ttl_ms=max_ttl)
        assert (await backend.acquire_lease("k", "alice", max_ttl)).acquired
        await backend.release_lease("k", "alice")
        primary = cluster.node_of(backend._lease_key("k")[0])
        replica = cluster.replica_of(primary)
        assert primary.command("WAIT", 1, 5000) == 1
        # Graceful, nothing is lost. Redis drops a manual failover that does not
        # complete within 5 s (it did under load): ask again.
        deadline = time.monotonic() + 40
        asked = 0.0
        while cluster.node_of(backend._lease_key("k")[0]) is not replica:
            assert time.monotonic() < deadline, "the manual failover did not happen"
            if (
                time.monotonic() - asked > 6
                and replica.command("INFO", "replication")["role"] == "slave"
            ):
                replica.command("CLUSTER", "FAILOVER")
                asked = time.monotonic()
            await asyncio.sleep(0.1)
        # The promoted node cannot tell what it missed: a quarantine.
        refused = await backend.acquire_lease("k", "bob", max_ttl)
        assert not refused.acquired and refused.retry_after_ms is not None, refused
        fresh = next(
            key
            for key in (f"fresh-{i}" for i in range(10_000))
            if cluster.node_of(backend._lease_key(key)[0]) is replica
        )
        sweep = backend._quarantine._node_sweep  # the node's other slots, in the background
        if sweep is not None:
            await sweep
        await asyncio.sleep((max_ttl + max_ttl // 100 + 200) / 1000)
        # A slot of the same node never used before: its quarantine is over too.
        granted = await backend.acquire_lease(fresh, "bob", max_ttl)
        assert granted.acquired, granted
