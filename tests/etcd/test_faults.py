"""Faults on a 3-member etcd cluster: what the ``EtcdLeases`` docstring promises.

- a leader killed (SIGKILL) while a lease is held: the holder keeps it, nobody
  else is granted it, tokens keep increasing, and the restarted member serves
  the same state;
- a member paused (SIGSTOP): the cluster keeps answering through the others,
  a client bound to the paused member gets ``BackendUnavailable``, not a
  wrong answer;
- the leader cut off by a partition (its peer proxy black-holed): its client
  can neither renew nor be told a stale "yes"; the majority grants the key
  only after the holder's deadline, with a higher token; after healing the
  old holder's renewal fails;
- every member killed and restarted: leases and token order survive.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

import tenure
from tenure.backends.etcd import EtcdLeases
from tests.support.etcd_server import EtcdCluster
from tests.support.waiting import until_parked

T = TypeVar("T")

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


async def answer(call: Callable[[], Awaitable[T]], timeout: float = 15.0) -> T:
    """``call()``'s first answer, retrying while the cluster is unavailable."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except tenure.BackendUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.fixture
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=3, proxied=True) as made:
        yield made


def connect(url: str, **options: Any) -> EtcdLeases:
    backend = tenure.from_url(url, prefix="faults/", **options)
    assert isinstance(backend, EtcdLeases)
    return backend


async def test_a_killed_leader_loses_no_lease_and_no_token_order(cluster: EtcdCluster) -> None:
    async with connect(cluster.url, timeout=2) as holder, connect(cluster.url, timeout=2) as rival:
        granted = await holder.acquire_lease("k", "holder", 5000)
        assert granted.acquired and granted.token is not None
        leader = cluster.leader()
        cluster.kill(leader)
        survivors = [i for i in range(cluster.size) if i != leader]
        cluster.leader(among=survivors)
        # The holder keeps its lease through the failover: the grant was committed
        # on a majority, so the new leader knows it.
        assert await answer(lambda: holder.renew_lease("k", "holder", 5000)) is True
        refused = await answer(lambda: rival.acquire_lease("k", "rival", 5000))
        assert (refused.acquired, refused.owner) == (False, "holder")
        record = await answer(lambda: rival.get_lease("k"))
        assert record is not None and (record.owner, record.token) == ("holder", granted.token)
        # Token order across the leader change.
        await answer(lambda: holder.release_lease("k", "holder"))
        second = await answer(lambda: rival.acquire_lease("k", "rival", 5000))
        assert second.acquired and second.token is not None and second.token > granted.token
        # The killed member comes back and serves the same state (a linearizable read).
        cluster.start(leader)
        async with connect(cluster.member_url(leader), timeout=2) as returned:
            back = await answer(lambda: returned.get_lease("k"), timeout=20)
            assert back is not None and (back.owner, back.token) == ("rival", second.token)
            assert await answer(lambda: returned.transfer_lease("k", "rival", "third", 5000))
            moved = await returned.get_lease("k")
            assert moved is not None and moved.token > second.token


async def test_a_paused_member_fails_its_clients_and_not_the_cluster(
    cluster: EtcdCluster,
) -> None:
    leader = cluster.leader()
    async with (
        connect(cluster.url, timeout=1) as holder,
        connect(cluster.member_url(leader), timeout=1) as bound,
    ):
        granted = await holder.acquire_lease("k", "holder", 4000)
        assert granted.acquired
        cluster.pause(leader)
        try:
            # The client of the paused member gets no answer, and says so.
            with pytest.raises(tenure.BackendUnavailable):
                await bound.get_lease("k")
            survivors = [i for i in range(cluster.size) if i != leader]
            cluster.leader(among=survivors)
            # Through the others the holder renews, and nobody else is granted the key.
            assert await answer(lambda: holder.renew_lease("k", "holder", 4000)) is True
            refused = await answer(lambda: holder.acquire_lease("k", "rival", 4000))
            assert (refused.acquired, refused.owner) == (False, "holder")
        finally:
            cluster.resume(leader)
        # The paused member rejoins as a follower and serves the current state.
        record = await answer(lambda: bound.get_lease("k"), timeout=20)
        assert record is not None and (record.owner, record.token) == ("holder", granted.token)


async def test_a_partitioned_leader_cannot_keep_a_lease_past_its_deadline(
    cluster: EtcdCluster,
) -> None:
    ttl = 2000
    leader = cluster.leader()
    others = [i for i in range(cluster.size) if i != leader]
    majority_url = "etcd://" + ",".join(cluster.endpoints[i] for i in others)
    async with (
        connect(cluster.member_url(leader), timeout=1) as holder,
        connect(majority_url, timeout=1) as rival,
    ):
        granted = await holder.acquire_lease("k", "holder", ttl)
        assert granted.acquired and granted.token is not None
        last_renewal = time.monotonic()
        assert await holder.renew_lease("k", "holder", ttl)
        cluster.partition(leader)
        try:
            # The cut-off leader cannot commit a renewal: no false "yes".
            with pytest.raises(tenure.BackendUnavailable):
                await holder.renew_lease("k", "holder", ttl)
            cluster.leader(among=others)
            # The majority grants the key only once the holder's deadline has passed.
            while True:
                result = await answer(lambda: rival.acquire_lease("k", "rival", 30_000))
                if result.acquired:
                    break
                assert result.owner == "holder"
                await asyncio.sleep(0.05)
            assert time.monotonic() - last_renewal >= ttl / 1000 * 0.99
            assert result.token is not None and result.token > granted.token
        finally:
            cluster.heal(leader)
        # Healed: the old holder learns its loss; it never overwrites the new owner.
        assert await answer(lambda: holder.renew_lease("k", "holder", ttl), timeout=20) is False
        record = await answer(lambda: holder.get_lease("k"))
        assert record is not None and (record.owner, record.token) == ("rival", result.token)


async def test_a_full_restart_keeps_leases_and_token_order(cluster: EtcdCluster) -> None:
    async with connect(cluster.url, timeout=2) as before:
        kept = await before.acquire_lease("kept", "alice", 60_000)
        freed = await before.acquire_lease("freed", "bob", 60_000)
        await before.release_lease("freed", "bob")
        assert kept.token is not None and freed.token is not None
    await asyncio.to_thread(cluster.restart_all)
    async with connect(cluster.url, timeout=2) as after:
        record = await answer(lambda: after.get_lease("kept"), timeout=20)
        assert record is not None and (record.owner, record.token) == ("alice", kept.token)
        assert await answer(lambda: after.get_lease("freed")) is None
        again = await answer(lambda: after.acquire_lease("freed", "carol", 60_000))
        assert again.acquired and again.token is not None
        assert again.token > max(kept.token, freed.token)
        assert await answer(lambda: after.renew_lease("kept", "alice", 60_000))
        assert await answer(lambda: after.transfer_lease("kept", "alice", "dave", 60_000))
        moved = await after.get_lease("kept")
        assert moved is not None and moved.token > again.token


async def test_a_watch_broken_by_a_dead_member_wakes_its_waiters(cluster: EtcdCluster) -> None:
    """A waiter whose watch ran on a member that died is woken to look again,
    long before its timeout, and the release it might have missed is seen."""
    async with (
        connect(cluster.url, timeout=2) as holder,
        connect(cluster.member_url(0), timeout=2) as bound,
    ):
        assert (await holder.acquire_lease("k", "holder", 30_000)).acquired
        waiting = asyncio.ensure_future(bound.wait_lease_released("k", 60))
        await until_parked(bound, "k")
        cluster.kill(0)
        assert await asyncio.wait_for(waiting, 15) is True
        await answer(lambda: holder.release_lease("k", "holder"))
        cluster.start(0)
        assert await answer(lambda: bound.wait_lease_released("k", 5), timeout=20) is True
