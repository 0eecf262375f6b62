"""Negative controls: backends broken the way real bugs break them.

Each mutant WRAPS a real backend built by :func:`tenure.from_url` and breaks one
lease rule using only the backend's public methods (the five lease methods and
``get_lease``, which every backend here declares with ``Capability.RECORD``).
So one mutant serves every backend, and none depends on how a backend is
built inside. They live here, outside the library, and are reachable only
through :func:`open_backend` with an explicit mutant name (the runner's
``--mutant`` switch): nothing in ``tenure`` can construct one.

What the wrappers can break is what a client-side bug can break: a check left
out, or a read and a write that should be one atomic step done as two. That is
exactly the class of bug each control stands for (a ``DEL`` without the owner
check, a read-then-write acquire, a token computed apart from the grant).

A mutant whose bug is a race (read-then-write, a token issued outside the grant)
yields to the event loop for a few milliseconds inside the race window. Real
code has such a window too (a network round trip, a GC pause); widening it lets a
one-minute run hit it instead of a day-long one; and 5% of the time the gap is a
stall of 1-2 TTLs (the GC pause or slow round trip that makes such bugs bite).

``no-fencing`` is not a backend mutant: the runner turns off the fenced store's
token check (P4 must then fail under client pauses).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Self

import tenure
from tenure import AcquireResult, LeaseRecord
from tenure._contract import Backend, Capability

__all__ = ["BACKEND_MUTANTS", "MUTANTS", "Mutant", "mutants_for", "open_backend"]

RACE_S = 0.004
STALL_P = 0.05
_rnd = random.Random()


async def _race_window(ttl_ms: int) -> None:
    """The gap inside the buggy step: usually a few ms, now and then a stall of 1-2 TTLs."""
    if _rnd.random() < STALL_P:
        await asyncio.sleep(_rnd.uniform(1.0, 2.0) * ttl_ms / 1000)
    else:
        await asyncio.sleep(RACE_S)


MUTANTS = (
    "release-plain-delete",
    "renew-no-owner-check",
    "acquire-read-then-write",
    "token-outside-atomic",
    "no-fencing",
)
BACKEND_MUTANTS = MUTANTS[:4]


def mutants_for(kind: str) -> tuple[str, ...]:
    """The controls that apply to backend ``kind`` (all of them, for every backend)."""
    del kind
    return MUTANTS


class Mutant:
    """A backend that delegates every call to ``inner``: the base of the controls.

    Unchanged, it is a faithful backend; each subclass overrides one lease
    method with a bug. It declares only what it implements faithfully on top of
    ``inner`` (``renew_leases`` is a loop over :meth:`renew_lease`, so a broken
    renew is broken there too).
    """

    name = ""
    capabilities = Capability.RECORD

    def __init__(self, inner: Backend) -> None:
        if Capability.RECORD not in inner.capabilities:
            raise ValueError(f"the controls need get_lease (Capability.RECORD): {inner!r}")
        self.inner = inner

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        return await self.inner.acquire_lease(key, owner, ttl_ms)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def release_lease(self, key: str, owner: str) -> None:
        await self.inner.release_lease(key, owner)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self.inner.get_lease_owner(key)

    async def get_lease(self, key: str) -> LeaseRecord | None:
        return await self.inner.get_lease(key)

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        return [await self.renew_lease(key, owner, ttl_ms) for key in keys]

    async def renew_owned(self, leases: Sequence[tuple[str, str]], ttl_ms: int) -> list[bool]:
        return [await self.renew_lease(key, owner, ttl_ms) for key, owner in leases]

    async def wait_lease_released(self, key: str, timeout: float) -> bool:
        return await self.inner.wait_lease_released(key, timeout)

    def scan_leases(
        self, prefix: str = "", limit: int | None = None
    ) -> AsyncIterator[tuple[str, LeaseRecord]]:
        return self.inner.scan_leases(prefix, limit)

    async def revoke_lease(self, key: str, token: int | None = None) -> bool:
        return await self.inner.revoke_lease(key, token)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class ReleasePlainDelete(Mutant):
    """Release frees the key whoever holds it (a plain ``DEL`` / ``DELETE``)."""

    name = "release-plain-delete"

    async def release_lease(self, key: str, owner: str) -> None:
        holder = await self.inner.get_lease_owner(key)
        if holder is not None:
            # BUG: no ownership check: a stale owner frees its successor's lease.
            await self.inner.release_lease(key, holder)


class RenewNoOwnerCheck(Mutant):
    """Renew extends whoever holds the lease and says yes (``PEXPIRE`` without the check)."""

    name = "renew-no-owner-check"

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        holder = await self.inner.get_lease_owner(key)
        if holder is None:
            return False
        # BUG: extends the holder's lease and tells ``owner`` it still holds it.
        return await self.inner.renew_lease(key, holder, ttl_ms)


class AcquireReadThenWrite(Mutant):
    """Acquire reads the holder, then writes in a separate step (``GET`` then ``SET``)."""

    name = "acquire-read-then-write"

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        holder = await self.inner.get_lease_owner(key)
        if holder is not None and holder != owner:
            return AcquireResult(False, holder, None)
        await _race_window(ttl_ms)
        # BUG: the write trusts the earlier read: whoever took the key since is
        # overwritten (released as themselves, then the key is granted to us).
        result = AcquireResult(False, None, None)
        for _ in range(3):
            now = await self.inner.get_lease_owner(key)
            if now is not None and now != owner:
                await self.inner.release_lease(key, now)
            result = await self.inner.acquire_lease(key, owner, ttl_ms)
            if result.acquired:
                break
        return result


class TokenOutsideAtomic(Mutant):
    """The fencing token is computed in a step of its own, before the grant.

    It is the last token read (the key's record, or the highest this process
    has seen on the key) plus one, as a counter read apart from the grant
    would give: stale when another process granted the key meanwhile.
    """

    name = "token-outside-atomic"

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self._seen: dict[str, int] = {}

    def _saw(self, key: str, token: int | None) -> None:
        if token is not None and token > self._seen.get(key, 0):
            self._seen[key] = token

    async def get_lease(self, key: str) -> LeaseRecord | None:
        record = await self.inner.get_lease(key)
        self._saw(key, None if record is None else record.token)
        return record

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        record = await self.get_lease(key)
        if record is not None and record.owner == owner:
            return await self.inner.acquire_lease(key, owner, ttl_ms)
        token = self._seen.get(key, 0) + 1  # BUG: taken before, apart from the grant
        await _race_window(ttl_ms)
        result = await self.inner.acquire_lease(key, owner, ttl_ms)
        self._saw(key, result.token)
        if not result.acquired:
            return result
        return AcquireResult(True, owner, token)


_BY_NAME: dict[str, type[Mutant]] = {
    m.name: m
    for m in (ReleasePlainDelete, RenewNoOwnerCheck, AcquireReadThenWrite, TokenOutsideAtomic)
}
assert tuple(_BY_NAME) == BACKEND_MUTANTS


def open_backend(url: str, mutant: str | None = None) -> Backend:
    """The backend for ``url``, or its ``mutant`` (a negative control) when named."""
    if mutant is not None and mutant != "no-fencing" and mutant not in _BY_NAME:
        raise ValueError(f"unknown mutant {mutant!r}; known: {', '.join(MUTANTS)}")
    backend = tenure.from_url(url)
    if mutant is None or mutant == "no-fencing":
        return backend
    return _BY_NAME[mutant](backend)
