"""RedisStreamsPubSub beyond the contract suite: URLs, key encoding, batch renew, waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

import tenure
from tenure import ConfigurationError, InvalidArgument
from tenure.backends.redis import RedisClusterPubSub, RedisStreamsPubSub, _tag
from tenure.backends.redis._client import client_settings

from ..support.redis_server import RedisServer
from ..support.waiting import asleep, until_parked
from .conftest import MakeBackend
from .helpers import delete_prefix


@pytest_asyncio.fixture
async def shared(redis_url: str, unique: str) -> AsyncIterator[tuple[RedisStreamsPubSub, str]]:
    """A backend on the shared Redis under a prefix of the test's own (deleted after)."""
    prefix = f"tenure-test-{unique}:"
    backend = RedisStreamsPubSub.from_url(redis_url, prefix=prefix, quarantine=False)
    try:
        yield backend, prefix
    finally:
        await backend.aclose()
        await delete_prefix(redis_url, prefix)


# -- URLs and configuration ------------------------------------------------------


@pytest.mark.asyncio
async def test_url_options_and_repr_without_password() -> None:
    backend = tenure.from_url(
        "rediss://user:hunter2-secret@cache.example:6380/3?prefix=app:&max_ttl_ms=90000"
        "&quarantine=off&strict=1&max_attempts=7&socket_timeout=1.5"
    )
    try:
        assert isinstance(backend, RedisStreamsPubSub)
        text = repr(backend)
        assert "hunter2-secret" not in text
        assert text == "RedisStreamsPubSub(cache.example:6380/3, prefix='app:')"
        with pytest.raises(InvalidArgument, match="max_ttl_ms=90000"):
            await backend.acquire_lease("k", "o", 90_001)
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_the_lower_ttl_ceiling_says_why() -> None:
    """SQLite, PostgreSQL and memory take up to 2**31 - 1 ms; Redis refuses more
    than max_ttl_ms, and its error gives the reason (the quarantine's length)."""
    backend = tenure.from_url("redis://cache.example:6380/0")
    try:
        with pytest.raises(InvalidArgument) as refused:
            await backend.acquire_lease("k", "o", 60_001)
        text = str(refused.value)
        assert "max_ttl_ms=60000" in text and "2**31 - 1" in text
        assert "refuses new grants for max_ttl_ms" in text
    finally:
        await backend.aclose()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis://localhost/0?prefx=a:", "unknown Redis URL option 'prefx'"),
        ("redis://localhost/0?max_ttl_ms=soon", "bad value for Redis URL option 'max_ttl_ms'"),
        ("redis://localhost/0?quarantine=maybe", "bad value for Redis URL option 'quarantine'"),
        ("redis://localhost/0?retry_on_timeout=yes", "retried lease script could run twice"),
        ("redis://localhost/0?retry_on_error=x", "retried lease script could run twice"),
        ("redis://localhost/0?decode_responses=false", "decode_responses"),
        ("redis://localhost/0?prefix=a{b}:", "without braces"),
        ("redis://localhost/0?db=1&db=2", "given twice"),
        # Options the connection class does not take fail at once, not at first use.
        ("redis://localhost/0?ssl_ca_certs=/ca.pem", "ssl_ca_certs"),
        ("redis://localhost/0?timeout=3", "timeout"),
        ("redis://localhost/0?protocol=4", "protocol"),
    ],
)
def test_bad_urls_raise_configuration_error(url: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        tenure.from_url(url)


def test_bad_url_error_hides_the_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        tenure.from_url("redis://u:topsecret-pw@localhost/0?nope=1")
    assert "topsecret-pw" not in str(info.value)


# Every option redis-py's own from_url reads from a query, with a value it takes.
REDIS_PY_OPTIONS = {
    "db": "2",
    "socket_timeout": "1.5",
    "socket_connect_timeout": "2",
    "socket_read_size": "65536",
    "socket_keepalive": "true",
    "retry_on_timeout": "false",
    "max_connections": "50",
    "health_check_interval": "5",
    "protocol": "3",
    "legacy_responses": "false",
    "password": "pw",
    "username": "app",
    "client_name": "worker-1",
    "encoding": "utf-8",
    "encoding_errors": "strict",
    "ssl_keyfile": "/k.pem",
    "ssl_certfile": "/c.pem",
    "ssl_cert_reqs": "none",
    "ssl_ca_certs": "/ca.pem",
    "ssl_ca_data": "data",
    "ssl_ca_path": "/ca",
    "ssl_ciphers": "HIGH",
    "ssl_password": "key-pw",
    "ssl_check_hostname": "false",
    "ssl_include_verify_flags": "VERIFY_X509_STRICT",
    "ssl_exclude_verify_flags": "VERIFY_X509_PARTIAL_CHAIN",
    "ssl_min_version": "771",
}


# What newer redis-py versions parse in a URL (8.2) but redis.asyncio's connections
# do not take: the URL is refused, naming the option.
SYNC_ONLY_OPTIONS = ("ssl_validate_ocsp", "ssl_validate_ocsp_stapled")


def test_every_redis_py_url_option_is_accepted() -> None:
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    # Refused (retries) or not taken by redis-py's default pool (``timeout``):
    # see test_bad_urls_raise_configuration_error.
    assert set(URL_QUERY_ARGUMENT_PARSERS) - {
        "retry_on_error",
        "timeout",
        *SYNC_ONLY_OPTIONS,
    } <= set(REDIS_PY_OPTIONS)
    for name in set(SYNC_ONLY_OPTIONS) & set(URL_QUERY_ARGUMENT_PARSERS):
        with pytest.raises(ConfigurationError, match=name):
            RedisStreamsPubSub.from_url(f"rediss://cache.example:6380/0?{name}=false")
    query = "&".join(f"{name}={value}" for name, value in REDIS_PY_OPTIONS.items())
    backend = RedisStreamsPubSub.from_url(f"rediss://cache.example:6380/0?{query}")
    kwargs = backend._client.connection_pool.connection_kwargs
    assert kwargs["password"] == "pw" and kwargs["ssl_password"] == "key-pw"
    assert kwargs["db"] == 2 and kwargs["protocol"] == 3 and kwargs["client_name"] == "worker-1"
    assert kwargs["retry_on_timeout"] is False
    assert "pw" not in repr(backend)
    # Taken too, with redis-py's own deprecation warning.
    with pytest.warns(DeprecationWarning, match="lib_name"):
        RedisStreamsPubSub.from_url("redis://localhost/0?lib_name=app&lib_version=1.0")


def test_retry_keywords_are_refused() -> None:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    for name, value in [
        ("retry", Retry(NoBackoff(), 3)),
        ("retry_on_timeout", True),
        ("retry_on_error", [TimeoutError]),
    ]:
        with pytest.raises(ConfigurationError, match="retried lease script could run twice"):
            RedisStreamsPubSub.from_url("redis://localhost/0", **{name: value})


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:Pw-s3cret@localhost/0?socket_timeout=never",
        "redis://localhost/0?password=Pw-s3cret&socket_timeout=never",
        "redis://localhost/0?password=Pw-s3cret&nope=1",
        "redis://localhost/0?password=Pw-s3cret&protocol=9",
        "redis://localhost/0?password=Pw-s3cret&timeout=3",
        "redis://localhost/0?password=Pw-s3cret&password=Pw-s3cret",
        "rediss://localhost/0?ssl_password=Pw-s3cret&nope=1",
        "rediss://localhost/0?ssl_password=Pw-s3cret&ssl_cert_reqs=sometimes",
        "redis://localhost/0?password=Pw%2Ds3cret&max_ttl_ms=soon",
        "redis://:Pw-s3cret@localhost:port/0",
    ],
)
def test_bad_password_bearing_url_does_not_show_the_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RedisStreamsPubSub.from_url(url)
    for text in (str(info.value), repr(info.value)):
        assert "s3cret" not in text, text


def test_keyword_options_override_the_query() -> None:
    def kwargs(backend: RedisStreamsPubSub) -> dict[str, Any]:
        return client_settings(backend._client)

    backend = RedisStreamsPubSub.from_url(
        "redis://localhost/0?prefix=a:&socket_timeout=1&db=3", prefix="b:", socket_timeout=2.5
    )
    assert "prefix='b:'" in repr(backend)
    assert kwargs(backend)["socket_timeout"] == 2.5 and kwargs(backend)["db"] == 3
    query_only = RedisStreamsPubSub.from_url("redis://localhost/0?socket_timeout=1.5")
    assert kwargs(query_only)["socket_timeout"] == 1.5


def test_declared_capabilities() -> None:
    C = tenure.Capability
    assert RedisStreamsPubSub.capabilities == (
        C.RECORD
        | C.RENEW_MANY
        | C.RENEW_OWNED
        | C.RELEASE_WAKEUPS
        | C.ATOMIC_TRANSFER
        | C.OPERATIONS
        | C.EVENTS
        | C.DURABLE_GROUPS
        | C.DEDUPE
        | C.RECLAIM
        | C.BACKLOG
        | C.FENCED_TAKES
    )
    # A cluster keeps a lease and a stream in different slots: no fenced take there.
    assert not RedisClusterPubSub.capabilities & C.FENCED_TAKES


def test_key_encoding_is_injective_and_keeps_one_hash_tag() -> None:
    backend = RedisStreamsPubSub.from_url("redis://localhost/0")
    names = ["a", "a}", "a}:token", "a}:lease", "{a}", "%7D", "}", "%", "a\0", "a\0b", "é", "%25"]
    keys = [k for name in names for k in backend._lease_key(name)]
    assert len(set(keys)) == len(keys)
    for name in names:
        tag = _tag(name)
        assert b"{" not in tag and b"}" not in tag
        lease, counter = backend._lease_key(name)
        # The hash tag (between the first "{" and the next "}") is the same for both.
        assert lease.split(b"{", 1)[1].split(b"}", 1)[0] == tag
        assert counter.split(b"{", 1)[1].split(b"}", 1)[0] == tag


# -- batch renew -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_renew_leases_keeps_ten_thousand_keys(
    shared: tuple[RedisStreamsPubSub, str],
) -> None:
    backend, _ = shared
    keys = [f"many-{i}" for i in range(10_000)]
    for start in range(0, len(keys), 500):
        results = await asyncio.gather(
            *(backend.acquire_lease(k, "owner", 60_000) for k in keys[start : start + 500])
        )
        assert all(r.acquired for r in results)
    await backend.release_lease(keys[7], "owner")
    renewed = await backend.renew_leases(keys, "owner", 60_000)
    assert len(renewed) == len(keys)
    assert renewed[7] is False
    assert renewed.count(True) == len(keys) - 1
    assert await backend.renew_leases(keys[:100], "intruder", 60_000) == [False] * 100
    assert await backend.renew_leases([], "owner", 60_000) == []
    with pytest.raises(InvalidArgument, match="key"):
        await backend.renew_leases(["ok", ""], "owner", 60_000)


@pytest.mark.asyncio
async def test_renew_owned_is_one_script_per_five_hundred_leases_on_one_server() -> None:
    """Each lease with its own owner, 1,200 of them: three script calls (counted
    by the private server), and every pair decided on its own, in every chunk."""
    with RedisServer(persistence=True) as server:
        backend = RedisStreamsPubSub.from_url(server.url)
        try:
            pairs = [(f"k{i}", f"owner-{i}") for i in range(1200)]
            for start in range(0, len(pairs), 400):
                chunk = pairs[start : start + 400]
                granted = await asyncio.gather(
                    *(backend.acquire_lease(k, o, 60_000) for k, o in chunk)
                )
                assert all(g.acquired for g in granted)
            await backend.release_lease("k700", "owner-700")
            asked = [*pairs[:1100], ("k1100", "intruder"), *pairs[1101:]]

            def evalsha_calls() -> int:
                with server.client() as admin:
                    stats: dict[str, Any] = admin.info("commandstats")
                return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))

            before = evalsha_calls()
            renewed = await backend.renew_owned(asked, 60_000)
            assert evalsha_calls() - before == 3
            assert [i for i, ok in enumerate(renewed) if not ok] == [700, 1100]
            record = await backend.get_lease("k1100")
            assert record is not None and record.owner == "owner-1100"  # not the intruder's
        finally:
            await backend.aclose()


# -- waiting for a release ----------------------------------------------------------


@pytest.mark.asyncio
async def test_wait_lease_released_wakes_on_a_release_by_another_client(
    shared: tuple[RedisStreamsPubSub, str], redis_url: str
) -> None:
    backend, prefix = shared
    other = RedisStreamsPubSub.from_url(redis_url, prefix=prefix, quarantine=False)
    try:
        assert await backend.wait_lease_released("free", 5) is True
        assert (await other.acquire_lease("k", "alice", 30_000)).acquired
        assert await backend.wait_lease_released("k", 0.2) is False
        waiter = asyncio.create_task(backend.wait_lease_released("k", 30))
        await until_parked(backend, "k")  # it looked, saw alice's lease, and sleeps
        assert not waiter.done()
        await other.transfer_lease("k", "alice", "bob", 30_000)
        assert await asyncio.wait_for(waiter, 10) is True
        waiters = [asyncio.create_task(backend.wait_lease_released("k", 30)) for _ in range(2)]
        await until_parked(backend, "k", 2)
        await other.release_lease("k", "bob")
        # One release wakes one waiter (no stampede); the next release the other.
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED, timeout=10)
        assert len(done) == 1 and len(pending) == 1
        assert asleep(backend) == 1  # the other was not woken
        assert not pending.pop().done()
        assert (await other.acquire_lease("k", "carol", 30_000)).acquired
        await other.release_lease("k", "carol")
        assert await asyncio.wait_for(asyncio.gather(*waiters), 10) == [True, True]
    finally:
        await other.aclose()


@pytest.mark.asyncio
async def test_lost_notification_connection_wakes_every_waiter(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    backend = make_backend(server.url, quarantine=False)
    assert (await backend.acquire_lease("k", "alice", 30_000)).acquired
    waiters = [asyncio.create_task(backend.wait_lease_released("k", 30)) for _ in range(3)]
    await until_parked(backend, "k", 3)
    server.command("CLIENT", "KILL", "TYPE", "pubsub")
    # Woken (a notification may have been missed), although the lease is still held.
    assert await asyncio.wait_for(asyncio.gather(*waiters), 10) == [True, True, True]
    assert await backend.get_lease_owner("k") == "alice"
    # And it listens again afterwards.
    waiter = asyncio.create_task(backend.wait_lease_released("k", 30))
    await until_parked(backend, "k")
    await backend.release_lease("k", "alice")
    assert await asyncio.wait_for(waiter, 10) is True


@pytest.mark.asyncio
@pytest.mark.parametrize("protocol", [2, 3])
async def test_injected_client_is_used_and_left_open(
    redis_url: str, unique: str, protocol: int
) -> None:
    prefix = f"tenure-test-{unique}:"
    client = aioredis.Redis.from_url(redis_url, protocol=protocol)
    try:
        backend = RedisStreamsPubSub(client, prefix=prefix, quarantine=False)
        granted = await backend.acquire_lease("k", "alice", 10_000)
        assert granted.acquired
        assert await backend.acquire_lease("k", "bob", 10_000) == tenure.AcquireResult(
            False, "alice", None, reason=tenure.RefusalReason.HELD
        )
        assert await backend.renew_leases(["k", "x"], "alice", 10_000) == [True, False]
        assert await backend.transfer_lease("k", "alice", "bob", 10_000)
        record = await backend.get_lease("k")
        assert record is not None and record.owner == "bob"
        assert granted.token is not None and record.token > granted.token
        await backend.aclose()
        assert await client.ping()  # the caller's client stays usable
    finally:
        await client.aclose()
        await delete_prefix(redis_url, prefix)


def test_client_with_decoded_responses_is_refused(redis_url: str) -> None:
    with pytest.raises(ConfigurationError, match="decode_responses"):
        RedisStreamsPubSub(aioredis.Redis.from_url(redis_url, decode_responses=True))
