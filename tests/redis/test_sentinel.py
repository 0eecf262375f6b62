"""Redis through Sentinel: the ``redis+sentinel://`` URL, and a failover while a
lease is held (a master, a replica and three sentinels of the test's own)."""

from __future__ import annotations

import asyncio

import pytest

import tenure
from tenure import BackendUnavailable, ConfigurationError
from tenure.backends.redis import RedisStreamsPubSub
from tenure.fencing import MemoryFencedStore

from ..support.redis_server import RedisSentinels, free_port
from .conftest import MakeBackend

SECRET = "s3nt-pw-7"


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis+sentinel://127.0.0.1:26379", "service name"),
        ("redis+sentinel://127.0.0.1:26379/a/b", "service name"),
        ("redis+sentinel://127.0.0.1:26379,nohost/svc", "not host:port"),
        ("redis+sentinel://127.0.0.1:26379/svc?bogus=1", "unknown Redis URL option 'bogus'"),
        ("redis+sentinel://127.0.0.1:26379/svc?retry_on_timeout=true", "retries off"),
    ],
)
def test_bad_sentinel_urls_are_refused_without_the_password(url: str, match: str) -> None:
    url = url.replace("//", f"//:{SECRET}@", 1)
    with pytest.raises(ConfigurationError, match=match) as refused:
        tenure.from_url(url)
    assert SECRET not in str(refused.value)


@pytest.mark.asyncio
async def test_sentinel_url_without_sentinels_fails_as_unavailable(
    make_backend: MakeBackend,
) -> None:
    ports = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    backend = make_backend(f"redis+sentinel://:{SECRET}@{ports}/svc?db=2&prefix=app:")
    text = repr(backend)
    assert SECRET not in text and "sentinel 'svc' via" in text and "/2" in text
    with pytest.raises(BackendUnavailable) as failed:
        await backend.acquire_lease("k", "o", 1000)
    assert SECRET not in str(failed.value)


@pytest.mark.asyncio
async def test_a_held_lease_survives_a_sentinel_failover_and_new_grants_wait(
    make_backend: MakeBackend,
) -> None:
    """The master dies while a lease is held; Sentinel promotes the replica.
    The holder keeps renewing through the failover (the lease was replicated:
    WAIT); the promoted replica cannot know whether it missed grants, so its
    epoch check refuses new grants for max_ttl_ms, and names the surviving
    holder."""
    ttl = 8000
    with RedisSentinels(persistence=True) as group:  # new: no quarantine at first
        holder = make_backend(group.url, max_ttl_ms=ttl)
        contender = make_backend(group.url, max_ttl_ms=ttl)
        store = MemoryFencedStore()
        async with tenure.hold(holder, "job", "alice", ttl_ms=ttl) as lease:
            assert lease.token is not None
            assert group.master.command("WAIT", 1, 5000) == 1  # the replica has the grant
            await asyncio.to_thread(group.failover, kill=True)
            await asyncio.sleep(ttl / 2000)  # renewals on the new master
            lease.ensure_held()
            assert await store.write("job", lease.token, "done")
            refused = await contender.acquire_lease("job", "bob", ttl)
            assert (refused.acquired, refused.owner) == (False, "alice")
            fresh = await contender.acquire_lease("other", "bob", ttl)
            assert not fresh.acquired and fresh.owner is None
            assert fresh.retry_after_ms is not None and 0 < fresh.retry_after_ms <= ttl + 100
            assert await holder.renew_lease("job", "alice", ttl)
        assert not lease.lost.is_set()
        after = await tenure.acquire_wait(contender, "job", "bob", ttl, timeout=15)
        assert after.token is not None and after.token > lease.token


def test_sentinel_backend_is_the_redis_class() -> None:
    backend = tenure.from_url("redis+sentinel://127.0.0.1:1/svc")
    assert isinstance(backend, RedisStreamsPubSub)
