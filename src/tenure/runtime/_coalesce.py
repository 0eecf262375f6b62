"""Coalescing in an inbox: the signals that wait before a coalescing one are
carried into it and handed to its run together, decided in log order.

A :class:`Carry` belongs to one :class:`~._inbox.Inbox` and works on its
buffer: a request names the coalescing signal (:meth:`Carry.through`), and
every signal read before it is settled as carried. Nothing here reads a clock
to order signals; the senders' clocks only end a wait for a signal that went
to another owner (:data:`_STALE_S`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from ._pending import Pending, settle
from ._types import Signal

__all__ = ["CARRY_GRACE_S", "Carry"]

logger = logging.getLogger("tenure.runtime")

# A coalescing signal whose request came first is waited for while signals are
# read, but not when one sent this many seconds after it (senders' clocks) comes
# first, nor when nothing is read for CARRY_GRACE_S: it went to another owner.
_STALE_S = 10.0
CARRY_GRACE_S = 2.0


class Carry:
    """The signals carried into coalescing ones, for one inbox.

    ``buffer`` and ``inflight`` are the inbox's (what waits for a run, and
    every signal delivered and not settled); ``on_coalesced(signal_id, into)``
    is told of each signal settled as coalesced into ``into``; ``put`` hands a
    signal back to the inbox for a run (see :meth:`_end`).
    """

    def __init__(
        self,
        buffer: deque[Pending],
        inflight: dict[str, Pending],
        on_coalesced: Callable[[str, str], None],
        put: Callable[[Pending], None],
    ) -> None:
        self._buffer = buffer
        self._inflight = inflight
        self._on_coalesced = on_coalesced
        self._put = put
        # The signals whose coalescing request came before the signal itself
        # (id: send time), each later in the log than everything read so far;
        # the signals carried meanwhile (acknowledged, oldest first), handed to
        # the run of the last of them to arrive; and the timer that ends a carry
        # whose requested signals stop coming.
        self._coming: dict[str, float] = {}
        self._carried: list[Signal] = []
        self._timer: asyncio.TimerHandle | None = None

    @property
    def carrying(self) -> bool:
        """Whether signals carried into a coalescing one are on their way to a run."""
        return bool(self._carried)

    def through(self, signal_id: str, sent_at: float) -> None:
        """Carry into the coalescing signal ``signal_id`` the signals waiting before it.

        Decided in log order, never on the senders' clocks: the run of the last
        coalescing signal to arrive receives every signal carried before it in
        ``Signal.coalesced``, oldest first, and ``on_coalesced`` is told of each
        then. A signal is acknowledged when it is carried (it has reached this
        inbox), not before, so one this owner had no time to read stays in the
        log for the next. When ``signal_id`` has not arrived, it comes later in
        the log than everything read so far: every signal read until it arrives
        is carried (a signal sent ``_STALE_S`` after it, by the senders' clocks,
        ends that wait; so does ``CARRY_GRACE_S`` with nothing read, the newest
        carried signal then running with the others).
        """
        if any(s.id == signal_id for s in self._carried):
            return  # carried already: a later coalescing signal was known to come
        buffer = self._buffer
        waiting = [p.signal.id for p in buffer]
        if signal_id not in waiting:
            if signal_id in self._inflight:
                return  # being handled: nothing waits before it any more
            self._coming[signal_id] = sent_at
            self._carry_waiting(len(buffer))
            return
        if self._coming:
            # Another coalescing signal, later in the log, is still to come.
            self._carry_waiting(waiting.index(signal_id) + 1)
            return
        self._carry_waiting(waiting.index(signal_id))
        head = buffer[0]
        head.signal = self.into(head.signal)

    def arrived(self, signal: Signal) -> Signal | None:
        """``signal`` as a run should see it, or ``None`` when it is carried into a
        coalescing signal still to come (later in the log)."""
        if not self._coming and not self._carried:
            return signal
        self._coming.pop(signal.id, None)
        for signal_id, sent_at in list(self._coming.items()):
            if signal.sent_at > sent_at + _STALE_S:
                del self._coming[signal_id]  # it would have come by now: taken elsewhere
        if self._coming:
            self._carry(signal)
            return None
        return self.into(signal)

    def into(self, signal: Signal) -> Signal:
        """``signal`` with the signals carried into it; each is now settled as coalesced."""
        self._stop_timer()
        carried, self._carried = self._carried, []
        if not carried:
            return signal
        for old in carried:
            self._on_coalesced(old.id, signal.id)
        return replace(signal, coalesced=(*carried, *signal.coalesced))

    def forget(self, signal_id: str) -> None:
        """``signal_id`` arrived and was settled without a run (a request skipped it):
        it will not come to carry anything."""
        self._coming.pop(signal_id, None)

    def skip_all(self) -> list[Signal]:
        """Give up every carried signal: an interrupting request skips them (each
        was read, so came before it in the log). Returns them, oldest first."""
        self._stop_timer()
        carried, self._carried = self._carried, []
        return carried

    def end(self) -> bool:
        """Nothing more comes to this session (its close marker was read back):
        the newest carried signal runs now, with the others. Whether one did."""
        if not self._carried:
            return False
        self._end()
        return True

    def drop(self, thread_key: str) -> None:
        """The session ends: what was carried is dropped, with a warning."""
        self._stop_timer()
        if self._carried:
            # Acknowledged when read, waiting for a coalescing signal this session
            # will not read: the next owner runs that one without them.
            logger.warning(
                "thread %r: %d signal(s) carried into a coalescing signal not yet read "
                "are dropped as the session ends: %s",
                thread_key,
                len(self._carried),
                ", ".join(s.id for s in self._carried),
            )
            self._carried = []
        self._coming.clear()

    def _carry_waiting(self, count: int) -> None:
        """Carry the first ``count`` waiting signals (they precede a coalescing one)."""
        for _ in range(count):
            pending = self._buffer.popleft()
            self._carry(pending.signal)
            settle(pending, "ack")

    def _carry(self, signal: Signal) -> None:
        self._carried.extend(signal.coalesced)
        self._carried.append(replace(signal, coalesced=()))
        self._stop_timer()
        self._timer = asyncio.get_running_loop().call_later(CARRY_GRACE_S, self._end)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _end(self) -> None:
        """Nothing read for a while: the requested signals are not coming (another
        owner took them); the newest carried signal runs, with the others."""
        self._timer = None
        self._coming.clear()
        if not self._carried:
            return
        *older, newest = self._carried
        self._carried = older
        # Acknowledged when it was carried: a run failing on it cannot have it back.
        self._put(Pending(self.into(newest)))
