"""One ``asyncio.Lock`` per key, kept only while someone holds or waits for it."""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["KeyLocks"]


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0  # holding it or waiting for it


class KeyLocks:
    def __init__(self) -> None:
        self._locks: dict[str, _Entry] = {}

    def hold(self, key: str) -> _Hold:
        """Hold ``key``'s lock for the ``async with`` body."""
        return _Hold(self._locks, key)


class _Hold:
    """``async with`` one key's lock; a plain class (every send takes one)."""

    __slots__ = ("_key", "_locks")

    def __init__(self, locks: dict[str, _Entry], key: str) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        entry = self._locks.get(self._key)
        if entry is None:
            entry = self._locks[self._key] = _Entry()
        entry.users += 1
        try:
            await entry.lock.acquire()
        except BaseException:
            self._leave(entry)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        entry = self._locks[self._key]
        entry.lock.release()
        self._leave(entry)

    def _leave(self, entry: _Entry) -> None:
        entry.users -= 1
        if not entry.users:
            del self._locks[self._key]
