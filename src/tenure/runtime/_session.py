"""A thread's session in this process: its lease, its subscription and its runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from .. import telemetry
from .._contract import Capability, capabilities_of
from .._errors import LeaseLost, TenureError
from .._pubsub import Event, LeaseFence
from .._renewer import Renewer
from ._types import EventKind, Signal

if TYPE_CHECKING:
    from ._runtime import ThreadRuntime

__all__ = [
    "CLOSE_MARKER",
    "GROUP",
    "INTERRUPT",
    "SIGNAL_TYPE",
    "Session",
    "ThreadRun",
    "run_of",
]

logger = logging.getLogger("tenure.runtime")

SIGNAL_TYPE = "tenure.signal"
CLOSE_MARKER = "tenure.runtime.close"
INTERRUPT = "tenure.runtime.interrupt"
GROUP = "tenure.runtime"


class _Refused(TenureError):
    """Raised from a subscription callback so the backend keeps the event for later."""


# How a delivered signal is settled with the backend. "ack": handled, the callback
# returns. "retry": the handler failed on it, the callback raises so the backend
# delivers it again (a bounded number of times). "abandon": this session stops
# (lease lost, runtime closing); the callback blocks until ``unsubscribe`` cancels
# it, which leaves the event unacknowledged for the next owner without spending
# one of its attempts (backends retry a raising callback at once and drop the
# event after ``max_attempts``, so raising here could lose it).
Settle = Literal["ack", "retry", "abandon"]
# How a run ended, as the "run_end" event's detail and the run's span say: its
# handler returned ("ok") or raised ("failed"), or it was cancelled because the
# lease was lost ("lost"), by a newer signal ("interrupted") or by the runtime's
# aclose() ("cancelled").
RunEnd = Literal["ok", "failed", "lost", "interrupted", "cancelled"]


@dataclass(eq=False, slots=True)
class _Pending:
    signal: Signal
    how: Settle | None = None  # set once, by _settle
    # The subscription callbacks waiting for ``how`` (a redelivery may add one).
    # A future each, not one shared: cancelling a callback must leave the signal
    # unsettled, and a shared future under asyncio.shield costs a loop turn more.
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


def _settle(pending: _Pending, how: Settle) -> None:
    if pending.how is None:
        pending.how = how
        for waiter in pending.waiters:
            if not waiter.done():
                waiter.set_result(None)


async def _block_until_cancelled() -> None:
    await asyncio.get_running_loop().create_future()


def _ended_as(task: asyncio.Task[RunEnd]) -> RunEnd:
    """How a run whose task is done ended, as its span says (see ``_call_handler``)."""
    if task.cancelled():
        return "cancelled"
    return "failed" if task.exception() is not None else task.result()


def run_of(owner: str | None) -> str | None:
    return None if owner is None else owner.rpartition("/")[2]


class ThreadRun:
    """One run of the handler for one thread, holding the thread's lease.

    ``token`` is the lease's fencing token for this run (``None`` on a backend
    without tokens); hand it to stores that reject stale writers. ``lost`` is
    set when the lease is lost; by default the handler is then cancelled.
    """

    __slots__ = (
        "_current",
        "_ended",
        "_owner",
        "_session",
        "_taken",
        "interrupted",
        "process_id",
        "run_id",
        "thread_key",
        "token",
    )

    def __init__(self, session: Session, run_id: str, token: int | None) -> None:
        self._session = session
        self._owner = session.owner  # the lease's owner while this run holds it
        self.thread_key = session.thread_key
        self.run_id = run_id
        self.token = token
        self.process_id = session.rt.process_id
        self._current: _Pending | None = None
        self._ended = False
        self._taken = 0
        #: Set when a newer signal interrupted this run (the ``interrupt`` policy).
        self.interrupted = False

    def __repr__(self) -> str:
        return (
            f"ThreadRun(thread_key={self.thread_key!r}, run_id={self.run_id!r}, token={self.token})"
        )

    @property
    def lost(self) -> asyncio.Event:
        return self._session.lost

    def ensure_held(self) -> None:
        """Raise :class:`~tenure.LeaseLost` unless this run's lease is held (call it before acting).

        Like :meth:`tenure.HeldLease.ensure_held` (the same renewer decides): it
        raises once the renew deadline has passed without a successful renewal,
        judged on the clock here, so also right after the process was paused or
        while a renew call hangs. Like it too, it raises once the lease is no
        longer this run's although it was not lost: handed over to the thread's
        next run, or released when the session ended (a ``ThreadRun`` kept after
        its handler returned).
        """
        session = self._session
        key = session.lease_key
        if session.owner != self._owner:
            raise LeaseLost(key, self._owner, f"it was handed over to run {session.run_id}")
        if not session.renewer.check() or session.lost.is_set():
            raise LeaseLost(key, self._owner, session.lost_reason or "lost")
        if session.renewer.finished:
            raise LeaseLost(key, self._owner, "it was released")

    def emit(self, kind: EventKind, signal_id: str | None, detail: str | None = None) -> None:
        self._session.rt.emit(
            kind,
            self.thread_key,
            run_id=self.run_id,
            token=self.token,
            signal_id=signal_id,
            detail=detail,
        )

    def _ack_current(self) -> None:
        if self._current is not None:
            _settle(self._current, "ack")
            self._current = None

    async def signals(self) -> AsyncIterator[Signal]:
        """The thread's signals, in order, until none arrives for ``idle_timeout``.

        Taking the next signal acknowledges the previous one; the last one is
        acknowledged when the handler returns normally. The iteration also ends
        when the lease is lost.
        """
        session = self._session
        while not self._ended:
            self._ack_current()
            pending = await session.next_signal()
            if pending is None:
                return
            self._current = pending
            self._taken += 1
            self.emit("signal", pending.signal.id)
            yield pending.signal


class Session:
    """This process's tenure of one thread: the lease, the subscription and its runs."""

    def __init__(
        self,
        rt: ThreadRuntime,
        thread_key: str,
        sid: str,
        owner: str,
        token: int | None,
        sent_at: float,
    ) -> None:
        self.rt = rt
        self.thread_key = thread_key
        self.lease_key = self.topic = rt.names.name(thread_key)
        self.sid = sid
        self.owner = owner
        self.run_id = run_of(owner) or owner
        self.token = token
        self.taken_at = time.monotonic()  # when this process took the thread over
        self.runs = 0
        self.buffer: deque[_Pending] = deque()
        self.inflight: dict[str, _Pending] = {}
        self.arrived = asyncio.Event()
        # The idle timer of the run's waits, and the deadline of the wait under way
        # (the loop's clock); see _wait_arrival.
        self._timer: asyncio.TimerHandle | None = None
        self._wake_at = 0.0
        self._waiting = False
        # The lease is kept by the same component as tenure.hold's: one view of
        # when it counts as lost (per-call time limit, deadline from the send).
        self.renewer = Renewer(
            rt.provider,
            self.lease_key,
            owner,
            rt.ttl_ms,
            sent_at=sent_at,
            every=rt.renew_every_ms / 1000,
            deadline=rt.renew_deadline_ms / 1000,
            on_lost=self._lose,
        )
        self.lost = self.renewer.lost
        self.lost_reason = ""
        self.marker_seq = 0
        self.marker_seen = asyncio.Event()
        self.closing = False
        self.done = False
        self.stopping = False  # stop() came (aclose): a session still opening never runs
        self.ended = asyncio.Event()  # set by the runtime's session_ended
        self.late_send = False
        self.run_task: asyncio.Task[RunEnd] | None = None
        self.run: ThreadRun | None = None
        self.main_task: asyncio.Task[None] | None = None
        self.subscribed = False
        self.control = rt.names.control(thread_key) if rt.policy == "interrupt" else None
        # Set by an interrupt whose signal has not arrived yet: (its id, its send time).
        self.skip_until: tuple[str, float] | None = None
        self.control_subscribed = False
        # The event still to emit when the first run starts (a watcher's "takeover"),
        # and its detail: the run id of the owner the sweep last saw hold the thread.
        self.announce: EventKind | None = None
        self.previous: str | None = None

    # -- the subscription callback ------------------------------------------

    async def on_event(self, event: Event) -> None:
        if event.type == CLOSE_MARKER:
            data = event.data if isinstance(event.data, dict) else {}
            if data.get("session") == self.sid and data.get("seq") == self.marker_seq:
                self.marker_seen.set()
            return
        if event.type != SIGNAL_TYPE:
            return
        if self.done or not self.renewer.check():
            # Not ours to run: a lost session (checked on the clock, so also right
            # after a pause) holds it until it unsubscribes and hands it back.
            await _block_until_cancelled()
        data = event.data
        signal = Signal(
            id=event.id or "",
            thread_key=data["thread"],
            payload=data["payload"],
            sent_at=event.created_at or 0.0,
            attempt=event.attempt,
        )
        if self._skipped(signal):
            return  # acknowledged unhandled: an interrupt came after it
        pending = self.inflight.get(signal.id)
        if pending is None:
            pending = _Pending(signal)
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

    async def next_signal(self) -> _Pending | None:
        if not self.buffer:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.rt.idle_timeout
            while not self.buffer:
                if self.lost.is_set() or loop.time() >= deadline:
                    return None
                await self._wait_arrival(deadline)
        if self.lost.is_set():
            return None
        return self.buffer.popleft()

    async def _wait_arrival(self, deadline: float) -> None:
        """Wait until a signal is buffered, the lease is lost or the loop's clock
        reaches ``deadline``; callers look again (a wake-up can be early).

        A loss sets ``arrived`` too (``_lose``): one event to wait on. The
        deadline is kept by one timer per session, moved only when it fires
        before the deadline of the wait under way: a run that waits for each
        of its signals sets no timer of its own per signal.
        """
        self.arrived.clear()
        if self.buffer or self.lost.is_set():
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

    # -- lifecycle ----------------------------------------------------------

    async def open(self) -> None:
        """Subscribe; then, if the lease was taken as "opening", announce the session open.

        On failure the lease is released and the error raised.
        """
        rt = self.rt
        try:
            # We hold the lease, so whoever read this thread's signals before us is
            # gone or has lost it: what it took and never acknowledged comes back
            # now, ahead of newer signals, not after a redelivery timeout.
            reclaimed = await rt.log.reclaim(self.topic, GROUP)
            if reclaimed:
                logger.info(
                    "session %s of %r took back %d unfinished signal(s) of a previous owner",
                    self.sid,
                    self.thread_key,
                    reclaimed,
                )
            await rt.log.subscribe(self.topic, self.on_event, group=GROUP, **self._fence())
            self.subscribed = True
            if self.control is not None:
                await rt.log.subscribe(self.control, self.on_control)
                self.control_subscribed = True
            if self.owner.endswith(".0"):
                opened = f"{self.owner[:-2]}.1"
                async with self.renewer.paused():
                    sent = time.monotonic()
                    if not self.renewer.check() or not await rt.provider.transfer_lease(
                        self.lease_key, self.owner, opened, rt.ttl_ms
                    ):
                        raise LeaseLost(self.lease_key, self.owner, "expired while opening")
                    self._moved(opened, sent)
                    self.token = await rt.read_token(self.lease_key, opened)
        except BaseException as exc:
            self.done = True
            with contextlib.suppress(TenureError):
                if self.control_subscribed and self.control is not None:
                    await rt.log.unsubscribe(self.control, self.on_control)
                if self.subscribed:
                    await rt.log.unsubscribe(self.topic, self.on_event)
                await self.renewer.stop(final=True)
                await rt.provider.release_lease(self.lease_key, self.owner)
            if self.subscribed and not self.lost.is_set():
                # What the subscription read went back to the group, maybe after the
                # next owner looked: count it as lost so a newer session is watched for.
                self.lost_reason = f"failed while opening: {exc!r}"
                self.lost.set()
            rt.session_ended(self)
            raise

    def _fence(self) -> dict[str, LeaseFence]:
        """Where the log keeps the leases too: read only while this session holds
        the thread's lease (whichever run), so a stale session of this process
        cannot take what the next owner reclaimed (``Capability.FENCED_TAKES``)."""
        rt = self.rt
        if rt.log is not rt.provider or Capability.FENCED_TAKES not in capabilities_of(rt.log):
            return {}
        return {"fence": LeaseFence(self.lease_key, f"{rt.process_id}/{self.sid}.")}

    def start(self) -> None:
        self.renewer.start()
        self.main_task = asyncio.get_running_loop().create_task(
            self._main(), name=f"tenure-session-{self.sid}"
        )

    def _moved(self, owner: str, sent_at: float) -> None:
        """The lease now belongs to ``owner`` (a transfer sent at ``sent_at`` succeeded)."""
        self.owner = owner
        self.run_id = run_of(owner) or owner
        self.renewer.moved(owner, sent_at)

    async def _main(self) -> None:
        rt = self.rt
        try:
            if not self.buffer:
                await self._wait_arrival(asyncio.get_running_loop().time() + rt.idle_timeout)
            while not self.lost.is_set():
                if not self.buffer and await self._close_handshake():
                    # Decided: from here on, late deliveries are left for the next owner.
                    self.done = True
                    break
                if self.lost.is_set():
                    break
                if self.runs and not await self._handover():
                    break
                await self._run_once()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("session %s of thread %r failed", self.sid, self.thread_key)
        finally:
            await self.cleanup()

    async def _close_handshake(self) -> bool:
        """Publish a close marker and read up to it; ``True`` when nothing came before it."""
        self.closing = True
        self.late_send = False
        self.marker_seq += 1
        self.marker_seen.clear()
        # The publish shares the marker's time limit: a log that stopped answering
        # must not keep the thread's lease (renewed on the lease provider's own
        # connection) until the driver's socket timeout. Whether the marker went
        # out is then unknown; closing is safe either way, because unsubscribing
        # hands whatever came before it back to the group.
        try:
            await asyncio.wait_for(
                self.rt.log.publish(
                    self.topic,
                    Event(type=CLOSE_MARKER, data={"session": self.sid, "seq": self.marker_seq}),
                ),
                self.rt.marker_timeout,
            )
        except TimeoutError:
            logger.warning(
                "publishing the close marker of session %s on %r took over %.1f s; closing",
                self.sid,
                self.thread_key,
                self.rt.marker_timeout,
            )
            return True
        waiters = [
            asyncio.ensure_future(self.marker_seen.wait()),
            asyncio.ensure_future(self.arrived.wait()),
            asyncio.ensure_future(self.lost.wait()),
        ]
        self.arrived.clear()
        try:
            if not self.buffer:
                done, _ = await asyncio.wait(
                    waiters, timeout=self.rt.marker_timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    logger.warning(
                        "close marker of session %s on %r not read back within %.1f s; closing",
                        self.sid,
                        self.thread_key,
                        self.rt.marker_timeout,
                    )
        finally:
            for w in waiters:
                w.cancel()
        if self.buffer and not self.lost.is_set():
            self.closing = False
            return False
        return True

    async def on_control(self, event: Event) -> None:
        """A sender asks for an interrupt (the ``interrupt`` policy; a fan-out subscription)."""
        data = event.data if isinstance(event.data, dict) else {}
        signal_id, sent_at = data.get("signal"), data.get("sent_at")
        if isinstance(signal_id, str) and isinstance(sent_at, int | float):
            self.interrupt(signal_id, float(sent_at))

    def interrupt(self, signal_id: str, sent_at: float) -> None:
        """Stop the active run for the newer signal ``signal_id`` (sent at ``sent_at``).

        The run is cancelled (``run.interrupted`` is set first); the signal it was
        handling and the ones sent before ``signal_id`` that have not run yet are
        acknowledged unhandled, so the next run starts with ``signal_id``.
        """
        run, task = self.run, self.run_task
        if run is None or task is None or task.done() or run.interrupted:
            return
        current = run._current
        if current is not None and current.signal.id == signal_id:
            return  # already the one being handled
        if signal_id not in self.inflight:
            self.skip_until = (signal_id, sent_at)
        run.interrupted = True
        # What waits here was sent before the interrupting signal (log order).
        waiting = [p.signal.id for p in self.buffer]
        cut = waiting.index(signal_id) if signal_id in waiting else len(waiting)
        skipped = [self.buffer.popleft() for _ in range(cut)]
        for old in skipped:
            _settle(old, "ack")
        run.emit("interrupted", signal_id, f"{len(skipped)} waiting signal(s) skipped")
        task.cancel(f"interrupted by signal {signal_id}")

    def _skipped(self, signal: Signal) -> bool:
        """Whether ``signal`` is one an interrupt skips (sent before the interrupting one)."""
        if self.skip_until is None:
            return False
        signal_id, sent_at = self.skip_until
        if signal.id == signal_id or signal.sent_at > sent_at:
            self.skip_until = None  # the interrupting signal, or a newer one: back to normal
            return False
        self.rt.emit(
            "interrupted",
            self.thread_key,
            run_id=self.run_id,
            signal_id=signal.id,
            detail="skipped",
        )
        return True

    async def _run_once(self) -> None:
        rt = self.rt
        self.runs += 1
        if self.announce is not None:
            # A sweeper's session shows up only once it has something to run.
            kind, previous, self.announce = self.announce, self.previous, None
            rt.emit(kind, self.thread_key, run_id=self.run_id, token=self.token, detail=previous)
        run = ThreadRun(self, self.run_id, self.token)
        task = asyncio.get_running_loop().create_task(
            self._call_handler(run), name=f"tenure-run-{self.run_id}"
        )
        self.run, self.run_task = run, task
        end: RunEnd = "failed"
        stopped = False  # the session is being stopped (aclose): no failure of the signal
        try:
            end = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            if not self.lost.is_set():
                stopped = True
                end = _ended_as(task)
                raise
            end = "lost"
        finally:
            self.run, self.run_task = None, None
            run._ended = True
            if run._current is not None:
                how: Settle = "retry"
                if self.lost.is_set() or end == "lost" or stopped:
                    how = "abandon"
                elif end in ("ok", "interrupted"):
                    how = "ack"
                _settle(run._current, how)
                run._current = None
            elif (
                not run._taken
                and self.buffer
                and not self.lost.is_set()
                and end != "interrupted"
                and not stopped
            ):
                # A handler that returns without reading would be run again and again
                # for the same signal: count it as a failed delivery instead, so the
                # backend's attempt limit ends the loop.
                logger.warning(
                    "run %s of thread %r returned without reading its signals",
                    run.run_id,
                    self.thread_key,
                )
                _settle(self.buffer.popleft(), "retry")
            rt.emit("run_end", self.thread_key, run_id=run.run_id, token=run.token, detail=end)

    async def _call_handler(self, run: ThreadRun) -> RunEnd:
        attributes: dict[str, str | int] = {"tenure.thread": run.thread_key}
        attributes["tenure.run_id"] = run.run_id
        if run.token is not None:
            attributes["tenure.token"] = run.token
        with telemetry.span("tenure run", attributes) as span:
            end: RunEnd = "cancelled"  # unless the handler's end is known
            try:
                end = await self._handle(run)
                return end
            finally:
                span.set_attribute("tenure.run.end", end)

    async def _handle(self, run: ThreadRun) -> RunEnd:
        try:
            await self.rt.handler(run)
        except asyncio.CancelledError:
            if self.lost.is_set():
                return "lost"
            if run.interrupted:
                return "interrupted"
            raise
        except Exception:
            logger.exception("handler of run %s (thread %r) raised", run.run_id, run.thread_key)
            return "failed"
        return "ok"

    async def _handover(self) -> bool:
        rt = self.rt
        previous = self.run_id
        run_id = f"{self.sid}.{self.runs + 1}"
        new_owner = f"{rt.process_id}/{run_id}"
        async with self.renewer.paused():
            if not self.renewer.check():
                return False
            sent = time.monotonic()
            try:
                ok = await rt.provider.transfer_lease(
                    self.lease_key, self.owner, new_owner, rt.ttl_ms
                )
            except TenureError as exc:
                # The outcome is unknown: the transfer may have been applied.
                logger.warning("transfer of %r failed: %s", self.lease_key, exc)
                ok = False
            if not ok:
                try:
                    ok = await rt.provider.get_lease_owner(self.lease_key) == new_owner
                except TenureError:
                    ok = False
            if not ok:
                self.renewer.lose("the lease was no longer held at hand-over")
                return False
            self._moved(new_owner, sent)
            self.token = await rt.read_token(self.lease_key, new_owner)
        rt.emit("handover", self.thread_key, run_id=run_id, token=self.token, detail=previous)
        return True

    def _lose(self, reason: str) -> None:
        """The renewer declared the lease lost: tell the run and stop it."""
        self.lost_reason = reason
        self.arrived.set()  # wakes a run waiting for its next signal (_wait_arrival)
        logger.warning(
            "run %s of thread %r lost its lease: %s", self.run_id, self.thread_key, reason
        )
        self.rt.emit("lost", self.thread_key, run_id=self.run_id, token=self.token, detail=reason)
        task = self.run_task
        if self.rt.cancel_on_loss and task is not None and task is not asyncio.current_task():
            task.cancel()

    async def cleanup(self) -> None:
        rt = self.rt
        self.done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self.buffer:
            _settle(self.buffer.popleft(), "abandon")
        for pending in list(self.inflight.values()):
            _settle(pending, "abandon")
        if self.control_subscribed and self.control is not None:
            await rt.unsubscribe(self.control, self.on_control, self.thread_key)
        if self.subscribed:
            # The backend hands the signals this session had not acknowledged back to
            # the group here; the lease is still held (and renewed) meanwhile, so the
            # next session, which subscribes after our release, finds them at once.
            await rt.unsubscribe(self.topic, self.on_event, self.thread_key)
        # Renewals went on while unsubscribing: unfinished signals must be back in
        # the group before anyone else can own the thread.
        lost = self.lost.is_set()
        await self.renewer.stop(final=True)
        released = False
        try:
            await rt.provider.release_lease(self.lease_key, self.owner)
            released = not lost
        except TenureError as exc:
            logger.warning("releasing %r failed: %s", self.lease_key, exc)
        if released and self.announce is None:
            rt.emit("release", self.thread_key, run_id=self.run_id, token=self.token)
        rt.session_ended(self)

    async def stop(self) -> None:
        self.stopping = True
        task = self.main_task
        if task is None:
            # Still opening: whoever opens it sees ``stopping`` and ends it without
            # a run. Wait for that, within the unsubscribe timeout (a hung backend);
            # should the opening outlast it, the session still ends without a run.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ended.wait(), self.rt.unsubscribe_timeout)
        elif not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
