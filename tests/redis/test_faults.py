"""Lease behaviour under faults, each on a private redis-server.

Script-cache flush, restarts with and without persistence (quarantine, token
monotonicity), an evicting ``maxmemory-policy``, wrong passwords, a killed or
paused server, and a closed backend.
"""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import quote

import pytest

from tenure import (
    AcquireResult,
    BackendClosed,
    BackendUnavailable,
    ConfigurationError,
    Event,
    RefusalReason,
)
from tenure.backends.redis import RedisStreamsPubSub
from tenure.testing import eventually

from ..support.redis_server import RedisServer
from ..support.waiting import until_parked
from .conftest import MakeBackend


async def acquire_when_possible(
    backend: RedisStreamsPubSub, key: str, owner: str, ttl_ms: int, timeout: float = 20.0
) -> tuple[AcquireResult, float]:
    """Retry until granted (quarantine, reconnects); returns the grant and its wall time."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = await backend.acquire_lease(key, owner, ttl_ms)
        except BackendUnavailable:
            result = None
        if result is not None and result.acquired:
            return result, time.time()
        assert time.monotonic() < deadline, f"{key!r} was never granted: {result}"
        await asyncio.sleep(0.05)


async def first_answer(
    backend: RedisStreamsPubSub, key: str, owner: str, ttl: int
) -> AcquireResult:
    """The first acquire that gets an answer (the first call after a restart may fail)."""
    for _ in range(20):
        try:
            return await backend.acquire_lease(key, owner, ttl)
        except BackendUnavailable:
            await asyncio.sleep(0.05)
    raise AssertionError("the server never answered")


@pytest.mark.asyncio
async def test_fresh_server_quarantines_unknown_keys(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    guarded = make_backend(server.url, max_ttl_ms=1500)
    refused = await guarded.acquire_lease("k", "alice", 1000)
    assert (refused.acquired, refused.owner, refused.token) == (False, None, None)
    # The refusal says so: grants resume within max_ttl_ms (+1 s rounding, +1%).
    assert refused.retry_after_ms is not None and 0 < refused.retry_after_ms <= 1500 + 1000 + 15
    assert await guarded.get_lease_owner("k") is None
    # The documented way out: no quarantine, immediate grant.
    unguarded = make_backend(server.url, max_ttl_ms=1500, quarantine=False)
    assert (await unguarded.acquire_lease("other", "bob", 1000)).acquired
    # A waiter is not sent back at once (the key is free but not grantable):
    # it waits for the end of the window, which is max_ttl_ms (+1 s rounding,
    # +1%) after the server started.
    assert await guarded.wait_lease_released("k", 0.05) is False
    assert await guarded.wait_lease_released("k", 30) is True
    granted = await guarded.acquire_lease("k", "alice", 1000)
    assert granted.acquired and granted.owner == "alice"


@pytest.mark.asyncio
async def test_restart_without_persistence_quarantines_and_tokens_keep_rising(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    max_ttl = 1500
    backend = make_backend(server.url, max_ttl_ms=max_ttl)
    before, _ = await acquire_when_possible(backend, "k", "alice", max_ttl)
    assert before.token is not None
    restart_began = time.time()
    server.restart(keep_data=False)  # every lease and counter is gone
    refused = await first_answer(backend, "k", "bob", max_ttl)
    assert (refused.acquired, refused.owner, refused.retry_after_ms is not None) == (
        False,
        None,
        True,
    )
    after, granted_at = await acquire_when_possible(backend, "k", "bob", max_ttl)
    # alice's lease (granted before the restart) may have lived until
    # restart_began + max_ttl: bob must not get the key before that.
    assert granted_at - restart_began >= max_ttl / 1000 - 0.05
    assert after.token is not None and after.token > before.token


@pytest.mark.asyncio
async def test_restart_with_persistence_keeps_leases(make_backend: MakeBackend) -> None:
    with RedisServer(persistence=True) as server:
        # appendfsync always and no marker yet: the server is new, so first
        # contact is granted at once although it started moments ago.
        writer = make_backend(server.url, max_ttl_ms=30_000)
        granted = await writer.acquire_lease("k", "alice", 30_000)
        assert granted.acquired
        server.restart(keep_data=True)
        guarded = make_backend(server.url, max_ttl_ms=30_000)
        # The lease survived, so the holder is named.
        denied = await first_answer(guarded, "k", "bob", 30_000)
        assert denied == AcquireResult(
            acquired=False, owner="alice", token=None, reason=RefusalReason.HELD
        )
        record = await guarded.get_lease("k")
        assert record is not None and record.token == granted.token
        # appendfsync always and never promoted: the restart lost nothing, so
        # a key the server never saw is granted at once too.
        assert (await guarded.acquire_lease("new", "bob", 1000)).acquired


@pytest.mark.asyncio
async def test_script_cache_flush_runs_each_operation_once(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    backend = make_backend(server.url, quarantine=False)
    granted = await backend.acquire_lease("k", "alice", 10_000)
    server.command("SCRIPT", "FLUSH")
    server.command("CONFIG", "RESETSTAT")
    # A transfer that ran twice would report False (alice no longer holds it).
    assert await backend.transfer_lease("k", "alice", "bob", 10_000) is True
    stats = server.client().info("commandstats")
    assert stats["cmdstat_eval"]["calls"] == 1
    record = await backend.get_lease("k")
    assert record is not None and record.owner == "bob"
    assert granted.token is not None and record.token > granted.token
    server.command("SCRIPT", "FLUSH")
    keys = [f"r{i}" for i in range(50)]
    for key in keys:
        await backend.acquire_lease(key, "bob", 10_000)
    server.command("SCRIPT", "FLUSH")
    assert await backend.renew_leases([*keys, "missing"], "bob", 10_000) == [True] * 50 + [False]


@pytest.mark.asyncio
async def test_lost_counter_does_not_lower_the_token(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    backend = make_backend(server.url, quarantine=False)
    first = await backend.acquire_lease("k", "alice", 10_000)
    await backend.release_lease("k", "alice")
    assert server.command("DEL", b"tenure:{k}:token") == 1
    second = await backend.acquire_lease("k", "bob", 10_000)
    assert first.token is not None and second.token is not None
    assert second.token > first.token


@pytest.mark.asyncio
async def test_evicting_policy_warns(
    server: RedisServer, make_backend: MakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    server.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    backend = make_backend(server.url, quarantine=False)
    with caplog.at_level(logging.WARNING, logger="tenure.redis"):
        assert (await backend.acquire_lease("k", "alice", 1000)).acquired
    assert "allkeys-lru" in caplog.text and "noeviction" in caplog.text


@pytest.mark.asyncio
async def test_evicting_policy_is_refused_when_strict(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    server.command("CONFIG", "SET", "maxmemory-policy", "volatile-ttl")
    backend = make_backend(server.url + "?strict=true", quarantine=False)
    with pytest.raises(ConfigurationError, match="volatile-ttl"):
        await backend.acquire_lease("k", "alice", 1000)
    with pytest.raises(ConfigurationError, match="volatile-ttl"):
        await backend.publish("topic", Event(type="t"))
    server.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
    ok = make_backend(server.url + "?strict=true", quarantine=False)
    assert (await ok.acquire_lease("k", "alice", 1000)).acquired


@pytest.mark.asyncio
async def test_wrong_password_never_leaks(
    make_backend: MakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "correct-horse-42"
    wrong = "wrong-battery-17"
    with RedisServer(password=secret) as server:
        server.command("ACL", "SETUSER", "alice", "on", ">alice-pw-9", "~*", "&*", "+@all")
        bad = make_backend(server.url_for(password=wrong), quarantine=False)
        bad_user = make_backend(server.url_for("alice", wrong), quarantine=False)
        with caplog.at_level(logging.DEBUG):
            for backend in (bad, bad_user):
                with pytest.raises(BackendUnavailable) as info:
                    await backend.acquire_lease("k", "alice", 1000)
                texts = [str(info.value), repr(info.value), repr(backend), str(backend)]
                texts += [str(info.value.__cause__), repr(info.value.__cause__)]
                assert not any(wrong in text for text in texts), texts
        assert wrong not in caplog.text
        good = make_backend(server.url, quarantine=False)
        assert (await good.acquire_lease("k", "alice", 1000)).acquired
        assert secret not in repr(good)
        acl_user = make_backend(server.url_for("alice", "alice-pw-9"), quarantine=False)
        assert (await acl_user.acquire_lease("k", "alice", 1000)).acquired
        assert "alice-pw-9" not in repr(acl_user)


@pytest.mark.asyncio
@pytest.mark.parametrize("protocol", [2, 3])
async def test_password_in_the_query(
    make_backend: MakeBackend, caplog: pytest.LogCaptureFixture, protocol: int
) -> None:
    secret = "query-pw&=42"
    with RedisServer(password=secret) as server:
        server.command("ACL", "SETUSER", "alice", "on", ">alice pw+9", "~*", "&*", "+@all")
        base = f"redis://127.0.0.1:{server.port}/0?protocol={protocol}&quarantine=off"
        good = make_backend(f"{base}&password={quote(secret, safe='')}")
        assert (await good.acquire_lease("k", "alice", 1000)).acquired
        assert await good.wait_lease_released("free", 1) is True
        acl_user = make_backend(f"{base}&username=alice&password={quote('alice pw+9')}")
        assert await acl_user.get_lease_owner("k") == "alice"
        wrong = "wrong-pw-77"
        bad = make_backend(f"{base}&password={wrong}")
        with caplog.at_level(logging.DEBUG):
            with pytest.raises(BackendUnavailable) as info:
                await bad.acquire_lease("k", "bob", 1000)
            with pytest.raises(BackendUnavailable):
                await bad.publish("topic", Event(type="t"))
        texts = [str(info.value), repr(info.value), repr(bad), repr(good), repr(acl_user)]
        texts += [str(info.value.__cause__), repr(info.value.__cause__)]
        for password in (secret, quote(secret, safe=""), wrong, "alice pw+9"):
            assert not any(password in text for text in texts), texts
            assert password not in caplog.text


@pytest.mark.asyncio
async def test_killed_server_raises_backend_unavailable(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    backend = make_backend(server.url, quarantine=False)
    assert (await backend.acquire_lease("k", "alice", 10_000)).acquired
    server.kill()
    with pytest.raises(BackendUnavailable) as info:
        await backend.renew_lease("k", "alice", 10_000)
    assert info.value.__cause__ is not None
    with pytest.raises(BackendUnavailable):
        await backend.get_lease("k")


@pytest.mark.asyncio
async def test_paused_server_times_out_as_backend_unavailable(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    backend = make_backend(server.url, quarantine=False, socket_timeout=0.5)
    assert (await backend.acquire_lease("k", "alice", 10_000)).acquired
    server.pause()
    try:
        with pytest.raises(BackendUnavailable):
            await backend.renew_lease("k", "alice", 10_000)
    finally:
        server.resume()
    # The server comes back; so does the backend.
    for _ in range(20):
        try:
            assert await backend.renew_lease("k", "alice", 10_000) is True
            break
        except BackendUnavailable:
            await asyncio.sleep(0.05)
    else:
        raise AssertionError("the backend did not recover")


@pytest.mark.asyncio
async def test_closed_backend_raises_and_leaves_nothing_running(server: RedisServer) -> None:
    backend = RedisStreamsPubSub.from_url(server.url, quarantine=False)
    got: list[Event] = []

    async def callback(event: Event) -> None:
        got.append(event)

    await backend.subscribe("topic", callback)
    await backend.subscribe("topic2", callback, group="g")
    assert (await backend.acquire_lease("k", "alice", 10_000)).acquired
    waiter = asyncio.create_task(backend.wait_lease_released("k", 30))
    await until_parked(backend, "k")
    await backend.aclose()
    assert await waiter is True  # closing wakes waiters
    assert asyncio.all_tasks() == {asyncio.current_task()}
    clients = server.command("CLIENT", "LIST").decode().strip().splitlines()
    assert len(clients) == 1, clients  # only the admin connection of this check
    assert server.command("XINFO", "GROUPS", b"tenure:{topic}:stream") == []
    for call in (
        backend.acquire_lease("k", "alice", 1000),
        backend.get_lease_owner("k"),
        backend.get_lease("k"),
        backend.release_lease("k", "alice"),
        backend.renew_lease("k", "alice", 1000),
        backend.transfer_lease("k", "alice", "bob", 1000),
        backend.renew_leases(["k"], "alice", 1000),
        backend.wait_lease_released("k", 1),
        backend.publish("topic", Event(type="t")),
        backend.subscribe("topic", callback),
        backend.flush(),
    ):
        with pytest.raises(BackendClosed):
            await call
    await backend.aclose()  # idempotent


@pytest.mark.asyncio
async def test_reader_recovers_entries_whose_reply_was_lost(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    backend = make_backend(server.url, quarantine=False)
    got: list[Event] = []

    async def callback(event: Event) -> None:
        got.append(event)

    await backend.subscribe("t", callback)
    sub = next(iter(backend._subs["t"].values()))
    await backend.unsubscribe("t", callback)  # keep the group alive by hand below
    stream = b"tenure:{t}:stream"
    server.command("XGROUP", "CREATE", stream, sub.group, "$", "MKSTREAM")
    publisher = make_backend(server.url, quarantine=False)
    sent = [await publisher.publish("t", Event(type="t", data=i)) for i in range(3)]
    # Entries handed to the consumer whose reply never arrived: pending, unread.
    server.command("XREADGROUP", "GROUP", sub.group, sub.consumer, "STREAMS", stream, ">")
    sent.append(await publisher.publish("t", Event(type="t", data=3)))
    sub.stopped = False  # unsubscribe stopped it; it is revived by hand
    sub.task = asyncio.get_running_loop().create_task(backend._read_loop(sub))
    backend._subs["t"] = {callback: sub}
    await eventually(lambda: len(got) == 1)  # entry 3, read with ">"; now blocked reading
    await asyncio.sleep(0.2)
    server.command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # the reader fails once
    await eventually(lambda: len(got) >= 4, timeout=20)
    assert sorted(e.data for e in got) == [0, 1, 2, 3]
    assert {e.id for e in got} == {e.id for e in sent}
    assert sorted(e.attempt for e in got) == [1, 2, 2, 2]


@pytest.mark.asyncio
async def test_after_a_lost_reply_entries_handed_back_before_it_go_first(
    server: RedisServer, make_backend: MakeBackend
) -> None:
    """Entries handed back to the group (a reclaim) and newer ones that a read
    took for this member but whose reply was lost: after the failure, the member
    handles them all in id order, not its own first. (Handling its own first
    is what ran a thread's later signals before earlier ones in a soak with
    restarts.) The periodic look at others' entries is 10 s away here, so only
    the recovery decides the order."""
    backend = make_backend(server.url, quarantine=False, socket_timeout=20, block_ms=10_000)
    publisher = make_backend(server.url, quarantine=False)
    got: list[Event] = []

    async def callback(event: Event) -> None:
        got.append(event)

    await backend.subscribe("t", callback, group="g")
    sub = next(iter(backend._subs["t"].values()))
    await asyncio.sleep(0.2)  # its first look is over: it blocks on new entries
    stream = b"tenure:{t}:stream"
    events = [Event(type="t", data=i) for i in range(6)]
    # In one step each, so the blocked reader takes none of them: three entries
    # read by a member that is gone, then three read for this member, whose
    # reply (as if) never arrived.
    for consumer, batch in ((b"gone", events[:3]), (sub.consumer.encode(), events[3:])):
        server.command(
            "EVAL",
            "for i = 3, #ARGV do redis.call('XADD', KEYS[1], '*', 'e', ARGV[i]) end "
            "return redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'STREAMS', KEYS[1], '>')",
            1,
            stream,
            sub.group,
            consumer,
            *(e.to_json() for e in batch),
        )
        if consumer == b"gone":
            assert await publisher.reclaim("t", "g") == 3
    assert got == []
    server.command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # the reader fails once
    await eventually(lambda: len(got) >= 6, timeout=15)
    assert [e.data for e in got] == list(range(6))
    assert [e.attempt for e in got] == [2] * 6


@pytest.mark.asyncio
async def test_a_reader_blocked_on_a_paused_server_notices_and_reads_again_after(
    server: RedisServer, make_backend: MakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that stops answering (``SIGSTOP``: no reset, as with a dead host)
    under a subscriber blocked in ``XREADGROUP``: its read times out within the
    socket timeout, which the reader reports and retries, instead of waiting on
    the connection forever; once the server answers again, so does the reader."""
    backend = make_backend(server.url, quarantine=False, socket_timeout=0.5)
    publisher = make_backend(server.url, quarantine=False)
    got: list[object] = []

    async def callback(event: Event) -> None:
        got.append(event.data)

    await backend.subscribe("t", callback, group="g")
    await publisher.publish("t", Event(type="t", data=1))
    await eventually(lambda: got == [1])
    caplog.set_level(logging.WARNING, logger="tenure.redis")
    server.pause()
    try:
        await eventually(
            lambda: any("reading topic 't'" in r.getMessage() for r in caplog.records),
            timeout=20,
        )
    finally:
        server.resume()
    for _ in range(100):  # its connection may have been reset meanwhile
        try:
            await publisher.publish("t", Event(type="t", data=2))
            break
        except BackendUnavailable:
            await asyncio.sleep(0.05)
    await eventually(lambda: 2 in got, timeout=20)
    # At least once: the acknowledgement of 1 may have been cut off by the pause
    # (then 1 comes again, before 2), and so may the reply to a publish of 2.
    assert got == [1] * got.count(1) + [2] * got.count(2), got
