"""What a run waits on for its next signal: one event and one timer.

An inbox sets its :class:`Wakeup` when a signal is buffered and when the
lease is lost, and its runs wait on it with a deadline (their idle timeout, a
debounce's quiet window). The deadline is kept by one timer per inbox, moved
only when it fires before the deadline of the wait under way: a run that
waits for each of its signals sets no timer of its own per signal.
"""

from __future__ import annotations

import asyncio

__all__ = ["Wakeup"]


class Wakeup:
    """An :class:`asyncio.Event` whose waits may end at a deadline."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        # The timer, and the deadline of the wait under way (the loop's clock).
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0
        self._waiting = False

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    async def wait(self) -> None:
        """Wait until :meth:`set`, with no deadline."""
        await self._event.wait()

    async def until(self, deadline: float) -> None:
        """Wait until :meth:`set` or the loop's clock reaches ``deadline``."""
        self._at = deadline
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(deadline, self._on_timer)
        self._waiting = True
        try:
            await self._event.wait()
        finally:
            self._waiting = False

    def cancel(self) -> None:
        """Stop the timer (the inbox's session ends)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        """The timer fired: wake the wait under way if its deadline has come."""
        self._timer = None
        if not self._waiting:
            return  # nobody waits: the next wait sets it again
        loop = asyncio.get_running_loop()
        if loop.time() >= self._at:
            self._event.set()
        else:
            self._timer = loop.call_at(self._at, self._on_timer)
