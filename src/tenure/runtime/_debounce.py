"""Debouncing in an inbox: a thread's quiet window, and the signals held until it passes.

A :class:`Debounce` belongs to one :class:`~._inbox.Inbox`. It keeps when the
session last heard of a debouncing signal (its request or itself, whichever
came first) on this process's monotonic clock, and the signals acknowledged
so that newer ones could be read, until a run takes the newest with them. A
sender's clock enters nowhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from ._pending import Pending
from ._types import Signal

__all__ = ["KEPT", "Debounce"]

logger = logging.getLogger("tenure.runtime")

# How many signal ids an inbox remembers per kind (heard of, announced, taken
# by a run, discarded before arriving): requests follow their signals closely.
KEPT = 1024

# How much longer than its window a debounce waits for a signal a request
# announced, at least, before it hands over the held ones without it (a
# request about a signal that never reaches this session).
_ANNOUNCED_WAIT = 1.0


class Debounce:
    """The quiet window of one inbox and the signals it holds.

    ``on_coalesced(signal_id, into)`` is told of each held signal handed to a
    run inside the newer signal ``into``.
    """

    def __init__(self, on_coalesced: Callable[[str, str], None]) -> None:
        self._on_coalesced = on_coalesced
        # The ids heard of (bounded), when the newest was first heard of (the
        # loop's clock) and its window; the ids a request announced that have not
        # arrived yet; and the held signals already acknowledged so the next ones
        # could be read, oldest first.
        self._heard: OrderedDict[str, None] = OrderedDict()
        self._heard_at = 0.0
        self._window = 0.0
        self._announced: dict[str, None] = {}
        self.held: list[Signal] = []

    def heard(self, signal_id: str, window: float, *, known: bool) -> None:
        """The session learned of the debouncing signal ``signal_id``: the quiet
        window starts again, ``window`` seconds from now. Unless it is ``known``
        (delivered already), it is announced: on its way to this session."""
        heard = self._heard
        if signal_id in heard:
            return
        heard[signal_id] = None
        if len(heard) > KEPT:
            heard.popitem(last=False)
        self._heard_at = asyncio.get_running_loop().time()
        self._window = window
        announced = self._announced
        if not known:
            announced[signal_id] = None
            if len(announced) > KEPT:
                del announced[next(iter(announced))]

    def arrived(self, signal_id: str, window: float) -> None:
        """The debouncing signal ``signal_id`` was delivered here."""
        self.heard(signal_id, window, known=True)
        self._announced.pop(signal_id, None)

    def forget(self, signal_id: str) -> None:
        """``signal_id`` arrived and was settled without a run (a request skipped it):
        it is no longer on its way."""
        self._announced.pop(signal_id, None)

    def quiet(self, now: float) -> bool:
        """Whether the quiet window has passed at ``now`` (the loop's clock)."""
        return now >= self._heard_at + self._window

    @property
    def announcing(self) -> bool:
        """Whether a request announced a signal that has not arrived yet."""
        return bool(self._announced)

    def give_up_announced(self) -> None:
        """The announced signals are not coming here (their wait is over)."""
        self._announced.clear()

    def hold_until(self, buffered: bool) -> float:
        """When the signal held first may go to a run: the end of the quiet window,
        or later when nothing is ``buffered`` (the held ones then go without the
        signals announced: see :data:`_ANNOUNCED_WAIT`)."""
        quiet = self._heard_at + self._window
        if buffered or not self.held:
            return quiet
        return quiet + max(self._window, _ANNOUNCED_WAIT)

    def keep(self, signal: Signal) -> None:
        """Hold ``signal`` (acknowledged) until a newer one goes to a run."""
        self.held.extend(signal.coalesced)
        self.held.append(replace(signal, coalesced=()))

    def hand(self, signal: Signal) -> Signal:
        """``signal`` with the held signals before it, each settled as coalesced into it."""
        held, self.held = self.held, []
        for old in held:
            self._on_coalesced(old.id, signal.id)
        return replace(signal, coalesced=(*held, *signal.coalesced)) if held else signal

    def release(self) -> Pending:
        """The held signals as one, the newest with the older ones (already acknowledged)."""
        newest = self.held.pop()
        return Pending(self.hand(newest), how="ack")

    def skip_all(self) -> list[Signal]:
        """Give up the held signals: an interrupting request skips them (each was
        read, so came before it in the log). Returns them, oldest first."""
        held, self.held = self.held, []
        return held

    def drop(self, thread_key: str) -> None:
        """The session ends: the held signals are dropped, with a warning."""
        if self.held:
            # Acknowledged to read newer ones: gone with this session (docs/policies.md).
            logger.warning(
                "thread %r: %d debounced signal(s) acknowledged but not yet run are dropped",
                thread_key,
                len(self.held),
            )
            self.held.clear()
