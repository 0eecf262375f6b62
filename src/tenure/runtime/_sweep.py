"""Sweeping: start a session for every thread of the namespace left with unfinished signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from .._errors import TenureError
from ._log import GROUP, RuntimeLog
from ._names import ThreadNames
from ._session import Session
from ._sessions import KNOWN_TOPICS, Sessions

__all__ = ["DORMANT_MAX", "Sweeper"]

logger = logging.getLogger("tenure.runtime")

#: At most how many sweep intervals apart a sweep looks at a thread whose
#: session ended at a persisted signal without a run.
DORMANT_MAX = 32


class Sweeper:
    """Every ``interval`` seconds (or when poked), asks the log which threads have
    signals not yet acknowledged (``Capability.BACKLOG``) and tries to take over
    each one this process does not own: a thread whose owner died is taken as
    soon as its lease expires; one whose sender died before anyone read its
    signal is started.

    A thread whose session here ended at a persisted signal without a run
    (nothing woke it) is looked at again after 2, 4, ... sweep intervals, at
    most :data:`DORMANT_MAX` intervals apart, rather than every sweep: the next
    sweep's session could only end there too, unless the thread was woken and
    its owner died meanwhile, which this bounds how late it notices."""

    def __init__(
        self,
        log: RuntimeLog,
        names: ThreadNames,
        sessions: Sessions,
        thread_lock: Callable[[str], AbstractAsyncContextManager[None]],
        interval: float,
    ) -> None:
        self._log = log
        self._names = names
        self._sessions = sessions
        self._thread_lock = thread_lock
        self._interval = interval
        self._now = asyncio.Event()
        # Threads whose lease the last sweep was refused: the holder it named.
        self._holders: dict[str, str] = {}
        # The sessions the sweeps opened, until they end; the threads whose
        # session ended at a persisted signal: when to look again, and the pause.
        self._opened: dict[str, Session] = {}
        self._dormant: dict[str, tuple[float, float]] = {}

    def poke(self) -> None:
        """Sweep now rather than at the next interval."""
        self._now.set()

    async def loop(self) -> None:
        while not self._sessions.closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._now.wait(), self._interval)
            self._now.clear()
            try:
                await self.sweep()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                # A callee's cancellation, not ours: one failed sweep, not the last.
                logger.warning("sweeping for unfinished threads was cancelled by a callee")
            except Exception as exc:
                logger.warning("sweeping for unfinished threads failed: %r", exc)

    async def sweep(self) -> None:
        """Start a session for every thread of the namespace with unfinished signals and no owner."""
        sessions = self._sessions
        # This process's own threads have an owner: asking about them would cost
        # the backend a look per live thread per sweep.
        names: list[str] = await self._log.backlog(
            self._names.prefix, GROUP, skip=sessions.topics()
        )
        # Only the holders seen by the previous sweep are kept: the one that refused
        # it then is the owner a takeover now replaces (it expired or let go since).
        holders, self._holders = self._holders, {}
        now = time.monotonic()
        self._note_dormant(names, now)
        for name in names:
            thread_key = self._names.thread_of(name)
            if thread_key is None or sessions.get(thread_key) is not None or sessions.closed:
                continue
            dormant = self._dormant.get(thread_key)
            if dormant is not None and now < dormant[0]:
                continue
            async with self._thread_lock(thread_key):
                if sessions.get(thread_key) is not None or sessions.closed:
                    continue
                try:
                    started, holder = await sessions.try_start(
                        thread_key, "takeover", previous=holders.get(thread_key)
                    )
                except TenureError as exc:
                    logger.warning("taking over %r: %s", thread_key, exc)
                    continue
                if started is not None:
                    self._opened[thread_key] = started
                elif holder is not None:
                    self._holders[thread_key] = holder

    def _note_dormant(self, names: list[str], now: float) -> None:
        """Learn how the sessions the sweeps opened ended; forget the threads
        that no longer have unfinished signals (``names``: those that do)."""
        for thread_key, session in list(self._opened.items()):
            if not session.ended.is_set():
                continue
            del self._opened[thread_key]
            if not session.slept:
                self._dormant.pop(thread_key, None)
                continue
            pause = self._dormant.get(thread_key, (0.0, self._interval))[1] * 2
            pause = min(pause, DORMANT_MAX * self._interval)
            self._dormant[thread_key] = (now + pause, pause)
        if self._dormant:
            waiting = {self._names.thread_of(name) for name in names}
            for thread_key in [k for k in self._dormant if k not in waiting]:
                del self._dormant[thread_key]
            if len(self._dormant) > KNOWN_TOPICS:
                self._dormant.clear()
