"""``RedisStreamsPubSub``: the lease half and the event half on one connection."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from typing import Any, Self

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from ..._contract import Capability
from ..._errors import ConfigurationError, InvalidArgument
from ..._validate import MAX_TTL_MS
from ._client import client_from_url, client_settings
from ._leases import RedisLeases
from ._reading import LONG_BLOCK_MS, stop_reader
from ._streams import RedisStreams

__all__ = ["RedisClusterPubSub", "RedisStreamsPubSub"]


def _check_numbers(
    *, min_replicas: int, retention_ms: int, max_ttl_ms: int, **at_least_one: int
) -> None:
    """Raise :class:`InvalidArgument` for a numeric option out of range."""
    for name, value in {"max_ttl_ms": max_ttl_ms, **at_least_one}.items():
        if type(value) is not int or value < 1:
            raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")
    for name, value in (("min_replicas", min_replicas), ("retention_ms", retention_ms)):
        if type(value) is not int or value < 0:
            raise InvalidArgument(f"{name} must be an int >= 0, got {value!r}")
    if max_ttl_ms > MAX_TTL_MS:
        raise InvalidArgument(f"max_ttl_ms must be at most {MAX_TTL_MS}, got {max_ttl_ms}")


class RedisStreamsPubSub(RedisLeases, RedisStreams):
    """Leases (Lua scripts) and durable pub/sub (Redis Streams) on one Redis.

    **Leases.** Each operation is one Lua script, so the ownership check and
    the change are one atomic step on the server, in one round trip. Expiry is
    the key's ``PX`` on the server's clock; the client's clock is never used.
    A lease key holds ``"<token>:<owner>"``; next to it (same hash slot) a
    counter key holds the key's last fencing token. A new token is
    ``max(counter + 1, server time in µs)``, so tokens strictly increase per
    key also when the counter was cleaned up (it expires after 24 h idle) or
    lost. Keys are ``<prefix>{<key>}:lease`` and ``<prefix>{<key>}:token``
    with ``%``, ``{``, ``}`` of the key percent-escaped: the mapping is
    injective and each script touches one hash slot (Redis Cluster safe).

    **TTL limit.** ``ttl_ms`` may not exceed ``max_ttl_ms`` (default 60 000;
    the other backends take up to 2**31 - 1): it bounds how long a lost lease
    could still be in use, which is how long the quarantine below refuses
    grants, so a larger ceiling means longer refusals after a loss. Every
    client of a prefix must use the same ``max_ttl_ms``, at least the largest
    TTL any of them uses. The error for a larger TTL says this.

    **State loss and quarantine.** A Redis that loses data (a restart without
    persistence, ``FLUSHALL``/``FLUSHDB``, eviction, a failover to a replica
    that had not received the last grants) forgets leases that their holders
    still use; granting at once would give a key two owners. Where the server
    shows signs of such a loss, new grants of the prefix are refused for
    ``max_ttl_ms`` (the longest a lost lease can be in use): a refused grant
    returns ``AcquireResult(acquired=False, owner=None, retry_after_ms=…,
    reason=RefusalReason.QUARANTINE)``, ``hold`` and ``acquire_wait`` raise
    :class:`LeaseUnavailable` saying so, and one warning with the reason is
    logged per quarantine. Leases that survived are still named as held. The
    rules (the epoch marker, flushes, when a server counts as new) and what
    they cannot detect are in the docstring of
    :class:`tenure.backends.redis._quarantine.Quarantine`.

    **Clock.** Expiry (``PX``) and tokens use the server's wall clock, not a
    monotonic one. A *forward* step of the Redis host's clock ends every live
    lease at once: a second owner can be granted while the first still
    renews (its next renew returns ``False``); tenure does not detect it. The
    second owner's token is higher, so a store fenced by tokens rejects the
    first owner's late writes (tested with a one-hour step). A *backward* step
    makes leases last longer than their TTL in real time (never shorter), and
    a step back past the server's start time is treated as a possible loss
    (a quarantine from now). Tokens are ``max(counter + 1, server time in
    µs)``: while the counter exists they keep increasing whatever the clock
    does; if the counter was lost (a restart without persistence), a server
    clock that is now behind the time of the last grant by more than the
    quarantine plus the downtime gives a *lower* token than before the
    restart, and a fenced store would refuse the new owner's writes until the
    clock catches up. Keep the Redis host on NTP with slewing (not stepping),
    and use persistence where tokens matter.

    **Sentinel.** ``redis+sentinel://`` URLs (see :meth:`from_url`), or a
    client from ``redis.asyncio.sentinel.Sentinel.master_for``, reach the
    master the sentinels name; every new connection asks them again, and a
    connection that finds its server demoted (``READONLY``) or gone is dropped,
    so the next operation reaches the new master (an operation in flight
    fails with :class:`BackendUnavailable`). A promoted replica has a new
    replication ID, so the first connection to it runs the epoch check, which
    refuses new grants for ``max_ttl_ms``; leases that were replicated keep
    being renewed and are named as held. What this guarantees through a
    failover, with asynchronous replication: a lease the old master granted
    and the replica never received is not granted again before it expires
    (the quarantine), *unless* clients were still writing to the old master
    after the quarantine on the new one had ended (a ``SENTINEL FAILOVER`` or
    a partition leaves the old master taking writes until the sentinels demote
    it, usually within seconds). Fencing tokens stay the guarantee of last
    resort: tokens come from the server's clock, so the new master's tokens
    exceed the old one's while the two clocks agree to within the time since
    the last grant.

    **Replicas** (``min_replicas=N``, default 0). After a grant, a transfer
    or a renewal that succeeded, the backend sends ``WAIT N replica_wait_ms``
    on the same connection before answering: the caller sees success only
    once N replicas have the change in memory. Too few in time raises
    :class:`BackendUnavailable` (a grant or transfer is released first, so the
    caller never holds a lease it was not told of; a renewal stays, and the
    holder's deadline still counts from its last acknowledged one). What each
    setting guarantees through a failover to a replica that Sentinel picks
    (the one with the most data): with ``N`` = the number of replicas, every
    acknowledged grant and renewal is on the promoted replica, so a held lease
    survives with its expiry and no second owner is granted; with 0 < N <
    replicas, only if the promoted replica is among those that acknowledged
    (Sentinel prefers the most advanced one, which is, unless it is down);
    with 0, an acknowledged grant can be missing on the promoted replica, and
    the epoch check's quarantine is what keeps it from being granted again
    (see **Sentinel** for its limit). ``WAIT`` is not consensus: a replica that
    acknowledged and then restarts without persistence forgets again, and
    ``WAIT`` costs a round trip to the replicas on every grant and renewal.

    **Eviction.** At first use the backend reads ``maxmemory-policy``; any
    policy but ``noeviction`` can evict live leases, so it logs a warning, or
    with ``strict=True`` every operation raises :class:`ConfigurationError`.

    **Failures.** Connection failures and timeouts (``socket_timeout``,
    default 5 s) raise :class:`BackendUnavailable`; the outcome of the
    operation is then unknown (every lease operation is safe to retry, but
    a retried transfer that had succeeded reports ``False``). Lease scripts
    are never re-sent by a retry layer, so one never runs twice; if an
    ``EVALSHA`` finds the server's script cache empty (``SCRIPT FLUSH``,
    restart) it is re-sent once as ``EVAL``, which is safe because
    ``NOSCRIPT`` means it did not run. The client built by :meth:`from_url`
    has redis-py's retries off for every other command too (the options that
    would turn them on are refused); an injected client keeps its own
    settings for stream commands (and, if it speaks RESP3, for lease
    commands: build it with ``retry=Retry(NoBackoff(), 0)``). No error, log
    line or ``repr`` shows the password (of the URL's user-info, of
    ``?password=``, or of the client's settings).

    **Connections.** Lease commands share one pipelined connection: a lone
    caller gets one round trip per operation, concurrent callers share
    writes and reads. Replies later than ``socket_timeout`` fail every
    waiting call with :class:`BackendUnavailable` and the connection is
    replaced. Stream commands use redis-py's pool (at most
    ``max_concurrency`` at once, plus one blocking reader per subscription);
    :meth:`wait_lease_released` uses one pub/sub connection.

    **Waiting.** ``release_lease`` and ``transfer_lease`` publish the key on
    ``<prefix>lease-released``; :meth:`wait_lease_released` listens on one
    pub/sub connection per backend and wakes one local waiter per message.
    During a quarantine it waits for the quarantine's end instead of
    answering "free" at once.

    **Construction.** ``RedisStreamsPubSub(client, **options)`` takes an
    existing ``redis.asyncio.Redis`` (``decode_responses`` must be off); it
    is not closed by :meth:`aclose` unless ``owns_client=True``.
    :meth:`from_url` builds and owns its client. Nothing connects before the
    first operation.

    **Events.** A topic is a stream ``<prefix>{<topic>}:stream`` (``XADD``
    with ``MAXLEN ~ stream_maxlen``; trimming can drop events a slow group
    has not read). A ``group`` is a consumer group (created at the stream's
    end the first time, then durable); a fan-out subscription gets a private
    group that is destroyed on unsubscribe and on ``aclose()`` (a process that
    dies leaves it behind: it holds no data but stays listed). A member of a
    shared group waits for new entries up to ``block_ms`` (default 1000) at a
    time, and looks for what other members left between two waits; a
    fan-out subscriber, and a fenced one (below), has no one else's entries
    to look for and waits up to 10 s. Every wait ends within half the
    client's ``socket_timeout`` (2.5 s with the default of 5 s). A member
    hands its events to its callback one at a time, in stream order. A
    callback that returns acknowledges (``XACK``, by ``lua/settle.lua``, only
    while this member still holds the entry), in a batch with the other
    entries of the same read, before the member's next read or its hand-back
    (a process that dies in between gets them again); one that raises gets the event
    again with ``attempt`` increased, up to ``max_attempts`` (default 5), then
    the event is acknowledged, dropped and logged at ERROR. Events a dead
    member of a group never acknowledged are claimed by a live member after
    ``claim_idle_ms`` (default 30 000) idle, or at once after :meth:`reclaim`,
    with ``attempt`` = deliveries so far + 1. Events a member had not
    acknowledged when it unsubscribed (or its backend was closed) are handed
    back to the group at once and taken by the next member that looks (see
    :meth:`unsubscribe`). Delivery is at least once: a callback slower than
    ``claim_idle_ms`` can see its event handed to another member too (its own
    return then acknowledges nothing; the new holder's does).

    **Retried publishes** (``DEDUPE``). A ``publish`` whose event carries a
    caller-given ``id`` stores it only if no event with that id was published
    on the topic within ``dedupe_window_ms`` (default 24 h): otherwise it
    stores nothing and returns the first event (same id, ``created_at``,
    data). The check and the ``XADD`` are one script, so two concurrent
    publishes of one id store one event, and a publish retried after
    :class:`BackendUnavailable` stores it once. The same id on another topic
    is another event. The guard is a key
    ``<prefix>{<topic>}:id:<id>`` (the stream's hash slot) holding the first
    event, expiring after the window: one key per id-given event for 24 h, so
    memory grows with their rate. An event without an id (one is generated)
    sets no guard; every publish is one script, one round trip, like the
    ``XADD`` it replaces.

    **Retention.** With ``retention_ms`` (default 0: off), a topic's stream
    expires ``retention_ms`` after its last member left it, once every group
    had read and acknowledged all of it; a publish or a subscribe before then
    keeps it (``PERSIST``). A lease's fencing counter is then kept as long
    (at least twice the TTL) instead of 24 h: tokens stay increasing without
    it, being at least the server's time in microseconds. Guards of
    caller-given ids expire after ``dedupe_window_ms``. Fan-out-only topics
    and streams whose dead members are still listed in a group are kept. An
    expired stream's groups are gone with it: a group subscribed to later
    starts at the end, after whatever was published meanwhile
    (:attr:`forgets_idle_groups`; the thread runtime allows for it).

    **Reclaim** (``RECLAIM``). :meth:`reclaim` gives every event of a group
    that any member (alive or dead) was delivered and did not acknowledge
    back to the group at once, in one script: each entry moves to the
    placeholder consumer ``tenure.returned`` with a huge idle time, keeping
    its delivery count. Every member takes such entries, in publish order,
    when it subscribes, at least every ``min(block_ms, claim_idle_ms / 2)``,
    and after every read that returned newer entries, before handling those:
    so the next reads of the group deliver them before any newer event, with
    ``attempt`` = deliveries so far + 1. The old delivery can no longer
    settle them: its callback's return acknowledges nothing (``lua/settle.lua``
    acknowledges an entry only for the consumer that holds it) and its raise
    retries nothing (the retry is not run and is logged at INFO); the event
    is delivered once more, by whoever takes it. Entries a live member had
    already read but not yet handed to its callback are still handed to it,
    so such an event can be delivered twice more; this does not happen to a
    member that is dead or stopped, the case ``reclaim`` is for (a sole
    consumer elected by a lease taking over). Returns how many entries came
    back; 0 when the topic or the group does not exist.

    **Backlog** (``BACKLOG``). Each named group has an index, the set
    ``<prefix>backlog:g:<group>`` of topics: the publish script adds its topic
    to the index of every named group of the stream, in the same step as the
    ``XADD``. :meth:`backlog` reads the index and checks the topics that
    start with the given prefix in one script (``XINFO GROUPS``: entries
    pending, or a lag above 0; where Redis cannot tell the lag, an entry after
    the group's last-delivered id), which removes the drained ones in the same
    step, so a topic whose event was published before the call is always
    listed. Cost: one ``SMEMBERS`` of the index (the group's topics with
    events published since a matching call last found them drained, of any
    topic prefix) and one script per 256 matching topics; idle topics cost
    nothing once seen drained. The index key is not in the stream's hash
    slot, so publish and backlog touch two slots: a Redis Cluster concern
    left for later (on one Redis, or a cluster of one shard, it is exact).

    **Fenced takes** (``FENCED_TAKES``; not on a cluster, where the lease and
    the stream are in different slots). ``subscribe(..., fence=LeaseFence(key,
    owner_prefix))``: every take of that subscription (the read of new entries,
    and the claim of entries others left or a reclaim gave back) is one script
    (``lua/fenced.lua``) that checks the lease ``key`` is held by an owner with
    that prefix and takes nothing otherwise; it waits for new entries with
    ``XREAD BLOCK``, which takes nothing. A subscriber whose lease is gone can
    then not take what the next holder reclaimed or is about to read. The
    thread runtime subscribes this way. A fenced subscriber is its group's
    sole reader, elected by the lease: it takes what its predecessor left when
    it subscribes, and then waits as a fan-out subscriber does (up to 10 s,
    within half the socket timeout). An idle live thread of the runtime (its
    reader, and its control topic's fan-out subscription) so costs a wait
    each per 2.5 s rather than per second with the default socket timeout,
    per 10 s with one of 20 s or none.
    """

    capabilities = RedisLeases.capabilities | RedisStreams.capabilities
    _cluster_client = False
    _client_kind = "redis.asyncio.Redis (a Sentinel master_for() client is one)"

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        *,
        prefix: str = "tenure:",
        max_ttl_ms: int = 60_000,
        quarantine: bool = True,
        min_replicas: int = 0,
        replica_wait_ms: int = 500,
        strict: bool = False,
        max_attempts: int = 5,
        stream_maxlen: int = 100_000,
        claim_idle_ms: int = 30_000,
        block_ms: int = 1000,
        dedupe_window_ms: int = 86_400_000,
        retention_ms: int = 0,
        max_concurrency: int = 128,
        owns_client: bool = False,
    ) -> None:
        self._check_client(client)
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise ConfigurationError(f"prefix must be a str without braces, got {prefix!r}")
        _check_numbers(
            max_ttl_ms=max_ttl_ms,
            max_attempts=max_attempts,
            stream_maxlen=stream_maxlen,
            claim_idle_ms=claim_idle_ms,
            block_ms=block_ms,
            dedupe_window_ms=dedupe_window_ms,
            max_concurrency=max_concurrency,
            min_replicas=min_replicas,
            retention_ms=retention_ms,
            replica_wait_ms=replica_wait_ms,
        )
        kwargs = client_settings(client)
        super().__init__(max_ttl_ms=max_ttl_ms)
        self._setup_connection(
            client, prefix=prefix, strict=bool(strict), max_concurrency=max_concurrency
        )
        self._owns_client = owns_client
        self._setup_leases(
            quarantine_ms=max_ttl_ms if quarantine else 0,
            min_replicas=min_replicas,
            replica_wait_ms=replica_wait_ms,
            retention_ms=retention_ms,
        )
        socket_timeout = kwargs.get("socket_timeout")
        long_block_ms = max(block_ms, LONG_BLOCK_MS)
        # A blocking read must return before the socket timeout fires.
        if socket_timeout:
            block_ms = max(1, min(block_ms, int(socket_timeout * 500)))
            long_block_ms = max(1, min(long_block_ms, int(socket_timeout * 500)))
        self._setup_streams(
            max_attempts=max_attempts,
            stream_maxlen=stream_maxlen,
            claim_idle_ms=claim_idle_ms,
            block_ms=block_ms,
            long_block_ms=long_block_ms,
            dedupe_window_ms=dedupe_window_ms,
            retention_ms=retention_ms,
        )

    def _check_client(self, client: Any) -> None:
        if isinstance(client, RedisCluster) != self._cluster_client:
            raise ConfigurationError(
                f"{type(self).__name__} takes a {self._client_kind}, got "
                f"{type(client).__name__}"
                + (" (use RedisClusterPubSub)" if isinstance(client, RedisCluster) else "")
            )
        if not isinstance(client, aioredis.Redis | RedisCluster):
            raise ConfigurationError(
                f"client must be a {self._client_kind}, got {type(client).__name__}"
            )
        if client_settings(client).get("decode_responses"):
            raise ConfigurationError("the Redis client must have decode_responses=False")

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """``redis://[user[:password]@]host[:port][/db][?…]`` or ``rediss://…`` (TLS),
        or ``redis+sentinel://[[user]:password@]host:port[,host:port…]/<service_name>[?db=N&…]``.

        With ``redis+sentinel://`` the hosts are the sentinels; the user-info
        and the query options are for the master's connections (the sentinels
        get the socket timeouts, no password).

        Query parameters: tenure's ``prefix``, ``max_ttl_ms``, ``quarantine``,
        ``min_replicas``, ``replica_wait_ms``, ``strict``, ``max_attempts``, ``stream_maxlen``, ``claim_idle_ms``,
        ``dedupe_window_ms``, ``retention_ms`` and ``max_concurrency`` (see the class docstring), and every option
        redis-py's own ``from_url`` takes (``db``, ``password``, ``username``,
        ``protocol``, ``socket_timeout``, ``client_name``, the ``ssl_*``
        options…), passed on as written. Refused, because they would turn
        redis-py's retries on and a retried lease script could run twice:
        ``retry_on_timeout=true``, ``retry_on_error`` (and the keywords
        ``retry``, ``retry_on_timeout``, ``retry_on_error``); refused too:
        ``decode_responses``. Any other parameter, a bad value, or an option
        the connection class does not take raises :class:`ConfigurationError`,
        whose message never shows a password. Keyword ``options`` override the
        query. Nothing is connected until first use.
        """
        client, ours = client_from_url(url, options)
        ours["owns_client"] = True
        return cls(client, **ours)

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"{type(self).__name__}({self._where}, prefix={self._prefix!r}{state})"

    async def aclose(self) -> None:
        """Stop every reader and the listener, drop private groups, close connections."""
        if self._closed:
            return
        self._closed = True
        subs = self._take_subs()
        listener = self._release_listener.cancel()
        sweep = self._quarantine.cancel_sweep()
        await asyncio.gather(*(stop_reader(sub) for sub in subs))
        tasks = [t for t in (listener, sweep) if t is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._waiters.wake_all()
        await self._retire_all(subs)
        await self._conn.aclose(close_client=self._owns_client)

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        if not getattr(self, "_closed", True) and getattr(self, "_subs", None):
            _warn(f"unclosed {self!r} with active subscriptions", ResourceWarning, stacklevel=1)


class RedisClusterPubSub(RedisStreamsPubSub):
    """:class:`RedisStreamsPubSub` on a Redis Cluster (``redis+cluster://``, or a
    ``redis.asyncio.RedisCluster``).

    Everything of the parent holds per key: every lease script touches one key
    slot (the lease, its counter and the epoch marker of that slot for the
    prefix, ``<prefix>{<tag in the slot>}:epoch``), and so does every event
    script (the stream and its dedupe guards). redis-py routes each command by
    its key's slot and follows ``MOVED``/``ASK`` (a redirected command did not
    run, so re-sending it is safe); its retries after a connection failure are
    off, as on one Redis. What differs:

    - No ``BACKLOG`` (so not the thread runtime's ``RUNTIME_LOG``): a group's
      backlog index would live in another slot than the streams it lists.
    - Lease commands go through redis-py's per-node pools (no pipelined
      connection), so ``min_replicas`` is refused (``WAIT`` must follow the
      write on its connection).
    - No connection runs the epoch check before its first command; instead the
      acquire script compares the slot's marker with the node's replication ID
      on every new grant (one ``INFO replication`` more per new grant), so a
      failover inside the cluster is seen at the first grant in each slot.
      Markers are per slot, so a promoted replica (``master_replid2`` set)
      refuses the first grant of the prefix in *each* of its slots that has no
      marker yet for ``max_ttl_ms``: it cannot tell "never used" from "the first
      grant did not reach me". That costs availability after failovers (see
      SAFETY.md, the ``redis-cluster`` soak).
    - Release wake-ups listen on a plain connection to one primary
      (``PUBLISH`` reaches every node).
    - ``scan_leases`` scans every primary in turn; a key whose slot migrates
      during a scan can be missed or listed late.
    - The configuration check reads every primary: one evicting primary makes
      the backend evicting, and ``appendfsync always`` counts only if all have it.

    ``from_url("redis+cluster://[[user]:password@]host:port[,host:port…][?…]")``:
    the hosts are startup nodes (any of the cluster's); options as in
    :meth:`RedisStreamsPubSub.from_url`, without ``db`` (a cluster has one).
    """

    capabilities = RedisStreamsPubSub.capabilities & ~(Capability.BACKLOG | Capability.FENCED_TAKES)
    _cluster_client = True
    _client_kind = "redis.asyncio.RedisCluster"
