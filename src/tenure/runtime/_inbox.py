"""A session's inbox: the signals its subscription delivered, until each is settled.

The backend's subscription callback (:meth:`Inbox.on_event`) buffers a signal
and then waits for its settlement: it returns once the signal is handled (the
backend acknowledges it), raises when the handler failed on it (the backend
delivers it again, a bounded number of times), or blocks until ``unsubscribe``
cancels it when the session stops (the signal stays unacknowledged for the next
owner without spending one of its attempts: backends retry a raising callback
at once and drop the event after ``max_attempts``, so raising there could lose it).
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from .._errors import TenureError
from .._pubsub import Event
from ._coalesce import CARRY_GRACE_S, Carry
from ._debounce import Debounce
from ._log import CLOSE_MARKER, SIGNAL_TYPE
from ._pending import Pending, Settle, settle
from ._skips import Skips, remember
from ._types import Signal
from ._wakeup import Wakeup

__all__ = ["Inbox", "Pending", "Settle", "settle"]


class _Refused(TenureError):
    """Raised from a subscription callback so the backend keeps the event for later."""


def _window_of(data: dict[str, Any]) -> float | None:
    """The debounce window a stored signal carries (see ``SendRule.on_wire``)."""
    window = data.get("window") if data.get("policy") == "debounce" else None
    if isinstance(window, int | float) and math.isfinite(window) and window > 0:
        return float(window)
    return None


async def _block_until_cancelled() -> None:
    await asyncio.get_running_loop().create_future()


class Inbox:
    """The signals of one session, from delivery to settlement, in log order.

    ``takes()`` says whether the session may still take signals (it is not
    done and its lease is held, judged on the clock); ``lost`` is set when the
    lease is lost; ``on_skipped`` is told of each signal that arrives after a
    request skipped it (see :meth:`skip_through`); ``on_coalesced(signal_id,
    into)`` of each signal settled as coalesced into ``into`` (see
    :meth:`carry_through`).

    ``wakes(data)`` says whether a stored signal's rule may wake its thread
    (``persist``'s may not). Until a signal that wakes it arrives, an inbox
    that is not ``awake`` hands nothing to a run: a persisted signal at the
    head of the log keeps it :attr:`dormant`. Delivery is in log order, one
    signal at a time, so nothing behind that signal can be read without
    acknowledging it; the session leaves it stored instead (see
    :class:`~._session.Session`). A persisted signal delivered again
    (``attempt > 1``) wakes the inbox: its previous reader was awake, or died.
    """

    def __init__(
        self,
        thread_key: str,
        sid: str,
        takes: Callable[[], bool],
        lost: asyncio.Event,
        on_skipped: Callable[[Signal], None],
        on_coalesced: Callable[[str, str], None],
        on_discarded: Callable[[str], None],
        *,
        wakes: Callable[[dict[str, Any]], bool],
        awake: bool,
    ) -> None:
        self.thread_key = thread_key
        self._sid = sid
        self._takes = takes
        self._lost = lost
        self._wakes = wakes
        self.awake = awake
        self.buffer: deque[Pending] = deque()
        self.inflight: dict[str, Pending] = {}
        self.arrived = Wakeup()
        self.marker_seq = 0
        self.marker_seen = asyncio.Event()
        self._taken: OrderedDict[str, None] = OrderedDict()
        # How many signals this inbox settled as skipped (by an interrupting
        # request) and as coalesced into a newer one (see ThreadStatus).
        self.skipped = 0
        self.coalesced = 0

        def count_skip(signal: Signal) -> None:
            self.skipped += 1
            on_skipped(signal)

        def count_coalesced(signal_id: str, into: str) -> None:
            self.coalesced += 1
            on_coalesced(signal_id, into)

        self._on_skipped = count_skip
        self._skips = Skips(self.buffer, self.inflight, count_skip, on_discarded)
        self._carry = Carry(self.buffer, self.inflight, count_coalesced, self._put)
        self._debounce = Debounce(count_coalesced)
        # The signal a run takes next, once chosen.
        self._next: Pending | None = None

    # -- the subscription callback -----------------------------------------

    async def on_event(self, event: Event) -> None:
        if event.type == CLOSE_MARKER:
            data = event.data if isinstance(event.data, dict) else {}
            if data.get("session") == self._sid and data.get("seq") == self.marker_seq:
                self.marker_seen.set()
            return
        if event.type != SIGNAL_TYPE:
            return
        if not self._takes():
            # Not ours to run: a lost session (checked on the clock, so also right
            # after a pause) holds it until it unsubscribes and hands it back.
            await _block_until_cancelled()
        pending = self._admit(event)
        if pending is None:
            return  # acknowledged: skipped, discarded or carried (see _admit)
        signal_id = pending.signal.id
        # A signal delivered again while we still hold it (a backend reclaiming
        # an idle entry) is settled like the first copy, once that one is handled.
        try:
            if pending.how is None:
                waiter = asyncio.get_running_loop().create_future()
                pending.waiters.append(waiter)
                try:
                    await waiter
                finally:
                    pending.waiters.remove(waiter)
        finally:
            if pending.how is not None and self.inflight.get(signal_id) is pending:
                del self.inflight[signal_id]
        how = pending.how
        if how == "retry":
            raise _Refused(
                f"the handler of thread {self.thread_key!r} failed on signal {signal_id}"
            )
        if how == "abandon":
            await _block_until_cancelled()

    def _admit(self, event: Event) -> Pending | None:
        """The delivered signal ``event``, buffered for a run (or the copy already
        held), or ``None`` when it is settled here without one: a request skipped,
        discarded or carried it."""
        data = event.data
        arrived = Signal(
            id=event.id or "",
            thread_key=data["thread"],
            payload=data["payload"],
            sent_at=event.created_at or 0.0,
            attempt=event.attempt,
        )
        if self._skips.settles(arrived):
            # Settled here: a carry or a debounce waiting for it waits no more.
            self._carry.forget(arrived.id)
            self._debounce.forget(arrived.id)
            return None  # acknowledged unrun: a request skipped or discarded it
        signal = self._carry.arrived(arrived)
        if signal is None:
            return None  # settled as coalesced into a newer signal
        pending = self.inflight.get(signal.id)
        if pending is not None:
            return pending
        if not self.awake and (self._wakes(data) or arrived.attempt > 1):
            self.awake = True
        window = _window_of(data)
        pending = Pending(signal, held=window is not None)
        if window is not None:
            self._debounce.arrived(signal.id, window)
        self.inflight[signal.id] = pending
        self._put(pending)
        return pending

    def _put(self, pending: Pending) -> None:
        """Buffer ``pending`` for a run."""
        self.buffer.append(pending)
        self.arrived.set()

    # -- what runs read -----------------------------------------------------

    @property
    def held(self) -> list[Signal]:
        """The debounced signals acknowledged and held for a newer one's run."""
        return self._debounce.held

    @property
    def has_work(self) -> bool:
        """Whether a signal waits here for a run (held by a debounce or not)."""
        return bool((self.awake and self.buffer) or self.held or self._next)

    @property
    def dormant(self) -> bool:
        """Whether a persisted signal heads what waits and nothing woke this inbox."""
        return not self.awake and bool(self.buffer)

    def wake_up(self) -> None:
        """Hand what waits, persisted signals included, to runs from now on."""
        if not self.awake:
            self.awake = True
            self.arrived.set()

    async def next(self, idle_timeout: float) -> Pending | None:
        """The next signal, or ``None`` once none came for ``idle_timeout`` s or the lease is lost.

        A debounce holds it (see :meth:`heard`): the idle timeout does not
        count while a held signal waits.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + idle_timeout
        while not self._lost.is_set():
            pending = self._choose(loop.time())
            if pending is not None:
                self._next = None
                remember(self._taken, pending.signal.id)
                return pending
            if self.has_work:
                await self._wait_until(self._hold_until())
            elif loop.time() < deadline:
                await self._wait_until(deadline)
            elif self._carry.carrying:
                # Signals carried into a coalescing one are on their way to a run.
                deadline = loop.time() + CARRY_GRACE_S
            else:
                return None
        return None

    async def ready(self) -> None:
        """Wait until a run could take a signal at once (or the lease is lost).

        Returns at once when nothing waits: the caller looked for work first.
        """
        loop = asyncio.get_running_loop()
        while not self._lost.is_set() and self._held_back(loop.time()):
            await self._wait_until(self._hold_until())

    def retry_first(self) -> None:
        """Hand the first waiting signal back to the log (a run returned without reading it)."""
        first, self._next = self._next, None
        if first is None and self.buffer:
            first = self.buffer.popleft()
        if first is not None:
            settle(first, "retry")

    async def wait(self, deadline: float) -> None:
        """Wait until a signal is buffered, the lease is lost or the loop's clock
        reaches ``deadline``; callers look again (a wake-up can be early).

        A loss sets ``arrived`` too (:meth:`wake`): one event to wait on. The
        deadline is kept by one timer per inbox, moved only when it fires
        before the deadline of the wait under way: a run that waits for each
        of its signals sets no timer of its own per signal.
        """
        self.arrived.clear()
        if self.buffer or self._lost.is_set():
            return
        await self._wait_until(deadline)

    async def _wait_until(self, deadline: float) -> None:
        """Wait until a signal arrives, the lease is lost or ``deadline`` (see :meth:`wait`)."""
        self.arrived.clear()
        if self._lost.is_set():
            return
        await self.arrived.until(deadline)

    # -- debouncing ------------------------------------------------------------

    def heard(self, signal_id: str, window: float) -> None:
        """This session learned of the debouncing signal ``signal_id`` (its
        request or itself, whichever came first): the thread's quiet window
        starts again, ``window`` seconds on this process's monotonic clock.

        No run takes a held signal before the window passes with nothing new
        heard of; then the newest signal heard of is handed over with every
        held one before it in ``Signal.coalesced`` (each settled as coalesced
        into it). To read a newer signal the log holds behind one, the older
        one is acknowledged and kept here meanwhile (:attr:`held`). A sender's
        clock enters nowhere: only when this session heard of each signal.
        """
        known = signal_id in self.inflight or signal_id in self._taken
        self._debounce.heard(signal_id, window, known=known)

    def _hold_until(self) -> float:
        """When the signal held first may go to a run (see :meth:`Debounce.hold_until`)."""
        return self._debounce.hold_until(bool(self.buffer))

    def _held_back(self, now: float) -> bool:
        """Whether a debounce keeps the next signal from a run at ``now``.

        Nothing leaves the buffer here: a request may still skip or carry it.
        """
        if self._next is not None:
            return False
        if self.buffer:
            return self.buffer[0].held and not self._debounce.quiet(now)
        return bool(self.held) and now < self._hold_until()

    def _choose(self, now: float) -> Pending | None:
        """The signal a run takes next, if one may go now (set aside in ``_next``)."""
        if self._next is not None:
            return self._next
        if not self.awake:
            return None
        debounce = self._debounce
        while self.buffer and self._next is None:
            head = self.buffer[0]
            if not head.held:
                # Held signals before one sent otherwise: they go first, together.
                self._next = debounce.release() if self.held else self.buffer.popleft()
            elif not debounce.quiet(now):
                return None
            else:
                self.buffer.popleft()
                if (self.buffer and self.buffer[0].held) or debounce.announcing:
                    # Newer held signals wait behind it, or are on their way:
                    # keep this one and read them.
                    debounce.keep(head.signal)
                    settle(head, "ack")
                else:
                    head.signal = debounce.hand(head.signal)
                    self._next = head
        if self._next is None and not self.buffer and self.held and now >= self._hold_until():
            debounce.give_up_announced()
            self._next = debounce.release()
        return self._next

    def wake(self) -> None:
        """Wake a wait under way (the lease was lost)."""
        self.arrived.set()

    # -- requests and skips --------------------------------------------------

    def was_taken(self, signal_id: str) -> bool:
        """Whether ``signal_id`` was handed to a run of this session already."""
        return signal_id in self._taken

    def skip_through(self, signal_id: str, sent_at: float) -> list[Signal]:
        """Settle unhandled the signals before ``signal_id``: those carried into a
        coalescing one or held by a debounce (read, so before it in the log), and
        the buffered ones sent before it (see :meth:`Skips.through
        <._skips.Skips.through>`); returns them."""
        read = self._carry.skip_all() + self._debounce.skip_all()
        for signal in read:
            self._on_skipped(signal)  # acknowledged already, when carried or held
        return read + [p.signal for p in self._skips.through(signal_id, sent_at)]

    def end_carry(self) -> bool:
        """Nothing more comes to this session: signals carried into a coalescing
        one that did not come run now (see :meth:`Carry.end <._coalesce.Carry.end>`)."""
        return self._carry.end()

    def discard(self, signal_id: str) -> None:
        """Settle ``signal_id`` unrun, as discarded: now if it waits here, when
        it arrives otherwise (unless a run took it already)."""
        self._skips.discard(signal_id, taken=signal_id in self._taken)

    @property
    def discarded(self) -> int:
        """How many signals this inbox settled as discarded."""
        return self._skips.discarded

    def carry_through(self, signal_id: str, sent_at: float) -> None:
        """Carry into the coalescing signal ``signal_id`` the signals waiting
        before it (see :meth:`Carry.through <._coalesce.Carry.through>`)."""
        self._carry.through(signal_id, sent_at)

    # -- the end ---------------------------------------------------------------

    def abandon_all(self) -> None:
        """Leave every unsettled signal to the next owner (the session ends)."""
        self.arrived.cancel()
        self._carry.drop(self.thread_key)
        self._debounce.drop(self.thread_key)
        self._next = None
        while self.buffer:
            settle(self.buffer.popleft(), "abandon")
        for pending in list(self.inflight.values()):
            settle(pending, "abandon")
