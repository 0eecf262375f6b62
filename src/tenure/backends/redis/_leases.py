"""The lease half of the Redis backend: one Lua script per operation.

The Python side only checks arguments, names the keys, runs the script and
reads its reply; every decision is made by the script, atomically, on the
server's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from ..._contract import AcquireResult, LeaseRecord, RefusalReason
from ..._doctor import Finding
from ..._errors import BackendUnavailable, ConfigurationError
from .._core import LEASE_CAPABILITIES, PAGE, LeaseCore
from ._connection import RedisFields
from ._keys import _tag
from ._quarantine import Quarantine
from ._scripts import load_script
from ._wakeups import ReleaseListener

__all__ = ["RedisLeases"]

logger = logging.getLogger("tenure.redis")

# An idle key's fencing counter is kept this long (``retention_ms`` when set; twice
# its lease's TTL if longer). Its loss is harmless: tokens are at least the
# server's time in µs, so a recreated counter starts above every token granted.
_COUNTER_KEEP_MS = 24 * 3600 * 1000
_RELEASED_CHANNEL = b"lease-released"

_ACQUIRE = load_script("acquire")
_RENEW = load_script("renew")
_RENEW_MANY = load_script("renew_many")
# Leases per renew_many script: the server runs nothing else meanwhile.
_RENEW_CHUNK = 500
_RELEASE = load_script("release")
_TRANSFER = load_script("transfer")
_GET = load_script("get")
_REVOKE = load_script("revoke")
_HELD = RefusalReason.HELD
_QUARANTINE = RefusalReason.QUARANTINE
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


class RedisLeases(RedisFields, LeaseCore):
    """Leases as Lua scripts, and release wake-ups over Redis pub/sub.

    A lease key holds ``"<token>:<owner>"`` with the lease's ``PX``; next to
    it (same hash slot) a counter key holds the key's last fencing token.
    ``release_lease`` and ``transfer_lease`` publish the key on
    ``<prefix>lease-released`` (in the same script); waiters listen on one
    pub/sub connection per backend. The guarantees are in the
    :class:`~tenure.backends.redis.RedisStreamsPubSub` docstring.
    """

    capabilities = LEASE_CAPABILITIES
    _max_ttl_reason = (
        "after it may have lost leases (a restart, FLUSHALL, eviction, failover) the Redis "
        "backend refuses new grants for max_ttl_ms, the longest a lost lease can be in use, "
        "so its default ceiling is 60 s where the other backends allow 2**31 - 1 ms"
    )

    def _setup_leases(
        self, *, quarantine_ms: int, min_replicas: int, replica_wait_ms: int, retention_ms: int = 0
    ) -> None:
        self._counter_keep_ms = retention_ms or _COUNTER_KEEP_MS
        self._channel = self._p + _RELEASED_CHANNEL
        self._min_replicas = min_replicas
        self._replica_wait_ms = replica_wait_ms
        self._cluster = b"1" if self._conn.cluster else b"0"
        if min_replicas and self._conn.pipe is None:
            raise ConfigurationError(
                "min_replicas needs the pipelined lease connection (WAIT counts the writes of "
                "the connection it is sent on): not with a Redis Cluster or a RESP3 client"
            )
        self._quarantine = Quarantine(
            self._conn, self._prefix, quarantine_ms=quarantine_ms, instance=self._instance
        )
        self._release_listener = ReleaseListener(
            self._conn, self._channel, self._waiters, instance=self._instance
        )

    def _lease_key(self, key: str) -> tuple[bytes, bytes]:
        base = self._p + b"{" + _tag(key) + b"}:"
        return base + b"lease", base + b"token"

    # -- the five methods ----------------------------------------------------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        """Claim ``key``; during a quarantine ``AcquireResult(False, None,
        retry_after_ms=…, reason=RefusalReason.QUARANTINE)`` (see the class docstring)."""
        ttl = self._args(key, owner, ttl_ms)
        lease, counter = self._lease_key(key)
        args = (
            owner,
            ttl,
            self._quarantine.ms,
            max(self._counter_keep_ms, 2 * ttl),
            b"1" if self._conn.evicting else b"0",
            self._cluster,
        )
        keys = (lease, counter, self._quarantine.marker_of(lease))
        reply = await self._eval(_ACQUIRE, keys, args)
        if reply[0] == 3:
            # No marker, or keys were evicted: decide, record, and ask again.
            left, reason = await self._quarantine.check(keys[2])
            if left and reason and self._conn.cluster:
                self._quarantine.start_node_quarantine(lease)
            reply = await self._eval(_ACQUIRE, keys, args)
        status = reply[0]
        if status in (1, 2):
            self._quarantine.seen_markers.add(keys[2])
        if status == 1:
            if self._min_replicas:
                await self._replicated(key, "grant", owner)
            return AcquireResult(True, owner, int(reply[1]))
        if status == 0:
            return AcquireResult(False, reply[1].decode("utf-8"), None, reason=_HELD)
        if status == 3:  # evicting again at once: refuse one quarantine
            return AcquireResult(
                False, None, None, retry_after_ms=self._quarantine.ms, reason=_QUARANTINE
            )
        left = int(reply[1])
        self._quarantine.note(left, "")
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
                max(self._counter_keep_ms, 2 * ttl),
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

    async def _renew_owned(self, pairs: list[tuple[str, str]], ttl_ms: int) -> list[bool]:
        """Every pair's renewal in one round trip: on a single server, one script
        (``lua/renew_many.lua``) per ``_RENEW_CHUNK`` leases; on a cluster, whose
        keys live in different slots, one renew script per lease, all written at once.
        Each renewal is atomic on its own, decided as ``renew_lease`` decides it.
        """
        leases = [self._lease_key(key)[0] for key, _ in pairs]
        if self._conn.cluster:
            args = [(owner.encode("utf-8"), ttl_ms) for _, owner in pairs]
            replies = await self._conn.eval_each(_RENEW, leases, args)
        else:
            chunks = [
                self._eval(
                    _RENEW_MANY,
                    leases[start : start + _RENEW_CHUNK],
                    (ttl_ms, *(o.encode("utf-8") for _, o in pairs[start : start + _RENEW_CHUNK])),
                )
                for start in range(0, len(pairs), _RENEW_CHUNK)
            ]
            replies = [r for chunk in await asyncio.gather(*chunks) for r in chunk]
        renewed = [bool(r) for r in replies]
        if self._min_replicas and any(renewed):
            await self._replicated(pairs[0][0], "batch renewal", None)
        return renewed

    async def diagnose(self) -> list[Finding]:
        """What ``tenure doctor`` reports about this server (:mod:`tenure._doctor`)."""
        from ._doctor import diagnose

        return await diagnose(self._call, self._quarantine.ms, self._quarantine.check)

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
        await self._release_listener.ensure()

    async def _when_free(self, timeout: float) -> bool:
        # A free key is not grantable during a quarantine: wait for its end
        # rather than send a caller that retries acquire_lease into a hot loop.
        return await self._quarantine.when_free(timeout)
