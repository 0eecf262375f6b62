"""Signals a request settles before any run takes them: skipped or discarded.

A :class:`Skips` belongs to one :class:`~._inbox.Inbox` and works on its
buffer. A request that drops older signals skips what was sent before its
signal (:meth:`Skips.through`); a request under ``discard`` settles its own
signal unrun (:meth:`Skips.discard`), now if it waits, or when it arrives.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

from ._debounce import KEPT
from ._pending import Pending, settle
from ._types import Signal

__all__ = ["Skips", "remember"]


def remember(ids: OrderedDict[str, None], signal_id: str) -> None:
    """Add ``signal_id`` to ``ids``, forgetting the oldest beyond :data:`KEPT`."""
    ids[signal_id] = None
    if len(ids) > KEPT:
        ids.popitem(last=False)


class Skips:
    """The skips and discards of one inbox.

    ``buffer`` and ``inflight`` are the inbox's; ``on_skipped`` is told of each
    signal that arrives after a request skipped it, ``on_discarded`` of each
    signal discarded.
    """

    def __init__(
        self,
        buffer: deque[Pending],
        inflight: dict[str, Pending],
        on_skipped: Callable[[Signal], None],
        on_discarded: Callable[[str], None],
    ) -> None:
        self._buffer = buffer
        self._inflight = inflight
        self._on_skipped = on_skipped
        self._on_discarded = on_discarded
        # Set by a request whose signal has not arrived yet: (its id, its send time).
        self._skip_until: tuple[str, float] | None = None
        # Discarded before they arrived (see discard()), and how many were.
        self._discarding: OrderedDict[str, None] = OrderedDict()
        self.discarded = 0

    def through(self, signal_id: str, sent_at: float) -> list[Pending]:
        """Acknowledge unhandled the buffered signals sent before ``signal_id``; returns them.

        The buffer is in log order, so what waits ahead of ``signal_id`` was sent
        before it. When ``signal_id`` has not arrived, the buffered signals sent
        no later than ``sent_at`` (by their senders' clocks) are, and so is each
        such signal that arrives before ``signal_id`` does.
        """
        buffer = self._buffer
        waiting = [p.signal.id for p in buffer]
        if signal_id in waiting:
            skipped = [buffer.popleft() for _ in range(waiting.index(signal_id))]
        else:
            if signal_id not in self._inflight:
                self._skip_until = (signal_id, sent_at)
            skipped = [p for p in buffer if p.signal.sent_at <= sent_at]
            for pending in skipped:
                buffer.remove(pending)
        for old in skipped:
            self._on_skipped(old.signal)  # said before the acknowledgement is sent
            settle(old, "ack")
        return skipped

    def discard(self, signal_id: str, *, taken: bool) -> None:
        """Settle ``signal_id`` unrun, as discarded: now if it waits here, when
        it arrives otherwise (unless a run took it already: ``taken``)."""
        for pending in self._buffer:
            if pending.signal.id == signal_id:
                self._buffer.remove(pending)
                settle(pending, "ack")
                self._discarded(signal_id)
                return
        if signal_id in self._inflight or taken:
            return
        remember(self._discarding, signal_id)

    def settles(self, signal: Signal) -> bool:
        """Whether the arriving ``signal`` is settled here, unrun: a request
        skipped it (it was sent before the requesting one) or discarded it."""
        if self._skipped(signal):
            return True
        if signal.id in self._discarding:
            del self._discarding[signal.id]
            self._discarded(signal.id)
            return True
        return False

    def _discarded(self, signal_id: str) -> None:
        self.discarded += 1
        self._on_discarded(signal_id)

    def _skipped(self, signal: Signal) -> bool:
        if self._skip_until is None:
            return False
        signal_id, sent_at = self._skip_until
        if signal.id == signal_id or signal.sent_at > sent_at:
            self._skip_until = None  # the requesting signal, or a newer one: back to normal
            return False
        self._on_skipped(signal)
        return True
