"""A delivered signal until it is settled, and how it is settled.

The backend's subscription callback waits on a :class:`Pending` until
:func:`settle` decides it: ``"ack"`` (handled, or settled without a run),
``"retry"`` (the handler failed on it: the backend delivers it again) or
``"abandon"`` (left unacknowledged for the next owner).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from ._types import Signal

__all__ = ["Pending", "Settle", "settle"]

Settle = Literal["ack", "retry", "abandon"]


@dataclass(eq=False, slots=True)
class Pending:
    signal: Signal
    how: Settle | None = None  # set once, by settle()
    # The subscription callbacks waiting for ``how`` (a redelivery may add one).
    # A future each, not one shared: cancelling a callback must leave the signal
    # unsettled, and a shared future under asyncio.shield costs a loop turn more.
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    # Sent under debounce: no run takes it before the thread's quiet window.
    held: bool = False


def settle(pending: Pending, how: Settle) -> None:
    if pending.how is None:
        pending.how = how
        for waiter in pending.waiters:
            if not waiter.done():
                waiter.set_result(None)
