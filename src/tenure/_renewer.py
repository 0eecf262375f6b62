"""The one component that keeps a lease renewed and decides when it is lost.

``hold`` and the thread runtime both hold leases through :class:`Renewer`, so
they agree on what "lost" means:

- a renewal is sent every ``every`` seconds, measured from when the last
  successful renewal (or the grant) was *sent*: the backend's TTL started no
  earlier, so the holder's view is never later than the backend's;
- the lease is lost once ``deadline`` seconds have passed since then without a
  successful renewal (default two thirds of the TTL, shorter than the TTL, so
  the holder gives up before anyone else can be granted the key);
- each call is abandoned when the deadline comes (a hung connection, a paused
  server); any exception counts as a failed attempt and is retried with
  backoff until the deadline; a refusal (``False``) loses the lease at once;
  a renewal that succeeds only after the deadline still loses it (the holder
  acted unsure of its lease in between);
- :meth:`check` compares the clock with the deadline itself, so a process that
  was paused (SIGSTOP, GC, swap) learns of the loss on its first look, before
  the renewal task has had a chance to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from . import telemetry
from ._contract import LeaseProvider
from ._errors import BackendClosed, InvalidArgument

__all__ = ["Renewer", "renew_timing"]

logger = logging.getLogger("tenure.renewer")

_MIN_BACKOFF = 0.025


def renew_timing(
    ttl_ms: int, renew_every_ms: float | None, renew_deadline_ms: float | None
) -> tuple[float, float]:
    """``(every, deadline)`` in seconds for a lease of ``ttl_ms``, checked.

    The defaults: renew every third of the TTL, count the lease lost two
    thirds of the TTL after the last successful renewal was sent. Either may
    be given in milliseconds; ``0 < every < deadline < ttl`` must hold.
    """
    deadline = 2 * ttl_ms / 3 if renew_deadline_ms is None else renew_deadline_ms
    every = ttl_ms / 3 if renew_every_ms is None else renew_every_ms
    for name, value in (("renew_every_ms", every), ("renew_deadline_ms", deadline)):
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise InvalidArgument(f"{name} must be a number of milliseconds, got {value!r}")
    if not 0 < deadline < ttl_ms:
        raise InvalidArgument(
            f"renew_deadline_ms must be > 0 and shorter than ttl_ms ({ttl_ms}), got {deadline}"
        )
    if not 0 < every < deadline:
        raise InvalidArgument(
            f"renew_every_ms must be > 0 and shorter than renew_deadline_ms ({deadline:g}), "
            f"got {every}"
        )
    return every / 1000, deadline / 1000


class Renewer:
    """Renews ``owner``'s lease on ``key`` in a background task; declares it lost.

    ``sent_at`` is the ``time.monotonic()`` at which the grant was requested;
    ``every`` and ``deadline`` are in seconds (``0 < every < deadline < ttl``).
    ``on_lost(reason)`` is called once, synchronously, when the lease is
    declared lost (never after :meth:`stop` was called with ``final=True``).
    """

    def __init__(
        self,
        provider: LeaseProvider,
        key: str,
        owner: str,
        ttl_ms: int,
        *,
        sent_at: float,
        every: float,
        deadline: float,
        on_lost: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.provider = provider
        self.key = key
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.every = every
        self.renew_deadline = deadline
        self.valid_from = sent_at
        self.lost = asyncio.Event()
        self.reason: str | None = None
        self.finished = False  # released or handed over: nothing is declared lost any more
        self.on_lost = on_lost
        self._clock = clock
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    @property
    def deadline(self) -> float:
        """The monotonic time at which the lease counts as lost without a renewal."""
        return self.valid_from + self.renew_deadline

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # -- the decision ---------------------------------------------------------

    def check(self) -> bool:
        """``True`` while the lease is held by this view; declares the loss once the deadline passed."""
        if self.lost.is_set():
            return False
        if self.finished:
            return True
        if self._clock() >= self.deadline:
            self.lose(self._deadline_reason(None))
            return False
        return True

    def lose(self, reason: str) -> None:
        """Declare the lease lost (once); renewal stops."""
        if self.lost.is_set() or self.finished:
            return
        self.reason = reason
        self.lost.set()
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        logger.warning("lease %r of %r lost: %s", self.key, self.owner, reason)
        telemetry.count("tenure.lease.lost")
        if self.on_lost is not None:
            self.on_lost(reason)

    def _deadline_reason(self, error: object) -> str:
        reason = (
            f"no renewal succeeded within the renew deadline of {self.renew_deadline * 1000:g} ms"
        )
        if error is not None:
            reason += f" (last error: {error})"
        return reason

    # -- the task -------------------------------------------------------------

    def start(self) -> None:
        if self.running or self.lost.is_set() or self.finished:
            return
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"tenure-renew-{self.key!r}"
        )

    async def stop(self, *, final: bool = False) -> None:
        """Stop renewing (waits for an in-flight call to be abandoned).

        ``final``: the lease is being released or handed over, so it can no
        longer be declared lost.
        """
        if final:
            self.finished = True
        task, self._task = self._task, None
        if task is None or task is asyncio.current_task():
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Run another operation on the lease (a transfer) with no renewal in flight."""
        async with self._lock:
            yield

    def moved(self, owner: str, sent_at: float) -> None:
        """The lease was handed to ``owner`` by a transfer sent at ``sent_at``; renew it as that."""
        self.owner = owner
        self.valid_from = sent_at

    async def _run(self) -> None:
        try:
            while not self.finished and not self.lost.is_set():
                await asyncio.sleep(max(0.0, self.valid_from + self.every - self._clock()))
                async with self._lock:
                    if self.finished or not await self._renew_once():
                        return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # A bug here must not end the renewal silently: the holder is told.
            logger.exception("renewal of lease %r failed unexpectedly", self.key)
            self.lose(f"the renewal task failed: {exc!r}")

    async def _renew_once(self) -> bool:
        """One renewal, retried until the renew deadline; ``False`` once the lease is lost."""
        delay = min(_MIN_BACKOFF, self.every / 4)
        error: object = None
        while True:
            deadline = self.deadline
            sent = self._clock()
            if sent >= deadline or self.lost.is_set():
                self.lose(self._deadline_reason(error))
                return False
            try:
                ok = await asyncio.wait_for(
                    self.provider.renew_lease(self.key, self.owner, self.ttl_ms),
                    timeout=deadline - sent,
                )
            except BackendClosed:
                self.lose("the backend was closed")
                return False
            except Exception as exc:
                error = (
                    "the renew call did not return in time"
                    if isinstance(exc, TimeoutError)
                    else repr(exc)
                )
                logger.warning(
                    "renewing lease %r of %r failed, retrying until the renew deadline: %s",
                    self.key,
                    self.owner,
                    error,
                )
                telemetry.count("tenure.lease.renew.failures", {"tenure.error": type(exc).__name__})
                await asyncio.sleep(max(0.0, min(delay, deadline - self._clock())))
                delay = min(delay * 2, self.every / 2)
                continue
            if not ok:
                self.lose(
                    "a renewal was refused: the backend reports the lease is no longer held by its owner"
                )
                return False
            if self._clock() >= deadline:
                self.lose(self._deadline_reason("the renewal succeeded only after it"))
                return False
            self.valid_from = sent
            return True
