"""The output-stream contract a backend implements (``backends/<name>/_output.py``).

The thread runtime (``runtime/_output.py``, ``runtime/_replies.py``) encodes, decodes
and judges items; a store keeps only ``(position, body)`` per stream, appending
only while the writer's lease is held (see :class:`WriteFence`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ._errors import InvalidArgument

__all__ = ["OutputStore", "Retention", "WriteFence", "wait_woken"]

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class Retention:
    """How much of a thread's output a backend keeps: at most ``max_items``
    items, none older than ``max_age`` seconds (the newest item is always kept,
    so positions never restart)."""

    max_items: int = 10_000
    max_age: float = 24 * 3600.0

    def __post_init__(self) -> None:
        if isinstance(self.max_items, bool) or not isinstance(self.max_items, int):
            raise InvalidArgument(f"max_items must be an int, got {type(self.max_items).__name__}")
        if self.max_items < 1:
            raise InvalidArgument(f"max_items must be at least 1, got {self.max_items}")
        if isinstance(self.max_age, bool) or not isinstance(self.max_age, int | float):
            raise InvalidArgument(f"max_age must be a number, got {type(self.max_age).__name__}")
        if not self.max_age > 0:
            raise InvalidArgument(f"max_age must be positive, got {self.max_age}")


@dataclass(frozen=True, slots=True)
class WriteFence:
    """Who may append: the holder ``owner`` of ``lease_key`` with ``token``."""

    lease_key: str
    owner: str
    token: int | None


class OutputStore(Protocol):
    """What a backend offers to keep output streams (``backends/<name>/_output.py``)."""

    async def append(
        self, stream: str, fence: WriteFence, bodies: Sequence[str], retention: Retention
    ) -> int:
        """Store ``bodies`` at the next positions if ``fence`` holds; the last position.

        Raises :class:`~tenure.Fenced` (nothing stored) when it does not.
        """
        ...

    async def read(self, stream: str, after: int, limit: int) -> tuple[int, list[tuple[int, str]]]:
        """The stream's last position, and up to ``limit`` kept items after ``after``."""
        ...

    async def wait(self, stream: str, after: int, timeout: float) -> list[tuple[int, str]]:
        """Return when an item after ``after`` may exist, or after ``timeout`` seconds;
        with the items after ``after`` when the wait itself read them (else ``[]``)."""
        ...

    async def aclose(self) -> None: ...


async def wait_woken(
    store: OutputStore,
    waiters: dict[K, list[asyncio.Future[None]]],
    key: K,
    stream: str,
    after: int,
    timeout: float,
) -> list[tuple[int, str]]:
    """:meth:`OutputStore.wait` for a store whose wake-ups resolve the futures kept
    in ``waiters`` under the stream's ``key``: registered, then looked, so an append
    in between is not missed. Returns ``[]`` (the caller reads)."""
    waiter = asyncio.get_running_loop().create_future()
    waiters.setdefault(key, []).append(waiter)
    try:
        head, _ = await store.read(stream, after, 0)
        if head <= after:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
    except TimeoutError:
        pass
    finally:
        registered = waiters.get(key, [])
        if waiter in registered:
            registered.remove(waiter)
        if not registered:
            waiters.pop(key, None)
    return []
