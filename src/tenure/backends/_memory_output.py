"""Thread output streams of the memory backend (``memory://``), for one process.

Fenced like the others: the lease is read and the items stored in one step of
the event loop (nothing is awaited between the check and the append).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._errors import Fenced

if TYPE_CHECKING:
    from .._output import Retention, WriteFence
    from .memory import MemoryPubSub

__all__ = ["MemoryOutput"]


@dataclass(eq=False)
class _Stream:
    head: int = 0
    items: deque[tuple[int, str, float]] = field(default_factory=deque)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


# The streams of each backend object, shared by the runtimes built on it.
_streams_of: weakref.WeakKeyDictionary[MemoryPubSub, dict[str, _Stream]] = (
    weakref.WeakKeyDictionary()
)


class MemoryOutput:
    """Output streams kept in this process, next to the memory backend's leases."""

    def __init__(self, backend: MemoryPubSub) -> None:
        self._backend = backend
        self._streams = _streams_of.setdefault(backend, {})

    async def append(
        self, stream: str, fence: WriteFence, bodies: Sequence[str], retention: Retention
    ) -> int:
        record = await self._backend.get_lease(fence.lease_key)
        # From here to the return nothing is awaited: the check and the append are one step.
        if record is None or record.owner != fence.owner or record.token != fence.token:
            raise Fenced(fence.lease_key, fence.owner, "the lease is no longer this writer's")
        s = self._streams.setdefault(stream, _Stream())
        now = time.time()
        for body in bodies:
            s.head += 1
            s.items.append((s.head, body, now))
        while len(s.items) > retention.max_items:
            s.items.popleft()
        while len(s.items) > 1 and s.items[0][2] < now - retention.max_age:
            s.items.popleft()
        waiters, s.waiters = s.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        return s.head

    async def read(self, stream: str, after: int, limit: int) -> tuple[int, list[tuple[int, str]]]:
        s = self._streams.get(stream)
        if s is None:
            return 0, []
        rows: list[tuple[int, str]] = []
        if limit > 0 and after < s.head:
            start = max(0, len(s.items) - (s.head - after))
            for i in range(start, min(len(s.items), start + limit)):
                position, body, _ = s.items[i]
                rows.append((position, body))
        return s.head, rows

    async def wait(self, stream: str, after: int, timeout: float) -> list[tuple[int, str]]:
        s = self._streams.setdefault(stream, _Stream())
        if s.head > after:
            return []
        waiter = asyncio.get_running_loop().create_future()
        s.waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            if waiter in s.waiters:
                s.waiters.remove(waiter)
        return []

    async def aclose(self) -> None:
        pass
