"""A run: one call of the handler for one thread, and how what it read is settled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .. import telemetry
from .._errors import ConfigurationError, LeaseLost
from ._inbox import Inbox
from ._observe import Emit
from ._output import check_kind
from ._pending import Pending, settle
from ._types import EventKind, Signal

if TYPE_CHECKING:
    from ._replies import RunOutput

__all__ = [
    "CANCELLED_WITH_RUN",
    "Handler",
    "HeldLease",
    "RunEnd",
    "ThreadRun",
    "call_handler",
    "current_signal",
    "ended_as",
    "finish",
    "stop",
]

logger = logging.getLogger("tenure.runtime")

# How a run ended, as the "run_end" event's detail and the run's span say: its
# handler returned ("ok") or raised ("failed"), or it was cancelled because the
# lease was lost ("lost"), by a newer signal ("interrupted") or by the runtime's
# aclose() ("cancelled").
RunEnd = Literal["ok", "failed", "lost", "interrupted", "cancelled"]

# The ``detail`` of the "interrupted" event naming the signal an interrupted run
# was handling, acknowledged unhandled with it.
CANCELLED_WITH_RUN = "cancelled with its run"


class HeldLease(Protocol):
    """The lease a run holds, as its session keeps it."""

    @property
    def lease_key(self) -> str: ...

    @property
    def lost(self) -> asyncio.Event: ...

    def why_not_held(self, owner: str) -> str | None:
        """Why ``owner`` no longer holds the lease (``None`` while it does)."""
        ...


class ThreadRun:
    """One run of the handler for one thread, holding the thread's lease.

    ``token`` is the lease's fencing token for this run (``None`` on a backend
    without tokens); hand it to stores that reject stale writers. ``lost`` is
    set when the lease is lost; by default the handler is then cancelled.
    """

    __slots__ = (
        "_current",
        "_emit",
        "_ended",
        "_idle_timeout",
        "_inbox",
        "_lease",
        "_owner",
        "_stopped_as",
        "_taken",
        "interrupted",
        "output",
        "process_id",
        "run_id",
        "thread_key",
        "token",
    )

    def __init__(
        self,
        lease: HeldLease,
        inbox: Inbox,
        emit: Emit,
        *,
        owner: str,
        run_id: str,
        token: int | None,
        process_id: str,
        idle_timeout: float,
    ) -> None:
        self._lease = lease
        self._inbox = inbox
        self._emit = emit
        self._owner = owner  # the lease's owner while this run holds it
        self._idle_timeout = idle_timeout
        self.thread_key = inbox.thread_key
        self.run_id = run_id
        self.token = token
        self.process_id = process_id
        self._current: Pending | None = None
        self._ended = False
        self._taken = 0
        # Set by tenure just before it cancels the run's task, and only then.
        self._stopped_as: RunEnd | None = None
        #: Set when a newer signal interrupted this run (the ``interrupt`` policy).
        self.interrupted = False
        #: The run's writer to its thread's output (a runtime with ``output``).
        self.output: RunOutput | None = None

    def __repr__(self) -> str:
        return (
            f"ThreadRun(thread_key={self.thread_key!r}, run_id={self.run_id!r}, token={self.token})"
        )

    @property
    def lost(self) -> asyncio.Event:
        return self._lease.lost

    @property
    def lease_key(self) -> str:
        return self._lease.lease_key

    @property
    def owner(self) -> str:
        """The lease's owner while this run holds it."""
        return self._owner

    async def append(self, data: Any, kind: str = "token") -> int:
        """Append ``data`` (a JSON value or ``bytes``) to the thread's output; its position.

        The item answers the signal being handled. Fenced: raises
        :class:`~tenure.Fenced` (nothing stored) once a later run owns the
        thread. See :meth:`ThreadRuntime.follow`.
        """
        return await self.append_many([data], kind)

    async def append_many(self, items: Sequence[Any], kind: str = "token") -> int:
        """Append several items of one ``kind`` in one fenced step; the last position."""
        check_kind(kind)
        if self.output is None:
            raise ConfigurationError("this runtime keeps no output: ThreadRuntime(output=...)")
        signal = None if self._current is None else self._current.signal.id
        return await self.output.write([(kind, data, signal) for data in items])

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
        reason = self._lease.why_not_held(self._owner)
        if reason is not None:
            raise LeaseLost(self._lease.lease_key, self._owner, reason)

    def emit(self, kind: EventKind, signal_id: str | None, detail: str | None = None) -> None:
        self._emit(
            kind,
            self.thread_key,
            run_id=self.run_id,
            token=self.token,
            signal_id=signal_id,
            detail=detail,
        )

    def _ack_current(self) -> None:
        if self._current is not None:
            settle(self._current, "ack")
            self._current = None

    async def signals(self) -> AsyncIterator[Signal]:
        """The thread's signals, in order, until none arrives for ``idle_timeout``.

        Taking the next signal acknowledges the previous one; the last one is
        acknowledged when the handler returns normally. The iteration also ends
        when the lease is lost.
        """
        while not self._ended:
            if self.output is not None and self._current is not None:
                await self.output.finished(self._current.signal.id)
            self._ack_current()
            pending = await self._inbox.next(self._idle_timeout)
            if pending is None:
                return
            self._current = pending
            self._taken += 1
            self.emit("signal", pending.signal.id)
            if self.output is not None:
                await self.output.taken(pending.signal.id)
            yield pending.signal


Handler = Callable[[ThreadRun], Awaitable[None]]


def current_signal(run: ThreadRun) -> Signal | None:
    """The signal ``run`` is handling (``None`` between signals)."""
    return None if run._current is None else run._current.signal


def stop(
    run: ThreadRun, task: asyncio.Task[RunEnd], why: RunEnd, message: str | None = None
) -> None:
    """Cancel ``run``'s task on tenure's behalf; the run then ends as ``why``.

    A cancellation that did not come through here is none of tenure's: the
    handler's own failure (see :func:`_handle`).
    """
    if run._stopped_as is None:
        run._stopped_as = why
    task.cancel(message)


def ended_as(task: asyncio.Task[RunEnd]) -> RunEnd:
    """How a run whose task is done ended, as its span says (see :func:`call_handler`)."""
    if task.cancelled():
        return "cancelled"
    return "failed" if task.exception() is not None else task.result()


async def call_handler(handler: Handler, run: ThreadRun) -> RunEnd:
    """Call ``handler`` for ``run`` in a ``tenure run`` span; how it ended."""
    attributes: dict[str, str | int] = {"tenure.thread": run.thread_key}
    attributes["tenure.run_id"] = run.run_id
    if run.token is not None:
        attributes["tenure.token"] = run.token
    with telemetry.span("tenure run", attributes) as span:
        end: RunEnd = "cancelled"  # unless the handler's end is known
        try:
            end = await _handle(handler, run)
            return end
        finally:
            span.set_attribute("tenure.run.end", end)


async def _handle(handler: Handler, run: ThreadRun) -> RunEnd:
    try:
        await handler(run)
    except asyncio.CancelledError:
        if run.lost.is_set():
            return "lost"
        if run.interrupted:
            return "interrupted"
        if run._stopped_as is not None:
            raise
        # Nobody in tenure asked: the handler awaited something someone else
        # cancelled, or someone cancelled its task. That is the handler failing on
        # its signal (an attempt spent), not the session stopping, which would
        # hand the signal back for free and run it again forever.
        task = asyncio.current_task()
        while task is not None and task.cancelling():
            task.uncancel()
        logger.exception(
            "handler of run %s (thread %r) let out a cancellation tenure did not ask for",
            run.run_id,
            run.thread_key,
        )
        return "failed"
    except Exception:
        logger.exception("handler of run %s (thread %r) raised", run.run_id, run.thread_key)
        return "failed"
    return "ok"


def finish(run: ThreadRun, end: RunEnd, *, leaving: bool) -> None:
    """Settle what ``run`` read, now that it ended as ``end``.

    ``leaving``: the session stops (lease lost, runtime closing): what the run
    held goes back to the log untouched, for the next owner.
    """
    run._ended = True
    inbox = run._inbox
    if run._current is not None:
        if leaving:
            settle(run._current, "abandon")
        else:
            if end == "interrupted":
                # Settled unhandled with its run: said before it is acknowledged.
                run.emit("interrupted", run._current.signal.id, CANCELLED_WITH_RUN)
            settle(run._current, "ack" if end in ("ok", "interrupted") else "retry")
        run._current = None
    elif not run._taken and inbox.has_work and not leaving and end != "interrupted":
        # A handler that returns without reading would be run again and again
        # for the same signal: count it as a failed delivery instead, so the
        # backend's attempt limit ends the loop.
        logger.warning(
            "run %s of thread %r returned without reading its signals",
            run.run_id,
            run.thread_key,
        )
        inbox.retry_first()
