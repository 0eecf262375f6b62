"""A thread's session in this process: its lease, its subscription and its runs.

A session opens (reclaims, subscribes, moves an opening lease to its first
run), then runs the handler while signals come, handing the lease to each next
run, and closes once idle (a close marker read back, then unsubscribe and
release). It reads only its :class:`~._context.SessionContext`.

A session opened by a send that wakes its thread is *awake*: it runs what
waits, persisted signals included, in log order. One opened by the sweep or
by a ``persist`` send is not until a signal that wakes the thread arrives
(:class:`~._inbox.Inbox`): it keeps its lease "opening" (phase 0) meanwhile,
so that a waking sender waits for it rather than leave it a signal it may
not read, and if a persisted signal heads the log it ends at once, without a
run, leaving that signal stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import cast

from .._errors import LeaseLost, TenureError
from .._pubsub import Event, LeaseFence
from ._closing import Closing
from ._context import SessionContext
from ._control import Control
from ._identity import Holder
from ._inbox import Inbox
from ._lease import ThreadLease
from ._log import GROUP, FencedLog
from ._policies import SendRule, wakes_on_wire
from ._run import RunEnd, ThreadRun, call_handler, ended_as, finish, stop
from ._types import EventKind

__all__ = ["Session"]

logger = logging.getLogger("tenure.runtime")


def _asked_to_stop() -> bool:
    """Whether the current task's cancellation was requested (``Task.cancel``), rather
    than a ``CancelledError`` raised by something it awaited that was cancelled."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Session:
    """This process's tenure of one thread: the lease, the subscription and its runs."""

    def __init__(
        self,
        ctx: SessionContext,
        thread_key: str,
        holder: Holder,
        token: int | None,
        sent_at: float,
        awake: bool = True,
    ) -> None:
        self._ctx = ctx
        self.thread_key = thread_key
        self.topic = ctx.names.name(thread_key)
        self.lease = ThreadLease(ctx, self.topic, holder, token, sent_at, self._lose)
        self.lost = self.lease.lost
        self.taken_at = time.monotonic()  # when this process took the thread over
        self._runs = 0
        self.control = Control(ctx, thread_key)
        self.inbox = Inbox(
            thread_key,
            holder.sid,
            self._takes,
            self.lost,
            lambda signal: self.control.skipped(self.run_id, signal),
            lambda signal_id, into: self.control.coalesced(self.run_id, signal_id, into),
            lambda signal_id: self.control.discarded(self.run_id, signal_id),
            wakes=lambda data: wakes_on_wire(data, ctx.rule),
            awake=awake,
        )
        self._closing = Closing(ctx, self.topic, thread_key, holder.sid, self.inbox, self.lost)
        self.done = False
        self._stopping = False  # stop() came (aclose): a session still opening never runs
        self.ended = asyncio.Event()
        # Ended at a persisted signal without a run (nothing woke the thread).
        self.slept = False
        self.run: ThreadRun | None = None
        self._run_task: asyncio.Task[RunEnd] | None = None
        self._main_task: asyncio.Task[None] | None = None
        self._subscribed = False
        # Any sender may choose a policy that tells the owner, whatever ours is.
        self._control: str | None = ctx.names.control(thread_key)
        self._control_subscribed = False
        # The event still to emit when the first run starts (a watcher's "takeover"),
        # and its detail: the run id of the owner the sweep last saw hold the thread.
        self._announce: EventKind | None = None
        self._previous: str | None = None

    @property
    def sid(self) -> str:
        return self.lease.holder.sid

    @property
    def owner(self) -> str:
        return self.lease.holder.owner

    @property
    def run_id(self) -> str:
        return self.lease.holder.run_id

    @property
    def token(self) -> int | None:
        return self.lease.token

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- what the inbox asks -------------------------------------------------

    def _takes(self) -> bool:
        return not self.done and self.lease.renewer.check()

    # -- what senders of this process do ---------------------------------------

    def waking(self) -> None:
        """A send of this process that wakes the thread is about to store its signal here.

        Called before the signal is stored: a session that is not awake yet
        (opened by the sweep or a ``persist`` send) runs what it reads from now
        on, persisted signals first, rather than end at a persisted one.
        """
        self.inbox.wake_up()

    def sent_here(self, rule: SendRule, signal_id: str, sent_at: float) -> None:
        """A send of this process stored ``signal_id`` for this session's thread."""
        self._overtake(rule, signal_id, sent_at)
        self._closing.sent_here(rule.wakes)

    def _overtake(self, rule: SendRule, signal_id: str, sent_at: float) -> None:
        self.control.overtake(rule, self.run, self._run_task, self.inbox, signal_id, sent_at)

    async def on_control(self, event: Event) -> None:
        """A sender elsewhere asks the owner to apply its policy (a fan-out subscription)."""
        asked = self.control.asked(event)
        if asked is not None:
            self._overtake(*asked)

    # -- opening ---------------------------------------------------------------

    async def open(self) -> None:
        """Subscribe; if the lease was taken as "opening", move it to the first run; renew.

        On failure the lease is released, the session ends and the error is raised.
        """
        ctx = self._ctx
        try:
            # We hold the lease, so whoever read this thread's signals before us is
            # gone or has lost it: what it took and never acknowledged comes back
            # now, ahead of newer signals, not after a redelivery timeout.
            reclaimed = await ctx.log.reclaim(self.topic, GROUP)
            if reclaimed:
                logger.info(
                    "session %s of %r took back %d unfinished signal(s) of a previous owner",
                    self.sid,
                    self.thread_key,
                    reclaimed,
                )
            await self._subscribe()
            if self.lease.holder.opening and self.inbox.awake:
                await self.lease.open()
        except BaseException as exc:
            await self._fail_opening(exc)
            raise
        self.lease.renewer.start()

    async def _subscribe(self) -> None:
        ctx = self._ctx
        if ctx.fenced:
            # Read only while this session holds the thread's lease (whichever
            # run), so a stale session of this process cannot take what the next
            # owner reclaimed.
            fence = LeaseFence(self.topic, self.lease.holder.session_prefix)
            await cast(FencedLog, ctx.log).subscribe(
                self.topic, self.inbox.on_event, group=GROUP, fence=fence
            )
        else:
            await ctx.log.subscribe(self.topic, self.inbox.on_event, group=GROUP)
        self._subscribed = True
        if self._control is not None:
            await ctx.log.subscribe(self._control, self.on_control)
            self._control_subscribed = True

    async def _fail_opening(self, exc: BaseException) -> None:
        ctx = self._ctx
        self.done = True
        with contextlib.suppress(TenureError):
            if self._control_subscribed and self._control is not None:
                await ctx.log.unsubscribe(self._control, self.on_control)
            if self._subscribed:
                await ctx.log.unsubscribe(self.topic, self.inbox.on_event)
            await self.lease.release()
        if self._subscribed:
            # What the subscription read went back to the group, maybe after the
            # next owner looked: count it as lost so a newer session is watched for.
            self.lease.count_lost(f"failed while opening: {exc!r}")
        self._ended()

    # -- starting --------------------------------------------------------------

    def start(self, announce: EventKind | None = None, previous: str | None = None) -> None:
        """Run: the first run announces ``announce`` (with ``previous``, a run id) if given."""
        self._announce, self._previous = announce, previous
        self.lease.renewer.start()
        self._main_task = asyncio.get_running_loop().create_task(
            self._main(), name=f"tenure-session-{self.sid}"
        )

    async def end_unstarted(self, announce: EventKind) -> None:
        """End a session that never started: what it read goes back to the group.

        Nothing is announced of it (no ``"release"``: ``announce`` never happened).
        """
        self._announce = self._announce or announce
        await self.cleanup()

    # -- running ---------------------------------------------------------------

    async def _main(self) -> None:
        try:
            if not self.inbox.has_work:
                deadline = asyncio.get_running_loop().time() + self._ctx.settings.idle_timeout
                await self.inbox.wait(deadline)
            while not self.lost.is_set():
                if self.inbox.dormant:
                    # A persisted signal heads the log and nothing woke the thread:
                    # it stays stored (handed back as the session ends).
                    self.done = self.slept = True
                    break
                if not self.inbox.has_work and await self._closing.handshake():
                    # Decided: from here on, late deliveries are left for the next owner.
                    self.done = True
                    break
                if self.lost.is_set():
                    break
                await self.inbox.ready()  # a debounce's quiet window
                if self.lost.is_set():
                    break
                if self._runs and not await self._handover():
                    break
                if self.lease.holder.opening and not await self._woken():
                    break
                await self._run_once()
                await self.control.roll_back()
        except asyncio.CancelledError:
            if _asked_to_stop():
                raise
            logger.exception(
                "session %s of thread %r was cancelled by a callee", self.sid, self.thread_key
            )
        except Exception:
            logger.exception("session %s of thread %r failed", self.sid, self.thread_key)
        finally:
            await self.cleanup()

    async def _woken(self) -> bool:
        """Move the "opening" lease of a session now awake to its first run, so
        senders leave it their signals; ``False`` if it was no longer held."""
        try:
            await self.lease.open()
        except LeaseLost as exc:
            self.lease.renewer.lose(exc.reason)
            return False
        return True

    async def _run_once(self) -> None:
        ctx = self._ctx
        self._runs += 1
        if self._announce is not None:
            # A sweeper's session shows up only once it has something to run.
            kind, previous, self._announce = self._announce, self._previous, None
            ctx.emit(kind, self.thread_key, run_id=self.run_id, token=self.token, detail=previous)
        run = ThreadRun(
            self.lease,
            self.inbox,
            ctx.emit,
            owner=self.owner,
            run_id=self.run_id,
            token=self.token,
            process_id=ctx.settings.process_id,
            idle_timeout=ctx.settings.idle_timeout,
        )
        task = asyncio.get_running_loop().create_task(
            call_handler(ctx.handler, run), name=f"tenure-run-{self.run_id}"
        )
        self.run, self._run_task = run, task
        end: RunEnd = "failed"
        stopped = False  # the session is being stopped (aclose): no failure of the signal
        try:
            end = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done() and not _asked_to_stop() and not self.lost.is_set():
                # The run's task was cancelled from outside before its handler ran.
                end = "failed"
                return
            if not task.done():
                stop(run, task, "cancelled")
                await asyncio.gather(task, return_exceptions=True)
            if not self.lost.is_set():
                stopped = True
                end = ended_as(task)
                raise
            end = "lost"
        finally:
            self.run, self._run_task = None, None
            finish(run, end, leaving=self.lost.is_set() or end == "lost" or stopped)
            ctx.emit("run_end", self.thread_key, run_id=run.run_id, token=run.token, detail=end)

    async def _handover(self) -> bool:
        """Move the lease to the next run; ``False`` if it was no longer held."""
        previous = self.run_id
        if not await self.lease.hand_over():
            return False
        self._ctx.emit(
            "handover", self.thread_key, run_id=self.run_id, token=self.token, detail=previous
        )
        return True

    def _lose(self, reason: str) -> None:
        """The renewer declared the lease lost: tell the run and stop it."""
        self.inbox.wake()  # a run waiting for its next signal
        logger.warning(
            "run %s of thread %r lost its lease: %s", self.run_id, self.thread_key, reason
        )
        ctx = self._ctx
        ctx.emit("lost", self.thread_key, run_id=self.run_id, token=self.token, detail=reason)
        run, task = self.run, self._run_task
        if ctx.settings.cancel_on_loss and run and task and task is not asyncio.current_task():
            stop(run, task, "lost")

    # -- ending ----------------------------------------------------------------

    async def cleanup(self) -> None:
        ctx = self._ctx
        self.done = True
        self.inbox.abandon_all()
        if self._control_subscribed and self._control is not None:
            await ctx.unsubscribe(self._control, self.on_control)
        if self._subscribed:
            # The backend hands the signals this session had not acknowledged back to
            # the group here; the lease is still held (and renewed) meanwhile, so the
            # next session, which subscribes after our release, finds them at once.
            await ctx.unsubscribe(self.topic, self.inbox.on_event)
        # Renewals went on while unsubscribing: unfinished signals must be back in
        # the group before anyone else can own the thread.
        released = await self.lease.release()
        if released and self._announce is None:
            ctx.emit("release", self.thread_key, run_id=self.run_id, token=self.token)
        self._ended()

    def _ended(self) -> None:
        self.ended.set()
        # Signals may have gone back to the log after the next owner looked, or a
        # local send slipped in after the close marker: someone must look for them.
        closing = self._closing
        self._ctx.ended(
            self.thread_key, self.sid, self.lost.is_set() or closing.late_send, closing.late_wake
        )

    async def stop(self) -> None:
        self._stopping = True
        task = self._main_task
        if task is None:
            # Still opening: whoever opens it sees ``stopping`` and ends it without
            # a run. Wait for that, within the unsubscribe timeout (a hung backend);
            # should the opening outlast it, the session still ends without a run.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ended.wait(), self._ctx.settings.unsubscribe_timeout)
        elif not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
