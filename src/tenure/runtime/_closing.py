"""How a session closes once idle: a close marker published on its thread's
log and read back, so that nothing sent before it is left behind; and the
sends of this process that came too late for it.

Signals published after the marker are not this session's: they go back to
the group as it unsubscribes, and :attr:`Closing.late_send` tells the runtime
to look for them (a sweep), with :attr:`Closing.late_wake` when one of them
wakes the thread.
"""

from __future__ import annotations

import asyncio
import logging

from .._pubsub import Event
from ._context import SessionContext
from ._inbox import Inbox
from ._log import CLOSE_MARKER

__all__ = ["Closing"]

logger = logging.getLogger("tenure.runtime")


class Closing:
    """The close handshake of one session (``sid``, on ``topic``)."""

    def __init__(
        self,
        ctx: SessionContext,
        topic: str,
        thread_key: str,
        sid: str,
        inbox: Inbox,
        lost: asyncio.Event,
    ) -> None:
        self._ctx = ctx
        self._topic = topic
        self._thread_key = thread_key
        self._sid = sid
        self._inbox = inbox
        self._lost = lost
        self.closing = False
        self.late_send = False
        self.late_wake = False  # one of the late sends wakes the thread

    def sent_here(self, wakes: bool) -> None:
        """A send of this process stored a signal for the thread (``wakes`` it or not)."""
        if self.closing:
            self.late_send = True
            self.late_wake = self.late_wake or wakes

    async def handshake(self) -> bool:
        """Publish a close marker and read up to it; ``True`` when nothing came before it."""
        ctx, inbox = self._ctx, self._inbox
        self.closing = True
        self.late_send = False
        inbox.marker_seq += 1
        inbox.marker_seen.clear()
        timeout = ctx.settings.marker_timeout
        # The publish shares the marker's time limit: a log that stopped answering
        # must not keep the thread's lease (renewed on the lease provider's own
        # connection) until the driver's socket timeout. Whether the marker went
        # out is then unknown; closing is safe either way, because unsubscribing
        # hands whatever came before it back to the group.
        marker = Event(CLOSE_MARKER, {"session": self._sid, "seq": inbox.marker_seq})
        try:
            await asyncio.wait_for(ctx.log.publish(self._topic, marker), timeout)
        except TimeoutError:
            self._warn("publishing the close marker of session %s on %r took over %.1f s")
            return True
        waiters = [
            asyncio.ensure_future(inbox.marker_seen.wait()),
            asyncio.ensure_future(inbox.arrived.wait()),
            asyncio.ensure_future(self._lost.wait()),
        ]
        inbox.arrived.clear()
        try:
            if not inbox.has_work:
                done, _ = await asyncio.wait(
                    waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    self._warn("close marker of session %s on %r not read back within %.1f s")
        finally:
            for w in waiters:
                w.cancel()
        # Read up to the marker: a coalescing signal the carried ones wait for
        # is not coming to this session (settled, or read by a previous owner).
        if not self._lost.is_set() and (inbox.has_work or inbox.end_carry()):
            self.closing = False
            return False
        return True

    def _warn(self, what: str) -> None:
        timeout = self._ctx.settings.marker_timeout
        logger.warning(what + "; closing", self._sid, self._thread_key, timeout)
