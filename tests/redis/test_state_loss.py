"""Lost lease state and clock steps on a private redis-server.

The restart quarantine used to read only the server's uptime. These tests
lose lease state in the other ways a long-running server can (FLUSHALL, an
evicted lease key, a replica promoted before it had the last grant) and step
the server's wall clock (``RedisServer(shifted_clock=True)``), and check that
no second owner is granted while the first one's lease may still be in use.
They also cover first contact: a new server refuses with a reason, or grants
at once when it can tell it is new.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

import tenure
from tenure import AcquireResult, LeaseUnavailable, RefusalReason
from tenure.backends.redis import RedisStreamsPubSub
from tenure.fencing import MemoryFencedStore

from ..support.redis_server import RedisServer
from .conftest import MakeBackend
from .helpers import wait_out_quarantine

# Small, so that a server "up longer than the quarantine" is a few seconds old.
MAX_TTL = 1500


def wait_uptime(*servers: RedisServer, seconds: int) -> None:
    """Wait until every server reports an uptime of at least ``seconds``."""
    for server in servers:
        while int(server.command("INFO", "server")["uptime_in_seconds"]) < seconds:
            time.sleep(0.1)


def refused_for_now(result: AcquireResult) -> bool:
    """A quarantine refusal: no holder, and a time to retry after."""
    return (
        not result.acquired
        and result.owner is None
        and result.reason is RefusalReason.QUARANTINE
        and result.retry_after_ms is not None
        and 0 < result.retry_after_ms <= MAX_TTL + 1000 + MAX_TTL // 100
    )


@pytest.fixture
def aged() -> Iterator[RedisServer]:
    """A server without persistence, up longer than the quarantine (so uptime alone
    would grant at once)."""
    with RedisServer() as server:
        wait_uptime(server, seconds=3)
        yield server


# -- state lost on a server that has been up for long -------------------------------


@pytest.mark.asyncio
async def test_flushall_on_a_long_running_server_quarantines(
    aged: RedisServer, make_backend: MakeBackend
) -> None:
    backend = make_backend(aged.url, max_ttl_ms=MAX_TTL)
    first = await backend.acquire_lease("k", "alice", MAX_TTL)
    assert first.acquired
    aged.command("FLUSHALL")
    # alice's lease may be in use for MAX_TTL more: bob must not get the key.
    assert refused_for_now(await backend.acquire_lease("k", "bob", MAX_TTL))
    # Nor any other key of the prefix (its lease may have been lost too).
    assert refused_for_now(await backend.acquire_lease("other", "bob", MAX_TTL))
    await asyncio.sleep((MAX_TTL + 100) / 1000)
    after = await backend.acquire_lease("k", "bob", MAX_TTL)
    assert after.acquired and after.token is not None and first.token is not None
    assert after.token > first.token


@pytest.mark.asyncio
async def test_evicted_lease_key_quarantines(make_backend: MakeBackend) -> None:
    with RedisServer(args=["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]) as server:
        wait_uptime(server, seconds=3)
        backend = make_backend(server.url, max_ttl_ms=MAX_TTL)
        assert (await backend.acquire_lease("k", "alice", MAX_TTL)).acquired
        lease = b"tenure:{k}:lease"
        with server.client() as admin:
            n = 0
            while admin.exists(lease):
                admin.set(f"filler-{n}", b"x" * 10_000)
                n += 1
        assert refused_for_now(await backend.acquire_lease("k", "bob", MAX_TTL))


@pytest.mark.asyncio
async def test_promoted_replica_without_the_last_grant_quarantines(
    make_backend: MakeBackend,
) -> None:
    with (
        RedisServer(persistence=True) as master,
        RedisServer(args=["--replica-read-only", "yes"]) as replica,
    ):
        replica.replicate(master)
        wait_uptime(master, replica, seconds=3)
        old = make_backend(master.url, max_ttl_ms=MAX_TTL)
        assert (await old.acquire_lease("warm", "alice", MAX_TTL)).acquired
        assert master.command("WAIT", 1, 5000) == 1  # the marker is on the replica
        # Cut the link (a partition): the replica keeps its data and misses
        # the next grant, as a lagging replica would.
        replica.command("REPLICAOF", "127.0.0.1", "1")
        granted = await old.acquire_lease("k", "alice", MAX_TTL)
        assert granted.acquired
        master.kill()
        replica.command("REPLICAOF", "NO", "ONE")  # a manual failover
        new = make_backend(replica.url, max_ttl_ms=MAX_TTL)
        # The promoted replica never saw alice's grant; she may be using it.
        assert refused_for_now(await new.acquire_lease("k", "bob", MAX_TTL))
        await asyncio.sleep((MAX_TTL + 100) / 1000)
        assert (await new.acquire_lease("k", "bob", MAX_TTL)).acquired


@pytest.mark.asyncio
async def test_promoted_replica_without_the_prefixs_first_grant_quarantines(
    make_backend: MakeBackend,
) -> None:
    """The first grant of a prefix writes its epoch marker; a replica promoted
    before it received that grant has no marker at all. A missing marker used
    to mean "never used here" on a server up for long: the grant was given again
    at once while alice still held the key."""
    with (
        RedisServer() as master,
        RedisServer(args=["--replica-read-only", "yes"]) as replica,
    ):
        replica.replicate(master)
        wait_uptime(master, replica, seconds=3)  # uptime alone would grant at once
        replica.command("REPLICAOF", "127.0.0.1", "1")  # cut off, keeps its (empty) data
        old = make_backend(master.url, max_ttl_ms=MAX_TTL)
        granted = await old.acquire_lease("k", "alice", MAX_TTL)
        assert granted.acquired
        master.kill()
        replica.command("REPLICAOF", "NO", "ONE")  # a manual failover
        new = make_backend(replica.url, max_ttl_ms=MAX_TTL)
        refused = await new.acquire_lease("k", "bob", MAX_TTL)
        assert refused_for_now(refused), refused
        assert refused_for_now(await new.acquire_lease("other", "bob", MAX_TTL))


@pytest.mark.asyncio
async def test_a_marker_gone_under_a_client_that_saw_it_quarantines(
    aged: RedisServer, make_backend: MakeBackend
) -> None:
    """A server that shows no sign of loss (up for long, never promoted, no
    flush, no eviction) but lacks a marker this client has seen: the client
    knows the prefix was used there, so the lease state went missing."""
    backend = make_backend(aged.url, max_ttl_ms=MAX_TTL)
    assert (await backend.acquire_lease("k", "alice", MAX_TTL)).acquired
    aged.command("DEL", "tenure:epoch", "tenure:{k}:lease")  # lost without a trace
    assert refused_for_now(await backend.acquire_lease("k", "bob", MAX_TTL))
    # A client that never saw the marker cannot tell (documented as not detected).
    other = make_backend(aged.url, max_ttl_ms=MAX_TTL, prefix="tenure-other:")
    assert (await other.acquire_lease("k", "bob", MAX_TTL)).acquired


@pytest.mark.asyncio
async def test_crash_restart_from_an_older_snapshot_quarantines(make_backend: MakeBackend) -> None:
    """RDB persistence: the grant after the last snapshot is lost in a crash, the
    marker (older) survives. The server's new replication ID gives it away, even
    to a client that first connects long after the restart."""
    with RedisServer(args=["--save", "3600 1"]) as server:
        wait_uptime(server, seconds=3)
        before = make_backend(server.url, max_ttl_ms=MAX_TTL)
        assert (await before.acquire_lease("warm", "alice", MAX_TTL)).acquired
        server.command("SAVE")
        assert (await before.acquire_lease("k", "alice", MAX_TTL)).acquired
        server.kill()
        server.start()
        wait_uptime(server, seconds=3)  # uptime alone would grant now
        after = make_backend(server.url, max_ttl_ms=MAX_TTL)
        assert refused_for_now(await after.acquire_lease("k", "bob", MAX_TTL))


# -- first contact --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_new_server_says_why_it_refuses(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    backend = make_backend(server.url, max_ttl_ms=MAX_TTL)
    result = await backend.acquire_lease("invoice-7", "worker-a", 1000)
    assert refused_for_now(result)
    with pytest.raises(LeaseUnavailable, match=r"refuses new grants for .* quarantine") as held:
        async with tenure.hold(backend, "invoice-7", "worker-a", ttl_ms=1000, wait=0):
            pass
    assert held.value.holder is None and held.value.retry_after_ms is not None
    assert held.value.reason == "quarantine"
    with pytest.raises(LeaseUnavailable, match=r"quarantine.*gave up after waiting 0\.2 s"):
        await tenure.acquire_wait(backend, "invoice-7", "worker-a", 1000, timeout=0.2)
    # Waiting longer than the quarantine gets the lease.
    granted = await tenure.acquire_wait(backend, "invoice-7", "worker-a", 1000, timeout=10)
    assert granted.acquired


@pytest.mark.asyncio
async def test_a_new_server_with_appendfsync_always_grants_at_once(
    make_backend: MakeBackend,
) -> None:
    with RedisServer(persistence=True) as server:
        backend = make_backend(server.url, max_ttl_ms=MAX_TTL)
        result = await backend.acquire_lease("invoice-7", "worker-a", 1000)
        assert result.acquired and result.retry_after_ms is None


# -- clock steps --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_clock_stepped_back_past_the_start_does_not_break_grants(
    make_backend: MakeBackend,
) -> None:
    with RedisServer(shifted_clock=True) as server:
        server.step_clock(-100)  # NTP stepping a VM's clock back after boot
        await asyncio.sleep(0.3)  # Redis caches the time for up to a cron tick
        assert int(server.command("INFO", "server")["uptime_in_seconds"]) < 0
        backend = make_backend(server.url, max_ttl_ms=MAX_TTL)
        # Its start time is in its future now: it cannot tell how long it has
        # been up, so it refuses for a full quarantine from now.
        assert refused_for_now(await backend.acquire_lease("k", "alice", MAX_TTL))
        await asyncio.sleep((MAX_TTL + 100) / 1000)
        assert (await backend.acquire_lease("k", "alice", MAX_TTL)).acquired


@pytest.mark.asyncio
async def test_clock_stepped_forward_expires_leases_and_fencing_rejects_the_stale_owner(
    make_backend: MakeBackend,
) -> None:
    """What the class docstring and SAFETY.md state: ``PX`` expiry is absolute
    time, so a forward step ends every live lease at once; the second owner's
    token is higher, so a fenced store refuses the first owner's late write."""
    with RedisServer(persistence=True, shifted_clock=True) as server:
        backend: RedisStreamsPubSub = make_backend(server.url, max_ttl_ms=30_000)
        store = MemoryFencedStore()
        alice = await backend.acquire_lease("k", "alice", 30_000)
        assert alice.acquired and alice.token is not None
        assert await store.write("k", alice.token, "alice-1")
        server.step_clock(3600)
        await asyncio.sleep(0.3)
        bob = await backend.acquire_lease("k", "bob", 30_000)
        assert bob.acquired and bob.token is not None and bob.token > alice.token
        assert await store.write("k", bob.token, "bob-1")
        # alice still believes she holds the key (her renew fails only now).
        assert not await store.write("k", alice.token, "alice-2")
        assert not await backend.renew_lease("k", "alice", 30_000)
        value = await store.read("k")
        assert value is not None and value.value == "bob-1"


async def _granted_eventually(backend: RedisStreamsPubSub, key: str, owner: str) -> AcquireResult:
    """Ask until ``key`` is granted (a quarantine ends); fail after 10 s."""
    deadline = time.monotonic() + 10
    while not (result := await backend.acquire_lease(key, owner, MAX_TTL)).acquired:
        assert refused_for_now(result), result
        if time.monotonic() > deadline:
            pytest.fail("still refused after 10 s")
        await asyncio.sleep(0.05)
    return result


@pytest.mark.asyncio
async def test_a_flush_quarantines_new_prefixes_only_while_a_lease_it_erased_can_live(
    aged: RedisServer, make_backend: MakeBackend
) -> None:
    """Once the server has seen FLUSHDB, a prefix used for the first time is
    quarantined only within max_ttl_ms of the first time a client saw the
    flush, in every database; it used to be quarantined as long as the server
    lived."""
    db = aged.url.rsplit("/", 1)[0]
    aged.client(db=7).flushdb()
    # When the flush ran is unknown: a lease of this prefix may have gone with it.
    first = make_backend(f"{db}/0", max_ttl_ms=MAX_TTL, prefix="first:")
    assert refused_for_now(await first.acquire_lease("k", "alice", MAX_TTL))
    await _granted_eventually(first, "k", "alice")
    # Any lease the flush erased has expired by now: new prefixes, in any
    # database, are granted at once.
    for url, prefix in [(f"{db}/0", "later:"), (f"{db}/11", "other-db:"), (f"{db}/7", "db7:")]:
        backend = make_backend(url, max_ttl_ms=MAX_TTL, prefix=prefix)
        assert (await backend.acquire_lease("k", "bob", MAX_TTL)).acquired, url
    # A new flush is a new possible loss: a new prefix waits again.
    aged.client(db=11).flushdb()
    fresh = make_backend(f"{db}/0", max_ttl_ms=MAX_TTL, prefix="after-second-flush:")
    refused = await fresh.acquire_lease("k", "carol", MAX_TTL)
    assert refused_for_now(refused)
    # A prefix whose marker survived the flush (another database) keeps its lease.
    later = make_backend(f"{db}/0", max_ttl_ms=MAX_TTL, prefix="later:")
    assert await later.get_lease_owner("k") == "bob"


@pytest.mark.asyncio
async def test_waiting_out_the_quarantine_of_a_fresh_and_flushed_server(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    """What the shared-server fixture does: after it, a new prefix is granted at once
    on a server just started, and again after a flush, whatever its uptime."""
    young = make_backend(server.url, max_ttl_ms=MAX_TTL, prefix="young:")
    assert refused_for_now(await young.acquire_lease("k", "alice", MAX_TTL))
    await asyncio.to_thread(wait_out_quarantine, server.url, max_ttl_ms=MAX_TTL)
    fresh = make_backend(server.url, max_ttl_ms=MAX_TTL, prefix="fresh:")
    assert (await fresh.acquire_lease("k", "alice", MAX_TTL)).acquired
    server.command("FLUSHDB")
    flushed = make_backend(server.url, max_ttl_ms=MAX_TTL, prefix="flushed:")
    assert refused_for_now(await flushed.acquire_lease("k", "bob", MAX_TTL))
    await asyncio.to_thread(wait_out_quarantine, server.url, max_ttl_ms=MAX_TTL)
    after = make_backend(server.url, max_ttl_ms=MAX_TTL, prefix="after:")
    assert (await after.acquire_lease("k", "bob", MAX_TTL)).acquired
