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
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from .._errors import TenureError
from .._pubsub import Event
from ._log import CLOSE_MARKER, SIGNAL_TYPE
from ._types import Signal

__all__ = ["Inbox", "Pending", "Settle", "settle"]

Settle = Literal["ack", "retry", "abandon"]


# How many ids of signals handed to a run an inbox remembers, so that a request
# about one of them is known to come too late (it follows its signal closely).
_TAKEN_KEPT = 1024


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
    """

    def __init__(
        self,
        thread_key: str,
        sid: str,
        takes: Callable[[], bool],
        lost: asyncio.Event,
        on_skipped: Callable[[Signal], None],
        on_coalesced: Callable[[str, str], None],
    ) -> None:
        self.thread_key = thread_key
        self._sid = sid
        self._takes = takes
        self._lost = lost
        self._on_skipped = on_skipped
        self._on_coalesced = on_coalesced
        self.buffer: deque[Pending] = deque()
        self.inflight: dict[str, Pending] = {}
        self.arrived = asyncio.Event()
        self.marker_seq = 0
        self.marker_seen = asyncio.Event()
        # Set by a request whose signal has not arrived yet: (its id, its send time).
        self._skip_until: tuple[str, float] | None = None
        self._taken: OrderedDict[str, None] = OrderedDict()
        # Set by a coalescing request whose signal has not arrived yet: (its id,
        # its send time); and the signals carried into it meanwhile, in order.
        self._carry_until: tuple[str, float] | None = None
        self._carried: list[Signal] = []
        # Ids already told to on_coalesced before they arrived.
        self._announced: set[str] = set()
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
        signal = self._carried_into(arrived)
        if signal is None:
            return  # settled as coalesced into a newer signal
        pending = self.inflight.get(signal.id)
        if pending is None:
            pending = Pending(signal)
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

    async def next(self, idle_timeout: float) -> Pending | None:
        """The next signal, or ``None`` once none came for ``idle_timeout`` s or the lease is lost."""
        if not self.buffer:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + idle_timeout
            while not self.buffer:
                if self._lost.is_set() or loop.time() >= deadline:
                    return None
                await self.wait(deadline)
        if self._lost.is_set():
            return None
        pending = self.buffer.popleft()
        taken = self._taken
        taken[pending.signal.id] = None
        if len(taken) > _TAKEN_KEPT:
            taken.popitem(last=False)
        return pending

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
        """Settle as coalesced into ``signal_id`` the signals waiting before it.

        The run of ``signal_id`` receives them in ``Signal.coalesced``, oldest
        first; each is acknowledged when it reaches this inbox, not before, so
        a signal this owner had no time to read stays in the log for the next.
        :attr:`on_coalesced` is told of each as soon as it is known to be
        replaced: a signal waiting here, or one whose request named it (it is
        read one at a time behind the active run's). As in
        :meth:`skip_through`, when ``signal_id`` has not arrived the signals
        sent no later than ``sent_at`` are carried as they arrive; of several
        requests, the one of the newest signal is the one that runs.
        """
        target = self._carry_until
        if target is not None and target[0] != signal_id and target[1] > sent_at:
            self._announce(signal_id, target[0])  # an older request: carried into the newer
            return
        waiting = [p.signal.id for p in self.buffer]
        if signal_id in waiting:
            older = [self.buffer.popleft() for _ in range(waiting.index(signal_id))]
            self._carry_until = None
        else:
            if target is not None and target[0] != signal_id:
                self._announce(target[0], signal_id)
            self._carry_until = (signal_id, sent_at)
            older = [p for p in self.buffer if p.signal.sent_at <= sent_at]
            for pending in older:
                self.buffer.remove(pending)
        for pending in older:
            self._carry(pending.signal, signal_id)
            settle(pending, "ack")
        if signal_id in waiting:
            head = self.buffer[0]
            head.signal = self._with_carried(head.signal)

    def _announce(self, signal_id: str, into: str) -> None:
        """``signal_id``, not read yet, will be carried into ``into``: say so now."""
        if signal_id in self._announced or any(s.id == signal_id for s in self._carried):
            return
        if len(self._announced) >= _TAKEN_KEPT:
            self._announced.clear()
        self._announced.add(signal_id)
        self._on_coalesced(signal_id, into)

    def _carry(self, signal: Signal, into: str) -> None:
        self._carried.extend(signal.coalesced)
        self._carried.append(replace(signal, coalesced=()))
        if signal.id in self._announced:
            self._announced.discard(signal.id)
        else:
            self._on_coalesced(signal.id, into)

    def _with_carried(self, signal: Signal) -> Signal:
        carried, self._carried = self._carried, []
        return replace(signal, coalesced=(*carried, *signal.coalesced)) if carried else signal

    def _carried_into(self, signal: Signal) -> Signal | None:
        """``signal`` as a run should see it under a coalescing request, or
        ``None`` when it is carried into the requesting signal."""
        if self._carry_until is None:
            return signal
        signal_id, sent_at = self._carry_until
        if signal.id == signal_id or signal.sent_at > sent_at:
            self._carry_until = None
            return self._with_carried(signal)
        self._carry(signal, signal_id)
        return None

    # -- the end ---------------------------------------------------------------

    def abandon_all(self) -> None:
        """Leave every unsettled signal to the next owner (the session ends)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self.buffer:
            settle(self.buffer.popleft(), "abandon")
        for pending in list(self.inflight.values()):
            settle(pending, "abandon")
