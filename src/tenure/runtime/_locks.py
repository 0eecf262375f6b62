"""One lock per key, kept only while someone holds or waits for it.

Every ``send_signal`` takes its thread's lock, almost always uncontended, so
the lock is a queue of waiters in a dict rather than an ``asyncio.Lock`` made
and dropped per call: a key is held while it is in the dict; its value holds
the futures of the tasks waiting for it, first come first served. Releasing
hands the lock to the first waiter directly (no other task can take it in
between), or drops the key.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType

__all__ = ["KeyLocks"]


class KeyLocks:
    def __init__(self) -> None:
        # Held keys -> the futures of the tasks waiting for them, in order.
        self._locks: dict[str, deque[asyncio.Future[None]]] = {}

    def hold(self, key: str) -> _Hold:
        """Hold ``key``'s lock for the ``async with`` body."""
        return _Hold(self, key)

    async def _acquire(self, key: str) -> None:
        waiters = self._locks.get(key)
        if waiters is None:
            self._locks[key] = deque()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release(key)  # handed to us as we were cancelled: pass it on
            else:
                waiter.cancel()  # skipped by _release
            raise

    def _release(self, key: str) -> None:
        waiters = self._locks[key]
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the lock is now that waiter's
                return
        del self._locks[key]


class _Hold:
    """``async with`` one key's lock."""

    __slots__ = ("_key", "_locks")

    def __init__(self, locks: KeyLocks, key: str) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        await self._locks._acquire(self._key)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._locks._release(self._key)
