"""Provider wrappers for the hold tests: they delegate to a real backend.

``FiveMethodsOnly`` hides every optional extension, so the fallbacks run.
``Flaky`` makes ``renew_lease`` fail or hang on demand, standing in for a
network error at the unit level (the real-server version is in test_pause.py).
``LateRenewal`` makes one renewal's success arrive late (see its docstring).
``GatedRelease`` and ``GatedRenewal`` hold a call until the test opens a gate, so
a test decides when its reply comes back: no real fault returns a reply at a
chosen moment.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tenure import AcquireResult, BackendUnavailable, LeaseRecord


class FiveMethodsOnly:
    """The five contract methods of ``inner`` and nothing else; counts calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        self.calls["acquire_lease"] += 1
        result: AcquireResult = await self.inner.acquire_lease(key, owner, ttl_ms)
        return result

    async def get_lease_owner(self, key: str) -> str | None:
        self.calls["get_lease_owner"] += 1
        owner: str | None = await self.inner.get_lease_owner(key)
        return owner

    async def release_lease(self, key: str, owner: str) -> None:
        self.calls["release_lease"] += 1
        await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self.calls["renew_lease"] += 1
        ok: bool = await self.inner.renew_lease(key, owner, ttl_ms)
        return ok

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        self.calls["transfer_lease"] += 1
        ok: bool = await self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)
        return ok


class WithGetLease(FiveMethodsOnly):
    """Five methods plus ``get_lease`` (no wake-up, no batch renew).

    Declares it by name, as a backend that does not import tenure would.
    """

    capabilities = frozenset({"record"})

    async def get_lease(self, key: str) -> LeaseRecord | None:
        self.calls["get_lease"] += 1
        record: LeaseRecord | None = await self.inner.get_lease(key)
        return record


class Counting:
    """Every method of ``inner`` (extensions included), counting lease calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        async def counted(*args: Any) -> Any:
            self.calls[name] += 1
            return await attr(*args)

        return counted


class Flaky(FiveMethodsOnly):
    """``renew_lease`` raises ``BackendUnavailable`` while ``failing``, hangs while ``hanging``."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.failing = False
        self.hanging = False
        self.failures = 0
        self.hangs = 0

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        if self.failing:
            self.failures += 1
            raise BackendUnavailable("simulated network error") from OSError("connection reset")
        if self.hanging:
            self.hangs += 1
            await asyncio.Event().wait()
        return await super().renew_lease(key, owner, ttl_ms)


class LateRenewal(FiveMethodsOnly):
    """``renew_lease`` succeeds on the backend; then ``then()`` runs once before it returns.

    ``then`` stalls the process (``stall``) or moves an injected clock: the renewal
    succeeded, but its caller learns of it only later. No real fault lands there
    reliably: the reply would have to arrive and the process then stop (a GC pause,
    SIGSTOP) before the waiting call resumes, which on a real socket usually ends
    with the call abandoned at the deadline instead.
    """

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.then: Callable[[], None] | None = None
        self.late = 0

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        ok = await super().renew_lease(key, owner, ttl_ms)
        then, self.then = self.then, None
        if then is not None:
            self.late += 1
            then()
        return ok


def stall(seconds: float) -> None:
    """Block the whole event loop, as a paused process (GC, swap, SIGSTOP) would."""
    time.sleep(seconds)


class GatedRelease(FiveMethodsOnly):
    """``release_lease`` waits for ``gate`` before releasing on the backend."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.gate = asyncio.Event()
        self.releasing = asyncio.Event()
        self.released = asyncio.Event()

    async def release_lease(self, key: str, owner: str) -> None:
        self.releasing.set()
        await self.gate.wait()
        await super().release_lease(key, owner)
        self.released.set()


class GatedRenewal(FiveMethodsOnly):
    """``renew_lease`` waits for ``gate``, then asks the backend (which may refuse)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.gate = asyncio.Event()
        self.asked = asyncio.Event()

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self.asked.set()
        await self.gate.wait()
        return await super().renew_lease(key, owner, ttl_ms)
