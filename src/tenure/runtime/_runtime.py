"""The thread runtime: one run per conversation thread across processes (CONTRACT section 8).

Design
------
*Every signal is durable before* :meth:`ThreadRuntime.send_signal` *returns.* It is
published to the thread's own topic (``"<namespace>:<thread key>"``) and read only
through the consumer group ``tenure.runtime`` of that topic. Only the process that
holds the thread's lease (key ``"<namespace>:<thread key>"``) subscribes to it, so
the thread's signals are read in log order by one consumer: per-thread order is
the log's order.

*A sender never forwards a payload to another process.* After publishing, it
tries to acquire the thread's lease. If it wins it opens a *session* (lease +
subscription) and the outcome is ``"wake"``; if another owner holds the lease the
outcome is ``"deliver"``: the owner reads the signal from the log. Nothing is held
in a process that could die with it.

*The first signal of a thread.* The durable backends create a consumer group at
the log's current end (SQLite does not even store events of a topic without a
group), so a signal published before the thread's group exists would never be
read. A session of a thread whose group this process has not seen yet therefore
takes the lease as ``"<process id>/<session>.0"`` (*opening*), subscribes (which
creates the group), and only then moves the lease to ``".1"`` with
``transfer_lease``. A sender that has not seen the group either acquires first
and publishes after its own session is open, or, losing to an owner that is
still opening, waits until it is open. Once the group is known (it is durable),
senders publish first and acquire second, so delivery never waits for the lease
round trip.

*A signal is acknowledged only once it has been handled*: when the handler asks
for the next signal or its run returns normally. A crash, a lost lease or a
handler that raises leaves it unacknowledged, and the backend delivers it again
(``attempt`` + 1) to the next owner: delivery is at-least-once and
:attr:`Signal.id` lets a handler de-duplicate.

*Runs and hand-over.* A session starts a run (calls the handler) when a signal
arrives, renews its lease every ``renew_every_ms`` (default a third of the TTL)
under the owner name ``"<process id>/<run id>"``, and when a run returns while
signals are waiting it moves the lease to the next run with ``transfer_lease``:
the key is never free in between and the fencing token increases.

*Closing without losing a signal.* A session whose thread is idle publishes a
*close marker* to the thread's own topic and keeps reading until it reads the
marker back: every signal published before the marker reaches this session and
starts a new run (hand-over) instead of being stranded. Only then does it
unsubscribe and release, renewing the lease until the unsubscribe is done: a
signal delivered to it after the marker is not run by it, and the backend's
``unsubscribe`` hands it back to the group (SQLite, Redis and memory do so at
once), so the next session, which can only start after the release, reads it
when it subscribes. A signal published after the marker but whose sender
lost the acquire race against the still-held lease is covered by the sender:
a sender whose outcome is ``"deliver"`` *watches* the thread (one watcher per
thread per process) until a session that started after its publish exists. It
polls every ``watch_interval`` (default: the renew interval, at most 1 s) and
takes the lease itself when it is free, so a thread is adopted within
TTL + renew interval after its owner dies (SIGKILL), starting with the signals
the dead owner never acknowledged.

*Losing the lease.* When a renewal is refused, or fails until less than one
renew interval would be left, the run is told (``run.lost`` is set, a
``"lost"`` event is emitted) and, by default, its handler task is cancelled.
Unacknowledged signals go back to the log for the next owner. As the next
owner may have subscribed before they went back, the process that lost the
lease then watches the thread until a session that started after that exists
(the same when an ``unsubscribe`` outlived ``unsubscribe_timeout``: once it
finishes).

*Backend settings.* Signals a dead or paused owner never acknowledged come back
only when the backend redelivers them: after SQLite's ``visibility_timeout`` or
Redis's ``claim_idle_ms`` (both 30 s by default). Set them at or below the lease
TTL for a takeover to start with those signals within TTL + renew interval. A
backend ``unsubscribe`` that hangs is waited for at most ``unsubscribe_timeout``
seconds before the session releases its lease anyway. A backend whose
``unsubscribe`` leaves the signals a member had not acknowledged with that
member (instead of handing them back to the group) delays them by its
redelivery timeout as well.

*Backends.* On a durable backend (SQLite, Redis Streams, or any ``PubSub`` whose
groups redeliver what a dead consumer never acknowledged) this works across
processes. On :class:`~tenure.MemoryPubSub`, or on any backend without leases
(:class:`~tenure.NoopLeaseProvider`, announced with a WARNING), signals are kept
in a process-local log instead (:mod:`tenure.runtime._log`) and the runtime is
correct within one process only.

Known limits: a signal whose sender process dies between publishing it and a
session reading it, while no other process watches the thread, waits in the log
until the next signal to that thread; after a crash, signals the dead owner had
read but not acknowledged may come back after newer ones (the backend's reclaim
decides when); a backend that loses its groups
(a Redis restart without persistence) loses the signals published before a
session recreates them; the handler of a signal it fails on (raises) gets it
again at most the backend's ``max_attempts`` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self, cast

from .._contract import Backend, Capability, LeaseProvider, capabilities_of
from .._detect import NoopLeaseProvider, is_lease_provider, lease_provider_for
from .._errors import (
    BackendClosed,
    ConfigurationError,
    InvalidArgument,
    LeaseLost,
    TenureError,
)
from .._pubsub import Event
from .._renewer import Renewer
from .._validate import MAX_NAME_BYTES, check_name, check_timeout, check_ttl
from ._log import LocalLog, local_log_for
from ._types import EventKind, OnEvent, RuntimeEvent, SendResult, Signal

__all__ = ["CLOSE_MARKER", "GROUP", "SIGNAL_TYPE", "ThreadRun", "ThreadRuntime"]

logger = logging.getLogger("tenure.runtime")

SIGNAL_TYPE = "tenure.signal"
CLOSE_MARKER = "tenure.runtime.close"
GROUP = "tenure.runtime"
_KNOWN_TOPICS = 100_000

Handler = Callable[["ThreadRun"], Awaitable[None]]


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


@dataclass(eq=False, slots=True)
class _Pending:
    signal: Signal
    done: asyncio.Future[Settle]


def _settle(pending: _Pending, how: Settle) -> None:
    if not pending.done.done():
        pending.done.set_result(how)


async def _block_until_cancelled() -> None:
    await asyncio.get_running_loop().create_future()


def _session_of(owner: str | None) -> str | None:
    """The session part of an owner name ``"<process>/<session>.<n>"``."""
    if owner is None:
        return None
    return owner.rpartition(".")[0] or owner


def _run_of(owner: str | None) -> str | None:
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
        "_session",
        "_taken",
        "process_id",
        "run_id",
        "thread_key",
        "token",
    )

    def __init__(self, session: _Session, run_id: str, token: int | None) -> None:
        self._session = session
        self.thread_key = session.thread_key
        self.run_id = run_id
        self.token = token
        self.process_id = session.rt.process_id
        self._current: _Pending | None = None
        self._ended = False
        self._taken = 0

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
        while a renew call hangs.
        """
        session = self._session
        if not session.renewer.check() or session.lost.is_set():
            raise LeaseLost(session.lease_key, session.owner, session.lost_reason or "lost")

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
            session.rt.emit(
                "signal",
                self.thread_key,
                run_id=self.run_id,
                token=self.token,
                signal_id=pending.signal.id,
            )
            yield pending.signal


class _Session:
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
        self.lease_key = rt.lease_key(thread_key)
        self.topic = rt.topic(thread_key)
        self.sid = sid
        self.owner = owner
        self.run_id = _run_of(owner) or owner
        self.token = token
        self.runs = 0
        self.buffer: deque[_Pending] = deque()
        self.inflight: dict[str, _Pending] = {}
        self.arrived = asyncio.Event()
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
        self.late_send = False
        self.run_task: asyncio.Task[bool] | None = None
        self.main_task: asyncio.Task[None] | None = None
        self.subscribed = False
        # The event still to emit when the first run starts (a watcher's "takeover").
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
        if self.done or self.lost.is_set():
            await _block_until_cancelled()
        data = event.data
        signal = Signal(
            id=event.id or "",
            thread_key=data["thread"],
            payload=data["payload"],
            sent_at=event.created_at or 0.0,
            attempt=event.attempt,
        )
        pending = self.inflight.get(signal.id)
        if pending is None:
            pending = _Pending(signal, asyncio.get_running_loop().create_future())
            self.inflight[signal.id] = pending
            self.buffer.append(pending)
            self.arrived.set()
        # else: delivered again while we still hold it (a backend reclaiming an idle
        # entry); settle it like the first copy, once that one is handled.
        try:
            how = await asyncio.shield(pending.done)
        finally:
            if pending.done.done() and self.inflight.get(signal.id) is pending:
                del self.inflight[signal.id]
        if how == "retry":
            raise _Refused(
                f"the handler of thread {self.thread_key!r} failed on signal {signal.id}"
            )
        if how == "abandon":
            await _block_until_cancelled()

    # -- what runs read -----------------------------------------------------

    async def next_signal(self) -> _Pending | None:
        deadline = time.monotonic() + self.rt.idle_timeout
        while not self.buffer:
            if self.lost.is_set():
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await self._wait_arrival(remaining):
                return None
        if self.lost.is_set():
            return None
        return self.buffer.popleft()

    async def _wait_arrival(self, timeout: float) -> bool:
        """Wait until a signal is buffered or the lease is lost; ``False`` on timeout."""
        self.arrived.clear()
        if self.buffer:
            return True
        waiters = [
            asyncio.ensure_future(self.arrived.wait()),
            asyncio.ensure_future(self.lost.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        return bool(self.buffer) or self.lost.is_set()

    # -- lifecycle ----------------------------------------------------------

    async def open(self) -> None:
        """Subscribe; then, if the lease was taken as "opening", announce the session open.

        On failure the lease is released and the error raised.
        """
        rt = self.rt
        try:
            await rt.log.subscribe(self.topic, self.on_event, group=GROUP)
            self.subscribed = True
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

    def start(self) -> None:
        self.renewer.start()
        self.main_task = asyncio.get_running_loop().create_task(
            self._main(), name=f"tenure-session-{self.sid}"
        )

    def _moved(self, owner: str, sent_at: float) -> None:
        """The lease now belongs to ``owner`` (a transfer sent at ``sent_at`` succeeded)."""
        self.owner = owner
        self.run_id = _run_of(owner) or owner
        self.renewer.moved(owner, sent_at)

    async def _main(self) -> None:
        rt = self.rt
        try:
            if not self.buffer:
                await self._wait_arrival(rt.idle_timeout)
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
            await self._cleanup()

    async def _close_handshake(self) -> bool:
        """Publish a close marker and read up to it; ``True`` when nothing came before it."""
        self.closing = True
        self.late_send = False
        self.marker_seq += 1
        self.marker_seen.clear()
        await self.rt.log.publish(
            self.topic,
            Event(type=CLOSE_MARKER, data={"session": self.sid, "seq": self.marker_seq}),
        )
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

    async def _run_once(self) -> None:
        rt = self.rt
        self.runs += 1
        if self.announce is not None:
            # A watcher's session shows up only once it has something to run.
            kind, previous, self.announce = self.announce, self.previous, None
            rt.emit(kind, self.thread_key, run_id=self.run_id, token=self.token, detail=previous)
        run = ThreadRun(self, self.run_id, self.token)
        task = asyncio.get_running_loop().create_task(
            self._call_handler(run), name=f"tenure-run-{self.run_id}"
        )
        self.run_task = task
        ok = False
        try:
            ok = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            if not self.lost.is_set():
                raise
        finally:
            self.run_task = None
            run._ended = True
            if run._current is not None:
                if self.lost.is_set():
                    _settle(run._current, "abandon")
                else:
                    _settle(run._current, "ack" if ok else "retry")
                run._current = None
            elif not run._taken and self.buffer and not self.lost.is_set():
                # A handler that returns without reading would be run again and again
                # for the same signal: count it as a failed delivery instead, so the
                # backend's attempt limit ends the loop.
                logger.warning(
                    "run %s of thread %r returned without reading its signals",
                    run.run_id,
                    self.thread_key,
                )
                _settle(self.buffer.popleft(), "retry")
            rt.emit(
                "run_end",
                self.thread_key,
                run_id=run.run_id,
                token=run.token,
                detail="ok" if ok else ("lost" if self.lost.is_set() else "failed"),
            )

    async def _call_handler(self, run: ThreadRun) -> bool:
        try:
            await self.rt.handler(run)
        except asyncio.CancelledError:
            if self.lost.is_set():
                return False
            raise
        except Exception:
            logger.exception("handler of run %s (thread %r) raised", run.run_id, run.thread_key)
            return False
        return True

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
        logger.warning(
            "run %s of thread %r lost its lease: %s", self.run_id, self.thread_key, reason
        )
        self.rt.emit("lost", self.thread_key, run_id=self.run_id, token=self.token, detail=reason)
        task = self.run_task
        if self.rt.cancel_on_loss and task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _cleanup(self) -> None:
        rt = self.rt
        self.done = True
        while self.buffer:
            _settle(self.buffer.popleft(), "abandon")
        for pending in list(self.inflight.values()):
            _settle(pending, "abandon")
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
        task = self.main_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@dataclass(eq=False)
class _Watch:
    seen: str | None
    poke: asyncio.Event
    task: asyncio.Task[None] | None = None


class ThreadRuntime:
    """Runs ``handler`` for each thread in exactly one process at a time.

    ``backend`` is a pub/sub backend (anything :func:`tenure.from_url` returns
    that can publish); its lease provider is found with
    :func:`tenure.lease_provider_for` unless ``lease_provider`` is given.
    ``handler(run)`` is called for each run; it reads ``run.signals()``.

    Settings: ``ttl_ms`` (lease TTL, default 15 s), ``renew_every_ms`` (default a
    third of the TTL), ``idle_timeout`` (seconds without a signal after which a
    run's iteration ends, default 1 s), ``watch_interval`` (seconds between a
    watcher's looks at a thread it routed a signal to, default the renew
    interval capped at 1 s), ``marker_timeout`` (seconds to wait for the close
    marker, default 10 s), ``unsubscribe_timeout`` (seconds a closing session
    waits for the backend's ``unsubscribe``, default 5 s), ``cancel_on_loss``
    (cancel the handler when the lease is lost, default true), ``namespace``
    (prefix of lease keys and topics).

    ``on_event`` is called synchronously with a :class:`RuntimeEvent` at each
    step; an exception it raises is logged and ignored.

    See the module docstring for the guarantees and how they are obtained.
    """

    def __init__(
        self,
        backend: Any,
        handler: Handler,
        *,
        lease_provider: Any = None,
        ttl_ms: int = 15_000,
        renew_every_ms: int | None = None,
        renew_deadline_ms: int | None = None,
        idle_timeout: float = 1.0,
        process_id: str | None = None,
        on_event: OnEvent | None = None,
        watch_interval: float | None = None,
        marker_timeout: float = 10.0,
        unsubscribe_timeout: float = 5.0,
        cancel_on_loss: bool = True,
        namespace: str = "tenure.thread",
    ) -> None:
        if not callable(handler):
            raise InvalidArgument(f"handler must be callable, got {type(handler).__name__}")
        self.ttl_ms = check_ttl(ttl_ms)
        if renew_every_ms is None:
            renew_every_ms = max(1, ttl_ms // 3)
        self.renew_every_ms = check_ttl(renew_every_ms, "renew_every_ms")
        if self.renew_every_ms >= self.ttl_ms:
            raise InvalidArgument(
                f"renew_every_ms must be less than ttl_ms ({ttl_ms}), got {renew_every_ms}"
            )
        if renew_deadline_ms is None:
            # Two thirds of the TTL, as for tenure.hold, but never before a renewal
            # sent on time could have had a chance to come back.
            renew_deadline_ms = max(2 * self.ttl_ms // 3, (self.renew_every_ms + self.ttl_ms) // 2)
        self.renew_deadline_ms = check_ttl(renew_deadline_ms, "renew_deadline_ms")
        if not self.renew_every_ms < self.renew_deadline_ms < self.ttl_ms:
            raise InvalidArgument(
                f"renew_deadline_ms must be between renew_every_ms ({self.renew_every_ms}) and "
                f"ttl_ms ({self.ttl_ms}), got {renew_deadline_ms}"
            )
        self.idle_timeout = check_timeout(idle_timeout, "idle_timeout")
        if self.idle_timeout <= 0:
            raise InvalidArgument("idle_timeout must be greater than 0")
        if watch_interval is None:
            watch_interval = min(self.renew_every_ms / 1000, 1.0)
        self.watch_interval = check_timeout(watch_interval, "watch_interval")
        self.marker_timeout = check_timeout(marker_timeout, "marker_timeout")
        self.unsubscribe_timeout = check_timeout(unsubscribe_timeout, "unsubscribe_timeout")
        self.process_id = check_name(
            process_id if process_id is not None else uuid.uuid4().hex[:12], "process_id"
        )
        if on_event is not None and not callable(on_event):
            raise InvalidArgument(f"on_event must be callable, got {type(on_event).__name__}")
        self.namespace = check_name(namespace, "namespace")
        capabilities = capabilities_of(backend)
        if Capability.EVENTS not in capabilities:
            raise ConfigurationError(
                f"{type(backend).__name__} cannot carry signals: the runtime needs a backend "
                "that declares Capability.EVENTS (a PubSub)"
            )
        if lease_provider is None:
            provider = lease_provider_for(backend)
        elif is_lease_provider(lease_provider):
            provider = lease_provider
        else:
            raise InvalidArgument(
                f"lease_provider must have the five lease methods, got {type(lease_provider).__name__}"
            )
        self.handler = handler
        self.provider: LeaseProvider = provider
        self.cancel_on_loss = bool(cancel_on_loss)
        self._on_event = on_event
        self.backend = backend
        self.single_process = isinstance(provider, NoopLeaseProvider)
        self.log: Any
        if self.single_process:
            logger.warning(
                "%s provides no leases: the thread runtime runs single-process "
                "(threads are coordinated within this process only)",
                type(backend).__name__,
            )
            self.log = LocalLog()
        elif Capability.DURABLE_GROUPS not in capabilities:
            # Events that do not outlive a subscriber (memory://) cannot hold a
            # thread's signals between sessions: keep them in this process's log.
            self.log = local_log_for(backend)
        else:
            self.log = backend
        self._local = isinstance(self.log, LocalLog)
        self._sessions: dict[str, _Session] = {}
        # Topics whose consumer group is known to exist (LRU). The local log needs none.
        self._known: OrderedDict[str, None] = OrderedDict()
        self._watches: dict[str, _Watch] = {}
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._sessions)} threads owned"
        return f"ThreadRuntime(process_id={self.process_id!r}, {state})"

    # -- names ----------------------------------------------------------------

    def _name(self, thread_key: str) -> str:
        name = f"{self.namespace}:{thread_key}"
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            digest = hashlib.sha256(thread_key.encode("utf-8")).hexdigest()
            name = f"{self.namespace}#{digest}"
        return name

    def lease_key(self, thread_key: str) -> str:
        """The lease key of ``thread_key`` (to observe the raw lease)."""
        return self._name(check_name(thread_key, "thread_key"))

    def topic(self, thread_key: str) -> str:
        """The topic carrying ``thread_key``'s signals."""
        return self._name(check_name(thread_key, "thread_key"))

    # -- lifecycle --------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        if self._closed:
            raise BackendClosed("ThreadRuntime is closed")
        self._started = True

    async def aclose(self) -> None:
        """Stop every watcher and session: running handlers are cancelled, their
        unacknowledged signals stay in the log, the leases are released."""
        if self._closed:
            return
        self._closed = True
        watchers = [w.task for w in self._watches.values() if w.task is not None]
        for task in watchers:
            task.cancel()
        if watchers:
            await asyncio.wait(watchers, timeout=self.unsubscribe_timeout)
        await asyncio.gather(*(s.stop() for s in list(self._sessions.values())))
        # What is left are unsubscribes that outlived their timeout.
        rest = list(self._tasks)
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.wait(rest, timeout=self.unsubscribe_timeout)

    @property
    def closed(self) -> bool:
        return self._closed

    def owned_threads(self) -> list[str]:
        """Threads this process holds a session for right now."""
        return list(self._sessions)

    # -- observability -----------------------------------------------------------

    def emit(
        self,
        kind: EventKind,
        thread_key: str,
        *,
        run_id: str | None = None,
        token: int | None = None,
        signal_id: str | None = None,
        detail: str | None = None,
    ) -> None:
        if self._on_event is None:
            return
        event = RuntimeEvent(
            kind=kind,
            thread_key=thread_key,
            process_id=self.process_id,
            at=time.monotonic(),
            run_id=run_id,
            token=token,
            signal_id=signal_id,
            detail=detail,
        )
        try:
            self._on_event(event)
        except Exception:
            logger.exception("on_event callback raised on %s", kind)

    # -- sending --------------------------------------------------------------

    async def send_signal(self, thread_key: str, payload: Any) -> SendResult:
        """Make ``payload`` a durable signal of ``thread_key`` and see that a run reads it.

        Returns ``"wake"`` when this call started the thread's run here,
        ``"deliver"`` when a run was already active (in this process or
        another) and will read it from the log. Raises
        :class:`~tenure.InvalidArgument` for a bad key or a payload that is not
        JSON-serialisable, :class:`~tenure.BackendClosed` after ``aclose()``,
        and :class:`~tenure.BackendUnavailable` when the signal could not be
        published (then it was not sent).
        """
        check_name(thread_key, "thread_key")
        try:
            json.dumps(payload)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"payload must be JSON-serialisable: {exc}") from None
        if self._closed:
            raise BackendClosed("ThreadRuntime is closed")
        self._started = True
        signal_id = uuid.uuid4().hex
        event = Event(
            type=SIGNAL_TYPE, data={"thread": thread_key, "payload": payload}, id=signal_id
        )
        topic = self.topic(thread_key)
        async with self._thread_lock(thread_key):
            session = self._sessions.get(thread_key)
            if session is not None and not session.done:
                await self.log.publish(topic, event)
                if session.closing:
                    session.late_send = True
                self.emit("deliver", thread_key, run_id=session.run_id, signal_id=signal_id)
                return SendResult("deliver", session.run_id, signal_id, thread_key)
            if self._local or topic in self._known:
                # The thread's group exists: make the signal durable first, so its
                # delivery does not wait for the lease round trip.
                await self.log.publish(topic, event)
                try:
                    started, owner = await self._try_start(thread_key, "wake", signal_id)
                except TenureError as exc:
                    # Sent, but we could not look for its run: the watcher will.
                    logger.warning("could not acquire the lease of %r: %s", thread_key, exc)
                    started, owner = None, None
                if started is not None:
                    return SendResult("wake", started.run_id, signal_id, thread_key)
            else:
                # The group may not exist yet, and a signal published before it would
                # be skipped: take the lease first, or publish once its owner is open.
                pause = 0.002
                while True:
                    started, owner = await self._try_start(thread_key, "wake", signal_id)
                    if started is not None:
                        await self.log.publish(topic, event)
                        return SendResult("wake", started.run_id, signal_id, thread_key)
                    if owner is not None and owner.endswith(".0"):
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, 0.05)
                        continue
                    break
                await self.log.publish(topic, event)
                self._remember(topic)
            self._watch(thread_key, owner)
            run_id = None if owner is None else _run_of(owner)
            self.emit("deliver", thread_key, run_id=run_id, signal_id=signal_id)
            return SendResult("deliver", run_id, signal_id, thread_key)

    def _remember(self, topic: str) -> None:
        """Note that ``topic``'s consumer group exists (a session of it was open)."""
        known = self._known
        known[topic] = None
        known.move_to_end(topic)
        if len(known) > _KNOWN_TOPICS:
            known.popitem(last=False)

    @contextlib.asynccontextmanager
    async def _thread_lock(self, thread_key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(thread_key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[thread_key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[thread_key]
            if users <= 1:
                del self._locks[thread_key]
            else:
                self._locks[thread_key] = (lock, users - 1)

    async def _try_start(
        self,
        thread_key: str,
        kind: EventKind,
        signal_id: str | None = None,
        previous: str | None = None,
    ) -> tuple[_Session | None, str | None]:
        """Acquire the thread's lease and open a session; the session, or the holder's name.

        A session whose topic may have no consumer group yet takes the lease
        as ``"<process>/<session>.0"`` (opening) and moves it to ``.1`` once
        subscribed, so senders elsewhere wait before publishing (see
        ``send_signal``). Raises what the backend raised; then no session exists.
        """
        sid = uuid.uuid4().hex[:12]
        topic = self.topic(thread_key)
        phase = 1 if self._local or topic in self._known else 0
        owner = f"{self.process_id}/{sid}.{phase}"
        sent = time.monotonic()
        result = await self.provider.acquire_lease(self.lease_key(thread_key), owner, self.ttl_ms)
        if not result.acquired:
            return None, result.owner
        session = _Session(self, thread_key, sid, owner, result.token, sent)
        self._sessions[thread_key] = session
        await session.open()
        self._remember(topic)
        if kind == "wake":
            self.emit(
                kind, thread_key, run_id=session.run_id, token=session.token, signal_id=signal_id
            )
        else:
            session.announce, session.previous = kind, previous
        session.start()
        return session, session.owner

    async def unsubscribe(self, topic: str, callback: Any, thread_key: str) -> None:
        """Unsubscribe, waiting at most ``unsubscribe_timeout`` seconds.

        A session must not keep its thread's lease hostage to a backend whose
        unsubscribe hangs: after the timeout the unsubscribe goes on in the
        background and the session carries on (its callback takes nothing more).
        The signals the backend hands back to the group when it finishes may
        then come after the next session looked for them, so once it finishes
        the thread is watched until a session that starts after that exists.
        """
        task = self._spawn(self._unsubscribe(topic, callback), f"tenure-unsubscribe-{topic!r}")
        await asyncio.wait([task], timeout=self.unsubscribe_timeout)
        if not task.done():
            logger.warning(
                "unsubscribing from %r takes longer than %.1f s; going on without waiting",
                topic,
                self.unsubscribe_timeout,
            )
            task.add_done_callback(lambda _: self._watch_after_hand_back(thread_key))

    def _watch_after_hand_back(self, thread_key: str) -> None:
        """Watch ``thread_key`` until a session that starts from now on exists."""
        if self._closed:
            return
        # A local session now open started before the hand-back: wait for the next.
        local = self._sessions.get(thread_key)
        self._watch(thread_key, None if local is None else local.owner)
        self._watches[thread_key].poke.set()

    async def _unsubscribe(self, topic: str, callback: Any) -> None:
        try:
            await self.log.unsubscribe(topic, callback)
        except TenureError as exc:
            logger.warning("unsubscribing from %r failed: %s", topic, exc)

    async def read_token(self, lease_key: str, owner: str) -> int | None:
        """The token of ``owner``'s lease after a transfer (``None`` without ``Capability.RECORD``)."""
        if Capability.RECORD not in capabilities_of(self.provider):
            return None
        try:
            record = await cast(Backend, self.provider).get_lease(lease_key)
        except TenureError:
            return None
        if record is None or record.owner != owner:
            return None
        return record.token

    # -- watching threads routed elsewhere ---------------------------------------

    def _watch(self, thread_key: str, owner: str | None) -> None:
        watch = self._watches.get(thread_key)
        if watch is not None:
            watch.seen = _session_of(owner)
            return
        watch = self._watches[thread_key] = _Watch(_session_of(owner), asyncio.Event())
        watch.task = self._spawn(
            self._watch_loop(thread_key, watch), f"tenure-watch-{thread_key!r}"
        )

    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _watch_loop(self, thread_key: str, watch: _Watch) -> None:
        """Until a session that began after our last publish exists, adopt the thread when free."""
        try:
            while not self._closed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watch.poke.wait(), self.watch_interval)
                watch.poke.clear()
                async with self._thread_lock(thread_key):
                    local = self._sessions.get(thread_key)
                    if local is not None:
                        if _session_of(local.owner) != watch.seen:
                            return  # ours, and opened after the signals we watch for
                        continue  # the session we routed to, still closing
                    try:
                        started, owner = await self._try_start(
                            thread_key, "takeover", None, watch.seen
                        )
                    except TenureError as exc:
                        logger.warning("watching %r: %s", thread_key, exc)
                        continue
                    if started is not None:
                        return
                    if watch.seen is None:
                        # We never saw who held the thread when we published: whoever
                        # holds it now may have started before, so wait for the next one.
                        watch.seen = _session_of(owner)
                    elif owner is not None and _session_of(owner) != watch.seen:
                        return
        finally:
            if self._watches.get(thread_key) is watch:
                del self._watches[thread_key]

    def session_ended(self, session: _Session) -> None:
        if self._sessions.get(session.thread_key) is session:
            del self._sessions[session.thread_key]
        if self._closed:
            return
        watch = self._watches.get(session.thread_key)
        if session.lost.is_set():
            # The lease was lost, so another session may have subscribed (and looked
            # for unfinished signals) before ours were handed back when we
            # unsubscribed: watch until a session that starts after now exists.
            self._watch_after_hand_back(session.thread_key)
        elif watch is not None:
            watch.poke.set()
        elif session.late_send:
            # A local send slipped in after the close marker: make sure some session
            # reads it.
            self._watch(session.thread_key, session.owner)
            self._watches[session.thread_key].poke.set()
