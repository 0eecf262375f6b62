"""The lease half of the Redis backend: one Lua script per operation.

The Python side only checks arguments, names the keys, runs the script and
reads its reply; every decision is made by the script, atomically, on the
server's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

from redis.crc import key_slot
from redis.exceptions import ResponseError

from ..._contract import AcquireResult, LeaseRecord, RefusalReason
from ..._doctor import Finding
from ..._errors import BackendUnavailable, ConfigurationError
from .._core import LEASE_CAPABILITIES, PAGE, LeaseCore
from ._connection import RedisConnection
from ._keys import _slot_tags, _tag, slot_tag
from ._scripts import Script, load_script

__all__ = ["RedisLeases"]

logger = logging.getLogger("tenure.redis")

# An idle key's fencing counter is kept this long (or twice its lease's TTL if
# longer). Its loss is harmless: tokens are at least the server's time in µs.
_COUNTER_KEEP_MS = 24 * 3600 * 1000
_RELEASED_CHANNEL = b"lease-released"

_ACQUIRE = load_script("acquire")
_RENEW = load_script("renew")
_RELEASE = load_script("release")
_TRANSFER = load_script("transfer")
_GET = load_script("get")
_REVOKE = load_script("revoke")
_EPOCH = load_script("epoch")
_MARKER = b"epoch"
_HELD = RefusalReason.HELD
_QUARANTINE = RefusalReason.QUARANTINE
# Outside every prefix: one per server (see _flush_record_of).
_FLUSH_RECORD = b"tenure:flush-seen"
_GLOB_SPECIAL = frozenset(b"\\*?[]")
_LEASE_SUFFIX = b"}:lease"


def _glob_literal(raw: bytes) -> bytes:
    """``raw`` as a ``SCAN MATCH`` pattern that matches only itself."""
    return b"".join(b"\\" + bytes([c]) if c in _GLOB_SPECIAL else bytes([c]) for c in raw)


def _untag(tag: bytes) -> str:
    """The key of a hash tag made by ``_tag`` (its inverse)."""
    return tag.replace(b"%7D", b"}").replace(b"%7B", b"{").replace(b"%25", b"%").decode("utf-8")


def _split_value(value: bytes) -> tuple[int, str]:
    token, _, owner = value.partition(b":")
    return int(token), owner.decode("utf-8")


class RedisLeases(LeaseCore):
    """Leases as Lua scripts, and release wake-ups over Redis pub/sub.

    A lease key holds ``"<token>:<owner>"`` with the lease's ``PX``; next to
    it (same hash slot) a counter key holds the key's last fencing token.
    ``release_lease`` and ``transfer_lease`` publish the key on
    ``<prefix>lease-released`` (in the same script); waiters listen on one
    pub/sub connection per backend. The guarantees are in the
    :class:`~tenure.backends.redis.RedisStreamsPubSub` docstring.
    """

    # The connection part, set up once by the backend's RedisParts (which it
    # inherits through its event half): declared here, not inherited twice.
    _conn: RedisConnection
    _client: Any
    _eval: Callable[[Script, Sequence[bytes], Sequence[Any]], Awaitable[Any]]
    _call: Callable[..., Awaitable[Any]]
    _io: Callable[..., Awaitable[Any]]
    _where: str
    _prefix: str
    _p: bytes
    _instance: str

    capabilities = LEASE_CAPABILITIES
    _max_ttl_reason = (
        "after it may have lost leases (a restart, FLUSHALL, eviction, failover) the Redis "
        "backend refuses new grants for max_ttl_ms, the longest a lost lease can be in use, "
        "so its default ceiling is 60 s where the other backends allow 2**31 - 1 ms"
    )

    def _setup_leases(self, *, quarantine_ms: int, min_replicas: int, replica_wait_ms: int) -> None:
        self._channel = self._p + _RELEASED_CHANNEL
        self._quarantine_ms = quarantine_ms
        self._min_replicas = min_replicas
        self._replica_wait_ms = replica_wait_ms
        self._marker = self._p + _MARKER
        # Where epoch.lua remembers when a flush was first seen: one record for
        # the whole server (database 0), whatever the prefix and database, so
        # a flush quarantines new prefixes only while a lease it may have
        # erased can still be live. On a cluster, one per slot.
        self._db = b"" if self._conn.cluster else b"%d" % self._conn.db
        self._cluster = b"1" if self._conn.cluster else b"0"
        if min_replicas and self._conn.pipe is None:
            raise ConfigurationError(
                "min_replicas needs the pipelined lease connection (WAIT counts the writes of "
                "the connection it is sent on): not with a Redis Cluster or a RESP3 client"
            )
        if quarantine_ms and self._conn.pipe is not None:
            # A new connection may reach another server (a failover, a restart):
            # look at its marker before the first command.
            self._conn.pipe.on_connect = self._check_epoch_on
        # Epoch markers this client has seen on the server (a grant or a refusal
        # went through them): if one goes missing, state was lost (epoch.lua).
        self._seen_markers: set[bytes] = set()
        # Local (event-loop clock) end of the last quarantine we were told about.
        self._quarantine_deadline = 0.0
        self._pubsub: Any = None
        self._listener: asyncio.Task[None] | None = None
        # A cluster node's slots being put in quarantine together (_quarantine_node).
        self._node_sweep: asyncio.Task[None] | None = None
        self._listen_lock = asyncio.Lock()

    def _lease_key(self, key: str) -> tuple[bytes, bytes]:
        base = self._p + b"{" + _tag(key) + b"}:"
        return base + b"lease", base + b"token"

    def _marker_of(self, lease: bytes) -> bytes:
        """The epoch marker for ``lease``: one per prefix; on a cluster, one per
        prefix and key slot (a script touches one slot)."""
        if self._conn.cluster:
            return self._p + b"{" + slot_tag(lease) + b"}:" + _MARKER
        return self._marker

    def _flush_record_of(self, marker: bytes) -> bytes:
        """The server-wide flush record (see ``epoch.lua``); on a cluster, the one
        in ``marker``'s slot."""
        if self._conn.cluster:
            return _FLUSH_RECORD + b":{" + marker.partition(b"{")[2].partition(b"}")[0] + b"}"
        return _FLUSH_RECORD

    # -- the five methods ----------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        """Claim ``key``; during a quarantine ``AcquireResult(False, None,
        retry_after_ms=…, reason=RefusalReason.QUARANTINE)`` (see the class docstring)."""
        ttl = self._args(key, owner, ttl_ms)
        lease, counter = self._lease_key(key)
        args = (
            owner,
            ttl,
            self._quarantine_ms,
            max(_COUNTER_KEEP_MS, 2 * ttl),
            b"1" if self._conn.evicting else b"0",
            self._cluster,
        )
        keys = (lease, counter, self._marker_of(lease))
        reply = await self._eval(_ACQUIRE, keys, args)
        if reply[0] == 3:
            # No marker, or keys were evicted: decide, record, and ask again.
            left, reason = await self._check_epoch(keys[2])
            if left and reason and self._conn.cluster:
                self._start_node_quarantine(lease)
            reply = await self._eval(_ACQUIRE, keys, args)
        status = reply[0]
        if status in (1, 2):
            self._seen_markers.add(keys[2])
        if status == 1:
            if self._min_replicas:
                await self._replicated(key, "grant", owner)
            return AcquireResult(True, owner, int(reply[1]))
        if status == 0:
            return AcquireResult(False, reply[1].decode("utf-8"), None, reason=_HELD)
        if status == 3:  # evicting again at once: refuse one quarantine
            return AcquireResult(
                False, None, None, retry_after_ms=self._quarantine_ms, reason=_QUARANTINE
            )
        left = int(reply[1])
        self._note_quarantine(left, "")
        return AcquireResult(False, None, None, retry_after_ms=left, reason=_QUARANTINE)

    async def _replicated(self, key: str, what: str, release: str | None) -> None:
        """``WAIT`` until ``min_replicas`` replicas have this connection's writes.

        Too few within ``replica_wait_ms``: :class:`BackendUnavailable` (the
        outcome is unknown to the caller), after releasing ``release``'s lease
        (best effort) for a grant or transfer, which the caller then never
        sees. A renewal is not undone: the holder's renew deadline still
        counts from its last acknowledged (replicated) renewal.
        """
        acked = int(await self._call("WAIT", self._min_replicas, self._replica_wait_ms))
        if acked >= self._min_replicas:
            return
        undone = ""
        if release is not None:
            with contextlib.suppress(BackendUnavailable):
                await self.release_lease(key, release)
            undone = "; the lease was released"
        raise BackendUnavailable(
            f"Redis at {self._where}: the {what} of lease {key!r} reached {acked} of "
            f"min_replicas={self._min_replicas} replicas within {self._replica_wait_ms} ms "
            f"(a failover could lose it){undone}"
        )

    async def _check_epoch(self, marker: bytes | None = None) -> tuple[int, str]:
        """Run ``epoch.lua`` on ``marker`` (by default the prefix's; on a cluster,
        its first key slot's): has this server lost the prefix's lease state?

        Returns the quarantine left in ms (0: none) and its reason.
        """
        if marker is None:
            marker = self._marker_of(self._p + b"{}")
        reply = await self._eval(
            _EPOCH,
            (marker, self._flush_record_of(marker)),
            (
                self._quarantine_ms,
                b"1" if self._conn.durable else b"0",
                b"1" if marker in self._seen_markers else b"0",
                self._db,
            ),
        )
        left, reason = int(reply[0]), reply[1].decode("utf-8")
        self._note_quarantine(left, reason)
        return left, reason

    def _start_node_quarantine(self, lease: bytes) -> None:
        """Run :meth:`_quarantine_node` in the background (one at a time): it
        writes thousands of markers, which must not hold up the refusal."""
        if self._node_sweep is None or self._node_sweep.done():
            self._node_sweep = asyncio.get_running_loop().create_task(
                self._quarantine_node(lease), name=f"tenure-redis-quarantine-{self._instance}"
            )

    async def _quarantine_node(self, lease: bytes) -> None:
        """On a cluster, after ``lease``'s slot was found to have lost state: run
        the epoch check on the prefix's marker of every other slot of the same
        primary, all written at once (best effort).

        Markers are per slot, so each slot of a promoted (or restarted, or
        flushed) node would otherwise start its own quarantine at its own first
        grant, one ``max_ttl_ms`` after another. The loss happened before now
        for every slot of the node alike, so one quarantine from now covers
        them all: later first grants in those slots find it over.
        """
        try:
            # A failover moved many slots: learn them (a MOVED reply updates one).
            with self._conn.driver_errors:
                await self._client.nodes_manager.initialize()
            slots = self._client.nodes_manager.slots_cache
            owner = slots.get(key_slot(lease))
            if not owner:
                return
            tags = _slot_tags()
            markers = [
                self._p + b"{" + tags[slot] + b"}:" + _MARKER
                for slot, nodes in slots.items()
                if nodes and nodes[0].name == owner[0].name and slot != key_slot(lease)
            ]
            # One key each (no flush record): a flush counts as seen now, as the
            # loss that started this sweep did.
            await self._conn.eval_per_key(
                _EPOCH,
                markers,
                (self._quarantine_ms, b"1" if self._conn.durable else b"0", b"0", b""),
            )
        except Exception as exc:  # best effort: each slot still checks at its first grant
            logger.info("quarantining every slot of a Redis Cluster node failed: %r", exc)

    async def _check_epoch_on(self, conn: Any) -> None:
        """``epoch.lua`` on a new lease connection (``Pipe.on_connect``)."""
        durable = b"1" if self._conn.durable else b"0"
        seen = b"1" if self._marker in self._seen_markers else b"0"
        await conn.send_command(
            "EVAL",
            _EPOCH.body,
            2,
            self._marker,
            _FLUSH_RECORD,
            self._quarantine_ms,
            durable,
            seen,
            self._db,
        )
        try:
            reply = await conn.read_response()
        except ResponseError:
            return  # a replica (READONLY): every grant fails there anyway, and says why
        self._note_quarantine(int(reply[0]), reply[1].decode("utf-8"))

    def _note_quarantine(self, left_ms: int, reason: str) -> None:
        """Remember (and log, once per quarantine) that grants are refused for ``left_ms``."""
        if left_ms <= 0:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._quarantine_deadline or reason:
            logger.warning(
                "Redis at %s refuses new leases of prefix %r for %.1f s: it may have lost "
                "leases granted before (%s); a lease granted then can be in use until it "
                "expires (max_ttl_ms=%d)",
                self._where,
                self._prefix,
                left_ms / 1000,
                reason or "a quarantine recorded on the server",
                self._quarantine_ms,
            )
        self._quarantine_deadline = loop.time() + left_ms / 1000

    async def _read(self, key: str) -> LeaseRecord | None:
        reply = await self._eval(_GET, (self._lease_key(key)[0],), ())
        if not reply:
            return None
        token, owner = _split_value(reply[0])
        return LeaseRecord(owner, token, max(1, int(reply[1])))

    async def release_lease(self, key: str, owner: str) -> None:
        self._args_owner(key, owner)
        await self._eval(
            _RELEASE, (self._lease_key(key)[0],), (owner, self._channel, key.encode("utf-8"))
        )

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        ttl = self._args(key, owner, ttl_ms)
        renewed = bool(await self._eval(_RENEW, (self._lease_key(key)[0],), (owner, ttl)))
        if renewed and self._min_replicas:
            await self._replicated(key, "renewal", None)
        return renewed

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        ttl = self._args_transfer(key, from_owner, to_owner, ttl_ms)
        lease, counter = self._lease_key(key)
        reply = await self._eval(
            _TRANSFER,
            (lease, counter),
            (
                from_owner,
                to_owner,
                ttl,
                max(_COUNTER_KEEP_MS, 2 * ttl),
                self._channel,
                key.encode("utf-8"),
            ),
        )
        if reply is not None and self._min_replicas:
            await self._replicated(key, "transfer", to_owner)
        return reply is not None

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many of ``owner``'s leases in one round trip; one ``bool`` per key, in order.

        The keys live in different hash slots, so this is one renew script
        per key, all written at once on the pipelined lease connection (not a
        transaction): each renewal is atomic on its own. If the server's
        script cache was flushed, the renewals that got ``NOSCRIPT`` (and
        therefore did not run) are re-sent as ``EVAL``.
        """
        key_list, ttl = self._args_batch(keys, owner, ttl_ms)
        if not key_list:
            return []
        leases = [self._lease_key(key)[0] for key in key_list]
        replies = await self._conn.eval_per_key(_RENEW, leases, (owner.encode("utf-8"), ttl))
        renewed = [bool(r) for r in replies]
        if self._min_replicas and any(renewed):
            await self._replicated(key_list[0], "batch renewal", None)
        return renewed

    async def diagnose(self) -> list[Finding]:
        """What ``tenure doctor`` reports about this server (:mod:`tenure._doctor`)."""
        from ._doctor import diagnose

        return await diagnose(self)

    # -- operations ----------------------------------------------------------------------

    async def _scan(self, prefix: str) -> AsyncGenerator[list[tuple[str, LeaseRecord]], None]:
        """``SCAN`` over this prefix's lease keys (never ``KEYS``), each page's
        records read with one ``get`` script per key, all written at once.

        SCAN may return a key twice (while the server resizes its table); the
        keys already listed are remembered, so none is listed twice.
        """
        head = self._p + b"{"
        pattern = _glob_literal(head + _tag(prefix)) + b"*" + _LEASE_SUFFIX
        seen: set[bytes] = set()
        for target in await self._conn.scan_targets():
            async for page in self._scan_node(head, pattern, seen, target):
                yield page

    async def _scan_node(
        self, head: bytes, pattern: bytes, seen: set[bytes], target: dict[str, Any]
    ) -> AsyncGenerator[list[tuple[str, LeaseRecord]], None]:
        """``_scan`` on one server (a cluster's primary, by ``target``)."""
        execute = self._client.execute_command
        cursor: bytes | int = 0
        while True:
            reply = await self._io(
                execute, "SCAN", cursor, "MATCH", pattern, "COUNT", PAGE, **target
            )
            cursor, found = reply
            if isinstance(cursor, dict):  # a cluster's answer: the cursor by node
                (cursor,) = cursor.values()
            leases = []
            for name in found:
                tag = name[len(head) : -len(_LEASE_SUFFIX)]
                if b"{" in tag or b"}" in tag or name in seen:
                    continue  # not a lease key of this backend, or listed already
                seen.add(name)
                leases.append((_untag(tag), name))
            if leases:
                replies = await self._conn.eval_per_key(_GET, [n for _, n in leases], ())
                page = []
                for (key, _), reply in zip(leases, replies, strict=True):
                    if reply:
                        token, owner = _split_value(reply[0])
                        page.append((key, LeaseRecord(owner, token, max(1, int(reply[1])))))
                yield page
            if int(cursor) == 0:
                return

    async def _revoke(self, key: str, token: int | None) -> bool:
        expected = b"" if token is None else str(token).encode()
        reply = await self._eval(
            _REVOKE,
            (self._lease_key(key)[0],),
            (expected, self._channel, key.encode("utf-8")),
        )
        return bool(reply)

    # -- waiting -----------------------------------------------------------------------

    async def _watch(self, key: str, timeout: float) -> None:
        await self._ensure_listener()

    async def _when_free(self, timeout: float) -> bool:
        # A free key is not grantable during a quarantine: wait for its end
        # rather than send a caller that retries acquire_lease into a hot loop.
        left = self._quarantine_deadline - asyncio.get_running_loop().time()
        if left > 0:
            await asyncio.sleep(min(left, timeout))
            return left <= timeout
        return True

    async def _ensure_listener(self) -> None:
        if self._listener is not None and not self._listener.done():
            return
        async with self._listen_lock:
            if self._listener is not None and not self._listener.done():
                return
            if not self._conn.ready:
                await self._conn.prepare()
            pubsub = self._conn.pubsub()
            loop = asyncio.get_running_loop()
            try:
                with self._conn.driver_errors:
                    await pubsub.subscribe(self._channel)
                    # Wait for the confirmation: a release before it would be missed.
                    deadline = loop.time() + 10.0
                    while True:
                        msg = await pubsub.get_message(timeout=1.0)
                        if msg is not None and msg["type"] == "subscribe":
                            break
                        if loop.time() > deadline:
                            raise TimeoutError("no confirmation of SUBSCRIBE")
            except BaseException:
                await self._close_pubsub(pubsub)
                raise
            self._pubsub = pubsub
            self._listener = loop.create_task(
                self._listen(pubsub), name=f"tenure-redis-listener-{self._instance}"
            )

    async def _listen(self, pubsub: Any) -> None:
        loop = asyncio.get_running_loop()
        last_ping = loop.time()
        try:
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is not None and msg["type"] == "message":
                    self._waiters.wake_one(msg["data"].decode("utf-8"))
                elif msg is None and loop.time() - last_ping > 5.0:
                    # Detects a dead or paused server while no message flows.
                    last_ping = loop.time()
                    await pubsub.ping()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning(
                "lease notification connection to Redis at %s lost (%s); waking every waiter",
                self._where,
                type(exc).__name__,
            )
        finally:
            self._waiters.wake_all()
            if self._pubsub is pubsub:
                self._pubsub = None
            await self._close_pubsub(pubsub)

    def _cancel_node_sweep(self) -> asyncio.Task[None] | None:
        """Stop a node quarantine under way (closing): the task to await, if any."""
        sweep, self._node_sweep = self._node_sweep, None
        if sweep is not None:
            sweep.cancel()
        return sweep

    def _cancel_listener(self) -> asyncio.Task[None] | None:
        """Stop listening (closing): the task to await, if there was one."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
        return listener

    @staticmethod
    async def _close_pubsub(pubsub: Any) -> None:
        with contextlib.suppress(Exception):
            await pubsub.aclose()
