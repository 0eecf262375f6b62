"""Waiting for a backend's lease waiters, instead of sleeping and hoping they got there.

Every lease backend keeps its local waiters in a ``KeyWaiters`` named
``_waiters`` (``tenure.backends._core.LeaseCore``). A waiter *registers*, then
*looks* whether the key is free (a round trip), then sleeps *parked* until woken.
A release meant to wake it must come after it is parked: one that comes during
the look is seen by the look instead.
"""

from __future__ import annotations

from typing import Any

from tenure.testing import eventually

__all__ = ["asleep", "until_parked"]


async def until_parked(backend: Any, key: str, count: int = 1, timeout: float = 10.0) -> None:
    """Wait until ``count`` waiters of ``key`` have looked and sleep (no more, no fewer)."""
    await eventually(lambda: backend._waiters.parked(key) == count, timeout=timeout)


def asleep(backend: Any) -> int:
    """How many of the backend's waiters are registered and not woken (every key)."""
    return len(backend._waiters)
