"""What ``tenure doctor`` checks on a Redis server (see :mod:`tenure._doctor`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..._doctor import Finding, clock_finding, ok, parse_info, unsafe, warn
from ..._errors import BackendUnavailable

__all__ = ["diagnose"]


async def diagnose(
    call: Callable[..., Awaitable[Any]],
    quarantine_ms: int,
    check_epoch: Callable[[], Awaitable[tuple[int, str]]],
) -> list[Finding]:
    """The findings for the server that ``call`` sends commands to.

    ``quarantine_ms``: the backend's (0 when off); ``check_epoch``: what the
    next grant would find (the check records its answer, as a grant does).
    """
    info = parse_info(await call("INFO", "all"))  # first: the connection is up
    sent = time.time()
    seconds, micros = await call("TIME")
    got = time.time()
    try:
        reply = await call("CONFIG", "GET", "appendfsync")
        # redis-py may have parsed the pairs into a dict already.
        pairs = (
            list(reply.items())
            if isinstance(reply, dict)
            else list(zip(reply[::2], reply[1::2], strict=True))
        )
        fsync: str | None = pairs[0][1].decode() if pairs else None
    except BackendUnavailable:  # CONFIG renamed or not allowed (managed Redis)
        fsync = None
    try:
        left_ms, reason = await check_epoch() if quarantine_ms else (0, "")
    except BackendUnavailable as exc:  # a replica refuses the write
        left_ms, reason = -1, str(exc)
    return [
        _eviction(info),
        _persistence(info, fsync, quarantine_ms),
        _quarantine(quarantine_ms, left_ms, reason),
        _replication(info),
        _clock(int(seconds) + int(micros) / 1e6 - (sent + got) / 2),
    ]


def _eviction(info: dict[str, str]) -> Finding:
    policy = info.get("maxmemory_policy", "unknown")
    if policy == "noeviction":
        return ok("eviction", "maxmemory-policy noeviction")
    if info.get("maxmemory", "0") == "0":
        return warn(
            "eviction",
            f"maxmemory-policy {policy}, but no maxmemory: nothing is evicted until one is set",
            "CONFIG SET maxmemory-policy noeviction",
        )
    return unsafe(
        "eviction",
        f"maxmemory-policy {policy} can evict live leases (they carry a TTL) and stream entries",
        "CONFIG SET maxmemory-policy noeviction (and in redis.conf)",
    )


def _persistence(info: dict[str, str], fsync: str | None, quarantine_ms: int) -> Finding:
    if info.get("aof_enabled") == "1":
        if fsync == "always":
            return ok("persistence", "appendonly yes, appendfsync always")
        if fsync is None:
            return warn("persistence", "appendonly yes; appendfsync unknown (CONFIG not allowed)")
        return warn(
            "persistence",
            f"appendonly yes, appendfsync {fsync}: a crash can lose the last grants while "
            "keeping older ones, which the quarantine cannot detect",
            "appendfsync always",
        )
    if quarantine_ms:
        return warn(
            "persistence",
            "no AOF: a restart forgets every lease; the quarantine then refuses grants of "
            f"unknown keys for {quarantine_ms / 1000:g} s",
            "appendonly yes, appendfsync always",
        )
    return unsafe(
        "persistence",
        "no AOF and the quarantine is off: after a restart a key can have two owners",
        "appendonly yes, appendfsync always; or drop quarantine=off",
    )


def _quarantine(quarantine_ms: int, left_ms: int, reason: str) -> Finding:
    if not quarantine_ms:
        return warn(
            "quarantine",
            "off (quarantine=off): grants after a restart, FLUSHALL, eviction or failover can "
            "give a key two owners",
            "drop quarantine=off from the URL",
        )
    if left_ms < 0:
        return warn("quarantine", f"cannot be checked: {reason}")
    if left_ms > 0:
        return warn(
            "quarantine",
            f"active: the server may have lost leases ({reason or 'recorded earlier'}); "
            f"new grants resume in about {left_ms / 1000:.0f} s",
        )
    return ok("quarantine", "none: no sign that the server lost lease state")


def _replication(info: dict[str, str]) -> Finding:
    role = info.get("role", "unknown")
    if role == "slave":
        return unsafe(
            "replication",
            "this server is a replica: it refuses the lease scripts' writes",
            "point tenure at the primary",
        )
    replicas = int(info.get("connected_slaves", "0"))
    if replicas:
        return warn(
            "replication",
            f"a primary with {replicas} replica(s), replicated asynchronously: a failover can "
            "lose the latest grants (a key can then have two owners for up to one TTL)",
            "pass the fencing token to what you write",
        )
    return ok("replication", "a primary without replicas")


def _clock(skew_s: float) -> Finding:
    return clock_finding(
        skew_s, why=" (leases run on the server's clock; fencing tokens come from it)"
    )
