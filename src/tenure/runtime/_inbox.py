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
import logging
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .._errors import TenureError
from .._pubsub import Event
from ._log import CLOSE_MARKER, SIGNAL_TYPE
from ._types import Signal

__all__ = ["Inbox", "Pending", "Settle", "settle"]

logger = logging.getLogger("tenure.runtime")

Settle = Literal["ack", "retry", "abandon"]


# A coalescing signal whose request came first is waited for while signals are
# read, but not when one sent this many seconds after it (senders' clocks) comes
# first, nor when nothing is read for _CARRY_GRACE_S: it went to another owner.
_STALE_S = 10.0
_CARRY_GRACE_S = 2.0

# How many ids of signals handed to a run an inbox remembers, so that a request
# about one of them is known to come too late (it follows its signal closely).
_TAKEN_KEPT = 1024

# How much longer than its window a debounce waits for a signal a request
# announced, at least, before it hands over the held ones without it (a
# request about a signal that never reaches this session).
_ANNOUNCED_WAIT = 1.0


class _Refused(TenureError):
    """Raised from a subscription callback so the backend keeps the event for later."""


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


def _window_of(data: dict[str, Any]) -> float | None:
    """The debounce window a stored signal carries (see ``SendRule.on_wire``)."""
    window = data.get("window") if data.get("policy") == "debounce" else None
    if isinstance(window, int | float) and math.isfinite(window) and window > 0:
        return float(window)
    return None


def settle(pending: Pending, how: Settle) -> None:
    if pending.how is None:
        pending.how = how
        for waiter in pending.waiters:
            if not waiter.done():
                waiter.set_result(None)


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
        self._on_skipped = on_skipped
        self._on_coalesced = on_coalesced
        self._on_discarded = on_discarded
        self._wakes = wakes
        self.awake = awake
        # Discarded before they arrived (see discard()), and how many were.
        self._discarding: OrderedDict[str, None] = OrderedDict()
        self.discarded = 0
        self.buffer: deque[Pending] = deque()
        self.inflight: dict[str, Pending] = {}
        self.arrived = asyncio.Event()
        self.marker_seq = 0
        self.marker_seen = asyncio.Event()
        # Set by a request whose signal has not arrived yet: (its id, its send time).
        self._skip_until: tuple[str, float] | None = None
        self._taken: OrderedDict[str, None] = OrderedDict()
        # Coalescing, in log order: the signals whose coalescing request came
        # before the signal itself (id: send time), each later in the log than
        # everything read so far; the signals carried meanwhile (acknowledged,
        # oldest first), handed to the run of the last of them to arrive; and the
        # timer that ends a carry whose requested signals stop coming.
        self._coming: dict[str, float] = {}
        self._carried: list[Signal] = []
        self._carry_timer: asyncio.TimerHandle | None = None
        # Debouncing (see heard()): the ids heard of (bounded), when the newest
        # was first heard of (the loop's clock) and its window; the ids a
        # request announced that have not arrived yet; the held signals already
        # acknowledged so the next ones could be read, oldest first; and the
        # signal a run takes next, once chosen.
        self._heard: OrderedDict[str, None] = OrderedDict()
        self._heard_at = 0.0
        self._window = 0.0
        self._announced_ids: dict[str, None] = {}
        self.held: list[Signal] = []
        self._next: Pending | None = None
        # The idle timer of the waits, and the deadline of the wait under way
        # (the loop's clock); see wait().
        self._timer: asyncio.TimerHandle | None = None
        self._wake_at = 0.0
        self._waiting = False

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
        data = event.data
        arrived = Signal(
            id=event.id or "",
            thread_key=data["thread"],
            payload=data["payload"],
            sent_at=event.created_at or 0.0,
            attempt=event.attempt,
        )
        if self._skipped(arrived):
            return  # acknowledged unhandled: a request came after it
        if arrived.id in self._discarding:
            del self._discarding[arrived.id]
            self._discarded(arrived.id)
            return  # acknowledged unrun: sent under discard while a run was busy
        signal = self._carried_into(arrived)
        if signal is None:
            return  # settled as coalesced into a newer signal
        pending = self.inflight.get(signal.id)
        if pending is None:
            if not self.awake and (self._wakes(data) or arrived.attempt > 1):
                self.awake = True
            window = _window_of(data)
            pending = Pending(signal, held=window is not None)
            if window is not None:
                self.heard(signal.id, window)
                self._announced_ids.pop(signal.id, None)
            self.inflight[signal.id] = pending
            self.buffer.append(pending)
            self.arrived.set()
        # else: delivered again while we still hold it (a backend reclaiming an idle
        # entry); settle it like the first copy, once that one is handled.
        try:
            if pending.how is None:
                waiter = asyncio.get_running_loop().create_future()
                pending.waiters.append(waiter)
                try:
                    await waiter
                finally:
                    pending.waiters.remove(waiter)
        finally:
            if pending.how is not None and self.inflight.get(signal.id) is pending:
                del self.inflight[signal.id]
        how = pending.how
        if how == "retry":
            raise _Refused(
                f"the handler of thread {self.thread_key!r} failed on signal {signal.id}"
            )
        if how == "abandon":
            await _block_until_cancelled()

    # -- what runs read -----------------------------------------------------

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
                taken = self._taken
                taken[pending.signal.id] = None
                if len(taken) > _TAKEN_KEPT:
                    taken.popitem(last=False)
                return pending
            if self.has_work:
                await self._wait_until(self._hold_until())
            elif loop.time() < deadline:
                await self._wait_until(deadline)
            elif self._carried:
                # Signals carried into a coalescing one are on their way to a run.
                deadline = loop.time() + _CARRY_GRACE_S
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
        self._wake_at = deadline
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(deadline, self._on_timer)
        self._waiting = True
        try:
            await self.arrived.wait()
        finally:
            self._waiting = False

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
        heard = self._heard
        if signal_id in heard:
            return
        heard[signal_id] = None
        if len(heard) > _TAKEN_KEPT:
            heard.popitem(last=False)
        self._heard_at = asyncio.get_running_loop().time()
        self._window = window
        announced = self._announced_ids
        if signal_id not in self.inflight and signal_id not in self._taken:
            announced[signal_id] = None
            if len(announced) > _TAKEN_KEPT:
                del announced[next(iter(announced))]

    def _hold_until(self) -> float:
        """When the signal held first may go to a run (or the held ones without
        the signals announced: see :data:`_ANNOUNCED_WAIT`)."""
        quiet = self._heard_at + self._window
        if self.buffer or not self.held:
            return quiet
        return quiet + max(self._window, _ANNOUNCED_WAIT)

    def _held_back(self, now: float) -> bool:
        """Whether a debounce keeps the next signal from a run at ``now``.

        Nothing leaves the buffer here: a request may still skip or carry it.
        """
        if self._next is not None:
            return False
        if self.buffer:
            return self.buffer[0].held and now < self._heard_at + self._window
        return bool(self.held) and now < self._hold_until()

    def _choose(self, now: float) -> Pending | None:
        """The signal a run takes next, if one may go now (set aside in ``_next``)."""
        if self._next is not None:
            return self._next
        if not self.awake:
            return None
        while self.buffer and self._next is None:
            head = self.buffer[0]
            if not head.held:
                # Held signals before one sent otherwise: they go first, together.
                self._next = self._release_held() if self.held else self.buffer.popleft()
            elif now < self._heard_at + self._window:
                return None
            else:
                self.buffer.popleft()
                if (self.buffer and self.buffer[0].held) or self._announced_ids:
                    # Newer held signals wait behind it, or are on their way:
                    # keep this one and read them.
                    self.held.extend(head.signal.coalesced)
                    self.held.append(replace(head.signal, coalesced=()))
                    settle(head, "ack")
                else:
                    head.signal = self._hand_held(head.signal)
                    self._next = head
        if self._next is None and not self.buffer and self.held and now >= self._hold_until():
            self._announced_ids.clear()
            self._next = self._release_held()
        return self._next

    def _hand_held(self, signal: Signal) -> Signal:
        """``signal`` with the held signals before it, each settled as coalesced into it."""
        held, self.held = self.held, []
        for old in held:
            self._on_coalesced(old.id, signal.id)
        return replace(signal, coalesced=(*held, *signal.coalesced)) if held else signal

    def _release_held(self) -> Pending:
        """The held signals as one, the newest with the older ones (already acknowledged)."""
        newest = self.held.pop()
        return Pending(self._hand_held(newest), how="ack")

    def wake(self) -> None:
        """Wake a wait under way (the lease was lost)."""
        self.arrived.set()

    def _on_timer(self) -> None:
        """The idle timer fired: wake the wait under way if its deadline has come."""
        self._timer = None
        if not self._waiting:
            return  # nobody waits: the next wait sets it again
        loop = asyncio.get_running_loop()
        if loop.time() >= self._wake_at:
            self.arrived.set()
        else:
            self._timer = loop.call_at(self._wake_at, self._on_timer)

    # -- requests and skips --------------------------------------------------

    def was_taken(self, signal_id: str) -> bool:
        """Whether ``signal_id`` was handed to a run of this session already."""
        return signal_id in self._taken

    def skip_through(self, signal_id: str, sent_at: float) -> list[Pending]:
        """Acknowledge unhandled the buffered signals sent before ``signal_id``; returns them.

        The buffer is in log order, so what waits ahead of ``signal_id`` was sent
        before it. When ``signal_id`` has not arrived, the buffered signals sent
        no later than ``sent_at`` (by their senders' clocks) are, and so is each
        such signal that arrives before ``signal_id`` does.
        """
        waiting = [p.signal.id for p in self.buffer]
        if signal_id in waiting:
            skipped = [self.buffer.popleft() for _ in range(waiting.index(signal_id))]
        else:
            if signal_id not in self.inflight:
                self._skip_until = (signal_id, sent_at)
            skipped = [p for p in self.buffer if p.signal.sent_at <= sent_at]
            for pending in skipped:
                self.buffer.remove(pending)
        for old in skipped:
            settle(old, "ack")
        return skipped

    def discard(self, signal_id: str) -> None:
        """Settle ``signal_id`` unrun, as discarded: now if it waits here, when
        it arrives otherwise (unless a run took it already)."""
        for pending in self.buffer:
            if pending.signal.id == signal_id:
                self.buffer.remove(pending)
                settle(pending, "ack")
                self._discarded(signal_id)
                return
        if signal_id in self.inflight or signal_id in self._taken:
            return
        discarding = self._discarding
        discarding[signal_id] = None
        if len(discarding) > _TAKEN_KEPT:
            discarding.popitem(last=False)

    def _discarded(self, signal_id: str) -> None:
        self.discarded += 1
        self._on_discarded(signal_id)

    def _skipped(self, signal: Signal) -> bool:
        """Whether ``signal`` is one a request skips (sent before the requesting one)."""
        if self._skip_until is None:
            return False
        signal_id, sent_at = self._skip_until
        if signal.id == signal_id or signal.sent_at > sent_at:
            self._skip_until = None  # the requesting signal, or a newer one: back to normal
            return False
        self._on_skipped(signal)
        return True

    def carry_through(self, signal_id: str, sent_at: float) -> None:
        """Carry into the coalescing signal ``signal_id`` the signals waiting before it.

        Decided in log order, never on the senders' clocks: the run of the last
        coalescing signal to arrive receives every signal carried before it in
        ``Signal.coalesced``, oldest first, and :attr:`on_coalesced` is told of
        each then. A signal is acknowledged when it is carried (it has reached
        this inbox), not before, so one this owner had no time to read stays in
        the log for the next. When ``signal_id`` has not arrived, it comes later
        in the log than everything read so far: every signal read until it
        arrives is carried (a signal sent ``_STALE_S`` after it, by the senders'
        clocks, ends that wait; so does ``_CARRY_GRACE_S`` with nothing read,
        the newest carried signal then running with the others).
        """
        if any(s.id == signal_id for s in self._carried):
            return  # carried already: a later coalescing signal was known to come
        waiting = [p.signal.id for p in self.buffer]
        if signal_id not in waiting:
            if signal_id in self.inflight:
                return  # being handled: nothing waits before it any more
            self._coming[signal_id] = sent_at
            self._carry_waiting(len(self.buffer))
            return
        if self._coming:
            # Another coalescing signal, later in the log, is still to come.
            self._carry_waiting(waiting.index(signal_id) + 1)
            return
        self._carry_waiting(waiting.index(signal_id))
        head = self.buffer[0]
        head.signal = self._with_carried(head.signal)

    def _carry_waiting(self, count: int) -> None:
        """Carry the first ``count`` waiting signals (they precede a coalescing one)."""
        for _ in range(count):
            pending = self.buffer.popleft()
            self._carry(pending.signal)
            settle(pending, "ack")

    def _carry(self, signal: Signal) -> None:
        self._carried.extend(signal.coalesced)
        self._carried.append(replace(signal, coalesced=()))
        if self._carry_timer is not None:
            self._carry_timer.cancel()
        self._carry_timer = asyncio.get_running_loop().call_later(_CARRY_GRACE_S, self._end_carry)

    def _with_carried(self, signal: Signal) -> Signal:
        """``signal`` with the signals carried into it; each is now settled as coalesced."""
        if self._carry_timer is not None:
            self._carry_timer.cancel()
            self._carry_timer = None
        carried, self._carried = self._carried, []
        if not carried:
            return signal
        for old in carried:
            self._on_coalesced(old.id, signal.id)
        return replace(signal, coalesced=(*carried, *signal.coalesced))

    def _carried_into(self, signal: Signal) -> Signal | None:
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
        return self._with_carried(signal)

    def _end_carry(self) -> None:
        """Nothing read for a while: the requested signals are not coming (another
        owner took them); the newest carried signal runs, with the others."""
        self._carry_timer = None
        self._coming.clear()
        if not self._carried:
            return
        *older, newest = self._carried
        self._carried = older
        # Acknowledged when it was carried: a run failing on it cannot have it back.
        self.buffer.append(Pending(self._with_carried(newest)))
        self.arrived.set()

    # -- the end ---------------------------------------------------------------

    def abandon_all(self) -> None:
        """Leave every unsettled signal to the next owner (the session ends)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._carry_timer is not None:
            self._carry_timer.cancel()
            self._carry_timer = None
        if self._carried:
            # Acknowledged when read, waiting for a coalescing signal this session
            # will not read: the next owner runs that one without them.
            logger.warning(
                "thread %r: %d signal(s) carried into a coalescing signal not yet read "
                "are dropped as the session ends: %s",
                self.thread_key,
                len(self._carried),
                ", ".join(s.id for s in self._carried),
            )
            self._carried = []
        self._coming.clear()
        if self.held:
            # Acknowledged to read newer ones: gone with this session (docs/policies.md).
            logger.warning(
                "thread %r: %d debounced signal(s) acknowledged but not yet run are dropped",
                self.thread_key,
                len(self.held),
            )
            self.held.clear()
        self._next = None
        while self.buffer:
            settle(self.buffer.popleft(), "abandon")
        for pending in list(self.inflight.values()):
            settle(pending, "abandon")
