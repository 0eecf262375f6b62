"""Process-local waiters for lease wake-ups, shared by the backends.

A backend that can learn that a lease was released or transferred (its own
operation, a Redis message, a PostgreSQL notification, …) calls
:meth:`KeyWaiters.wake_one`. Only the longest-waiting local waiter of the key
wakes, so a release does not stampede every waiter of the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterator

__all__ = ["KeyWaiters"]


class KeyWaiters:
    def __init__(self) -> None:
        #: The waiters of each key, longest-waiting first; empty when nobody
        #: waits, which is what a release checks (a dict's truth costs no call).
        self.queues: dict[str, deque[asyncio.Future[None]]] = {}
        # Waiters in :meth:`wait`, by key: they have looked and now sleep.
        self._parked: dict[str, int] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def __bool__(self) -> bool:
        return bool(self.queues)

    def keys(self) -> list[str]:
        return list(self.queues)

    def parked(self, key: str) -> int:
        """How many waiters of ``key`` are asleep in :meth:`wait` (what a test waits for)."""
        return self._parked.get(key, 0)

    def register(self, key: str) -> asyncio.Future[None]:
        """A future that completes when this waiter is woken; register before you look."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queues.setdefault(key, deque()).append(fut)
        return fut

    def discard(self, key: str, fut: asyncio.Future[None]) -> None:
        """Forget a waiter that gives up; a wake-up it already received is passed on."""
        queue = self.queues.get(key)
        if queue is not None:
            try:
                queue.remove(fut)
            except ValueError:
                pass
            if not queue:
                del self.queues[key]
        if fut.done():
            if not fut.cancelled():
                self.wake_one(key)
        else:
            fut.cancel()

    def wake_one(self, key: str) -> bool:
        """Wake the longest-waiting waiter of ``key``; ``False`` if there is none."""
        queue = self.queues.get(key)
        while queue:
            fut = queue.popleft()
            if not fut.done():
                fut.set_result(None)
                if not queue:
                    del self.queues[key]
                return True
        self.queues.pop(key, None)
        return False

    def wake_all(self) -> None:
        """Wake every waiter (the backend lost track, e.g. after a reconnect)."""
        for queue in self.queues.values():
            for fut in queue:
                if not fut.done():
                    fut.set_result(None)
        self.queues.clear()

    async def wait(self, key: str, fut: asyncio.Future[None], timeout: float) -> bool:
        """Wait on a registered future; ``True`` if woken, ``False`` on timeout."""
        self._parked[key] = self._parked.get(key, 0) + 1
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=max(0.0, timeout))
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return True  # woken at the last moment: the wake-up is ours
            self.discard(key, fut)
            return False
        except BaseException:
            self.discard(key, fut)
            raise
        finally:
            left = self._parked[key] - 1
            if left:
                self._parked[key] = left
            else:
                del self._parked[key]
        return True

    @contextlib.contextmanager
    def all_woken_after(self, log: logging.Logger, failed: str, *args: object) -> Iterator[None]:
        """Wake every waiter when the listener in the block ends, however it ends: a
        release it can no longer report must not leave a waiter asleep. A failure is
        logged (``failed % (*args, type(exc).__name__)``), not raised; a cancellation
        passes."""
        try:
            yield
        except Exception as exc:
            log.warning(failed, *args, type(exc).__name__)
        finally:
            self.wake_all()
