"""What every lease backend of tenure shares, written once.

- :class:`LeaseCore`: argument checks (the contract's rules plus the backend's
  TTL ceiling) and the closed check in one call per operation, ``get_lease_owner``
  in terms of one record read, and the waiter steps of ``wait_lease_released``.
  A backend supplies ``_read`` (one atomic read of a live lease) and, if it can
  learn of releases made elsewhere, the ``_watch``/``_unwatch`` hooks.
- The lease decisions that run in Python (memory, SQLite): :func:`acquire_step`
  and :func:`holds`. What must be atomic on a server stays there, in Lua or SQL
  files, one per operation.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, ClassVar, cast

from .. import telemetry
from .._contract import Capability, LeaseProvider, LeaseRecord
from .._errors import BackendClosed, InvalidArgument
from .._lifecycle import AsyncCloseable
from .._validate import (
    KNOWN_NAMES,
    MAX_TTL_MS,
    check_count,
    check_keys,
    check_name,
    check_owned,
    check_prefix,
    check_timeout,
    check_ttl,
    remember_names,
)
from .._waiters import KeyWaiters

__all__ = [
    "EXTEND",
    "GRANT",
    "LEASE_CAPABILITIES",
    "PAGE",
    "REFUSE",
    "LeaseCore",
    "acquire_step",
    "holds",
    "prefix_range",
]

#: What each of tenure's own lease backends declares for its leases: every lease
#: extension, and the operator methods.
LEASE_CAPABILITIES = Capability.LEASES | Capability.OPERATIONS | Capability.RENEW_OWNED
#: How many leases a scan reads at a time.
PAGE = 500
# Above every stored key: keys are UTF-8 (never a 0xFF byte) of at most 1024 bytes.
_AFTER_EVERY_KEY = b"\xff" * 1025


def prefix_range(prefix: bytes) -> tuple[bytes, bytes]:
    """``[low, high)``: the UTF-8 keys that start with ``prefix``, for a range scan."""
    if not prefix:
        return b"", _AFTER_EVERY_KEY
    return prefix, prefix[:-1] + bytes([prefix[-1] + 1])


# What an acquire does to the key's current lease (see acquire_step).
REFUSE, EXTEND, GRANT = 0, 1, 2


def acquire_step(holder: object, deadline: float, owner: object, now: float) -> int:
    """The acquire decision: ``REFUSE`` (another live owner), ``EXTEND`` (the same
    owner: fresh TTL, same token) or ``GRANT`` (free or expired: a new token).

    ``holder`` is ``None`` when the key has no lease row.
    """
    if holder is not None and deadline > now:
        return EXTEND if holder == owner else REFUSE
    return GRANT


def holds(holder: object, deadline: float, owner: object, now: float) -> bool:
    """Whether ``owner`` holds a live lease: the check of renew, release and transfer."""
    return holder == owner and deadline > now


class LeaseCore(AsyncCloseable, abc.ABC):
    """Base of tenure's lease backends: checks, the closed state and waiting.

    Subclasses set ``capabilities`` and implement the five methods, calling
    the ``_args_*`` check first; ``_read`` gives ``get_lease``,
    ``get_lease_owner`` and ``wait_lease_released``. A release or transfer the
    backend performs itself calls :meth:`_freed` to wake one local waiter.
    """

    capabilities: ClassVar[Capability] = Capability.NONE

    # Not in __init__: the hot paths read them, and subclasses set them first.
    _closed: bool = False
    _max_ttl_ms: int = MAX_TTL_MS
    #: Why this backend's ``max_ttl_ms`` is below the contract's 2**31 - 1 (for the error).
    _max_ttl_reason: str = ""
    _waiters: KeyWaiters
    # The process this backend was made in, once it crossed fork() (see _after_fork).
    _forked_from: int | None = None

    def __init__(self, *, max_ttl_ms: int = MAX_TTL_MS) -> None:
        self._closed = False
        self._max_ttl_ms = max_ttl_ms
        self._waiters = KeyWaiters()
        _live.add(self)

    # -- checks --------------------------------------------------------------

    def _closed_error(self) -> BackendClosed:
        if self._forked_from is not None:
            return BackendClosed(
                f"this {type(self).__name__} comes from process {self._forked_from} and crossed "
                "fork(): it would share its connections, file and event loop with that process. "
                "Make the backend in the child (after the fork, e.g. in a worker's start hook), "
                "or use tenure.sync.from_url(), which re-initialises itself in a forked child"
            )
        return BackendClosed(f"{type(self).__name__} is closed")

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _check_ttl(self, ttl_ms: Any, arg: str = "ttl_ms") -> int:
        ttl = check_ttl(ttl_ms, arg)
        if ttl > self._max_ttl_ms:
            why = f": {self._max_ttl_reason}" if self._max_ttl_reason else ""
            raise InvalidArgument(
                f"{arg} must be at most max_ttl_ms={self._max_ttl_ms} on this backend, got {ttl}"
                f"{why} (raise max_ttl_ms for every client of the backend)"
            )
        return ttl

    def _args(self, key: Any, owner: Any, ttl_ms: Any = 1) -> int:
        """Checks of acquire and renew; returns the TTL."""
        # The common case decided inline, without a call: these run on every
        # operation. A key or owner seen before is a set lookup (KNOWN_NAMES).
        if not (
            type(key) is str
            and key in KNOWN_NAMES
            and type(owner) is str
            and owner in KNOWN_NAMES
            and type(ttl_ms) is int
            and 1 <= ttl_ms <= self._max_ttl_ms
        ):
            check_name(key, "key")
            check_name(owner, "owner")
            self._check_ttl(ttl_ms)
            remember_names(key, owner)
        if self._closed:
            raise self._closed_error()
        return ttl_ms  # type: ignore[no-any-return]  # an int, checked above

    #: Checks of release: acquire's, with the default TTL (1 ms) that every
    #: backend accepts. The same function, so a release pays one call.
    _args_owner = _args

    def _args_transfer(self, key: Any, from_owner: Any, to_owner: Any, ttl_ms: Any) -> int:
        check_name(key, "key")
        check_name(from_owner, "from_owner")
        check_name(to_owner, "to_owner")
        ttl = self._check_ttl(ttl_ms)
        self._check_open()
        return ttl

    def _args_key(self, key: Any) -> None:
        check_name(key, "key")
        self._check_open()

    def _args_batch(self, keys: Any, owner: Any, ttl_ms: Any) -> tuple[list[str], int]:
        key_list = check_keys(keys)
        check_name(owner, "owner")
        ttl = self._check_ttl(ttl_ms)
        self._check_open()
        return key_list, ttl

    def _args_owned(self, leases: Any, ttl_ms: Any) -> tuple[list[tuple[str, str]], int]:
        pairs = check_owned(leases)
        ttl = self._check_ttl(ttl_ms)
        self._check_open()
        return pairs, ttl

    async def renew_owned(self, leases: Sequence[tuple[str, str]], ttl_ms: int) -> list[bool]:
        """Renew each ``(key, owner)`` lease to a fresh ``ttl_ms``; one ``bool`` per pair, in order.

        Each renewal is decided on its own (``True`` only if that owner still
        held that key); a lost lease is never resurrected. If the backend
        fails, the outcome of each is unknown, as for ``renew_lease``.
        """
        pairs, ttl = self._args_owned(leases, ttl_ms)
        if not pairs:
            return []
        return await self._renew_owned(pairs, ttl)

    async def _renew_owned(self, pairs: list[tuple[str, str]], ttl_ms: int) -> list[bool]:
        """:meth:`renew_owned` with its arguments checked: concurrent ``renew_lease``
        calls, at most 64 at once (a backend that can do better in one step overrides it)."""
        renew = cast(LeaseProvider, self).renew_lease  # every backend's own
        results = [False] * len(pairs)
        indexes = iter(range(len(pairs)))

        async def worker() -> None:
            # Workers share one iterator, so at most 64 calls are in flight.
            for i in indexes:
                key, owner = pairs[i]
                results[i] = await renew(key, owner, ttl_ms)

        await asyncio.gather(*(worker() for _ in range(min(64, len(pairs)))))
        return results

    # -- reads ---------------------------------------------------------------

    @abc.abstractmethod
    async def _read(self, key: str) -> LeaseRecord | None:
        """The live lease of ``key`` in one atomic read (arguments already checked)."""

    async def get_lease(self, key: str) -> LeaseRecord | None:
        """The live lease of ``key`` (owner, token, remaining ms) in one atomic read, or ``None``."""
        self._args_key(key)
        return await self._read(key)

    async def get_lease_owner(self, key: str) -> str | None:
        self._args_key(key)
        record = await self._read(key)
        return None if record is None else record.owner

    # -- operations (Capability.OPERATIONS) ----------------------------------

    def scan_leases(
        self, prefix: str = "", limit: int | None = None
    ) -> AsyncIterator[tuple[str, LeaseRecord]]:
        """The live leases whose key starts with ``prefix``, as ``(key, record)`` pairs.

        Each record is read atomically; the scan as a whole is not a snapshot
        (a lease granted or ended while it runs may or may not be listed, and
        none is listed twice). Leases are read a page at a time, so any number
        can be listed in bounded memory; at most ``limit`` pairs. The order is
        the backend's: by key in SQLite and PostgreSQL, none in Redis.
        """
        checked = check_prefix(prefix)
        most = check_count(limit, "limit")
        self._check_open()
        return self._scan_pairs(checked, most)

    async def _scan_pairs(
        self, prefix: str, limit: int | None
    ) -> AsyncIterator[tuple[str, LeaseRecord]]:
        left = limit
        async with contextlib.aclosing(self._scan(prefix)) as pages:
            async for page in pages:
                for pair in page:
                    yield pair
                    if left is not None:
                        left -= 1
                        if left == 0:
                            return

    async def revoke_lease(self, key: str, token: int | None = None) -> bool:
        """Force-release ``key`` whoever holds it, in one atomic step.

        With ``token``, only if the lease still carries that token, so that an
        operator never revokes a newer holder by accident. Returns whether a
        live lease was revoked. The revoked owner's next renewal returns
        ``False``, the next grant's token is higher, and waiters are woken as
        by a release.
        """
        self._args_key(key)
        expected = check_count(token, "token")
        if not await self._revoke(key, expected):
            return False
        telemetry.count("tenure.lease.revocations")
        self._freed(key)
        return True

    def _scan(self, prefix: str) -> AsyncGenerator[list[tuple[str, LeaseRecord]], None]:
        """Pages of live leases under ``prefix`` (arguments already checked)."""
        raise NotImplementedError(f"{type(self).__name__} does not declare OPERATIONS")

    async def _revoke(self, key: str, token: int | None) -> bool:
        """Delete the live lease of ``key`` (if its token is ``token``); whether one was."""
        raise NotImplementedError(f"{type(self).__name__} does not declare OPERATIONS")

    # -- waiting -------------------------------------------------------------

    def _freed(self, key: str) -> None:
        """A release or transfer of ``key`` happened: wake its longest-waiting local waiter."""
        if self._waiters.queues:
            self._waiters.wake_one(key)

    async def _watch(self, key: str, timeout: float) -> None:
        """Start learning of releases of ``key`` made elsewhere (a listener, polling),
        for a wait of at most ``timeout`` seconds."""

    def _watching(self, key: str, record: LeaseRecord) -> None:
        """``key`` is waited on while ``record`` is its lease."""

    def _unwatch(self) -> None:
        """A waiter left (woken, timed out or failed)."""

    async def _when_free(self, timeout: float) -> bool:
        """What a waiter does when the key has no live lease: by default, nothing."""
        return True

    async def wait_lease_released(self, key: str, timeout: float) -> bool:
        """Wait until ``key`` is released or transferred, at most ``timeout`` seconds.

        ``True`` at once if the key has no live lease, or when a release or
        transfer wakes this waiter (one local waiter per release, the
        longest-waiting first); ``False`` on timeout. An expiry wakes nobody:
        pass a timeout no longer than the remaining TTL to retry after it.
        A ``True`` means "look again", not "the key is free": a backend that may
        have missed a release (a lost notification connection) wakes everyone.
        """
        self._args_key(key)
        seconds = check_timeout(timeout)
        fut = self._waiters.register(key)
        try:
            await self._watch(key, seconds)
            record = await self._read(key)
        except BaseException:
            self._waiters.discard(key, fut)
            self._unwatch()
            raise
        if record is None:
            self._waiters.discard(key, fut)
            self._unwatch()
            return await self._when_free(seconds)
        if not fut.done():
            self._watching(key, record)
        try:
            return await self._waiters.wait(key, fut, seconds)
        finally:
            self._unwatch()


# Every open backend of this process. A forked child inherits them with the
# parent's sockets, SQLite handle, event loop and threads; using them (or even
# closing them: a driver's goodbye, an epoll set shared with the parent) would
# disturb the parent. In the child they are closed without I/O, and calls raise
# BackendClosed naming the fix. Marking them costs the hot paths nothing: they
# check ``_closed`` already.
_live: weakref.WeakSet[LeaseCore] = weakref.WeakSet()


def _after_fork() -> None:
    parent = os.getppid()
    for backend in list(_live):
        if not backend._closed:
            backend._forked_from = parent
            backend._closed = True


os.register_at_fork(after_in_child=_after_fork)
