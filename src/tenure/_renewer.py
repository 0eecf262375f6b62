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

The renewals themselves are sent by :class:`Renewals`, one loop for a set of
leases of one provider: a lease held alone (``hold``) has a set of its own; a
process that holds many (the thread runtime) puts them all in one, and their
renewals go together in one call (``renew_owned``, one round trip), once per
renew interval. Each lease's deadline is still its own: a lease the batch
reports refused is lost alone; a batch that fails or hangs counts against
every lease in it, each lost at its own deadline, never later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import cast

from . import telemetry
from ._contract import Backend, Capability, LeaseProvider, capabilities_of
from ._errors import BackendClosed, InvalidArgument

__all__ = ["Renewals", "Renewer", "renew_timing"]

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
    """Keeps ``owner``'s lease on ``key`` renewed (through ``renewals``); declares it lost.

    ``sent_at`` is the ``time.monotonic()`` at which the grant was requested;
    ``every`` and ``deadline`` are in seconds (``0 < every < deadline < ttl``).
    ``on_lost(reason)`` is called once, synchronously, when the lease is
    declared lost (never after :meth:`stop` was called with ``final=True``).
    ``renewals``: the loop that renews it with others of the same provider and
    TTL; without one, it gets a loop of its own.
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
        renewals: Renewals | None = None,
    ) -> None:
        if renewals is None:
            renewals = Renewals(provider, ttl_ms, clock=clock)
        elif renewals.provider is not provider or renewals.ttl_ms != ttl_ms:
            raise ValueError("a lease joins only the renewals of its own provider and TTL")
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
        self._renewals = renewals
        # Held while a renewal of this lease is in flight, or another operation
        # on it (a transfer, see paused): never both at once.
        self._lock = asyncio.Lock()

    @property
    def deadline(self) -> float:
        """The monotonic time at which the lease counts as lost without a renewal."""
        return self.valid_from + self.renew_deadline

    @property
    def due(self) -> float:
        """The monotonic time at which the next renewal is to be sent."""
        return self.valid_from + self.every

    @property
    def alive(self) -> bool:
        """Neither lost nor finished: still to be renewed."""
        return not self.finished and not self.lost.is_set()

    @property
    def running(self) -> bool:
        return self._renewals.renews(self)

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
        self._renewals.discard(self)
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

    # -- renewing -------------------------------------------------------------

    def start(self) -> None:
        if self.alive:
            self._renewals.add(self)

    async def stop(self, *, final: bool = False) -> None:
        """Stop renewing (waits for an in-flight call to be abandoned, unless the call
        renews other leases too: then its answer for this one is ignored).

        ``final``: the lease is being released or handed over, so it can no
        longer be declared lost.
        """
        if final:
            self.finished = True
        await self._renewals.remove(self)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Run another operation on the lease (a transfer) with no renewal in flight."""
        try:
            async with self._lock:
                yield
        finally:
            self._renewals.wake_for(self)  # it may be due, and was left out meanwhile

    def moved(self, owner: str, sent_at: float) -> None:
        """The lease was handed to ``owner`` by a transfer sent at ``sent_at``; renew it as that."""
        self.owner = owner
        self.valid_from = sent_at


class Renewals:
    """One loop that renews a set of leases of one provider and TTL together.

    Every lease due within half its renew interval is renewed in the same
    call, so leases that join at different times fall into step after one
    interval: one call per interval for all of them. One lease alone is
    renewed with ``renew_lease``; many with ``renew_owned`` when the provider
    declares ``Capability.RENEW_OWNED``, else each with its own call, as if
    alone. A call in flight does not hold the others up: each one runs in a
    task of its own, and watches the deadlines of the leases in it.
    """

    def __init__(
        self, provider: LeaseProvider, ttl_ms: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.provider = provider
        self.ttl_ms = ttl_ms
        self._clock = clock
        self._batched = Capability.RENEW_OWNED in capabilities_of(provider)
        self._members: dict[Renewer, None] = {}  # in the order they joined
        self._calls: dict[asyncio.Task[None], list[Renewer]] = {}
        self._wake = asyncio.Event()
        # When the loop looks next (inf: it waits to be woken). Only a lease due
        # before then wakes it, so that starting thousands of leases does not
        # cost a look at every lease each.
        self._next = math.inf
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._members)

    def renews(self, renewer: Renewer) -> bool:
        """Whether ``renewer``'s lease is being renewed here now."""
        return renewer in self._members and self._task is not None and not self._task.done()

    def wake_for(self, renewer: Renewer) -> None:
        """``renewer`` may be due before the loop's next look (it joined, or a transfer ended)."""
        if renewer.due < self._next:
            self._wake.set()

    def add(self, renewer: Renewer) -> None:
        self._members[renewer] = None
        self.wake_for(renewer)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"tenure-renew-{renewer.key!r}"
            )

    def discard(self, renewer: Renewer) -> None:
        """Renew ``renewer`` no more; a call in flight for it alone is abandoned."""
        self._members.pop(renewer, None)
        if not self._members:
            self._wake.set()  # the loop ends
        current = asyncio.current_task()
        for task, batch in list(self._calls.items()):
            if task is not current and renewer in batch and not any(m.alive for m in batch):
                task.cancel()

    async def remove(self, renewer: Renewer) -> None:
        """:meth:`discard`, then wait for the calls it was alone in to be abandoned
        (a call that renews other leases too goes on; its answer for this one is ignored)."""
        self.discard(renewer)
        current = asyncio.current_task()
        alone = [
            task
            for task, batch in self._calls.items()
            if task is not current
            and renewer in batch
            and not any(m.alive and m is not renewer for m in batch)
        ]
        for task in alone:
            task.cancel()
        if alone:
            await asyncio.gather(*alone, return_exceptions=True)
        if not self._members and self._task is not None and self._task is not current:
            task, self._task = self._task, None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop every renewal (the leases are left as they are)."""
        self._members.clear()
        tasks = [*self._calls, *([self._task] if self._task is not None else [])]
        self._task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the loop -------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while self._members:
                self._wake.clear()
                now = self._clock()
                # A lease with a renewal or a transfer in flight waits for it.
                free = [m for m in self._members if m.alive and not m._lock.locked()]
                first = min((m.due for m in free), default=None)
                if first is None or first > now:
                    self._next = math.inf if first is None else first
                    timeout = None if first is None else first - now
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout)
                    continue
                batch = [m for m in free if m.due <= now + m.every / 2]
                groups = [batch] if self._batched or len(batch) == 1 else [[m] for m in batch]
                for group in groups:
                    for m in group:
                        # Free (checked above): taken at once, without a suspension.
                        await m._lock.acquire()
                    task = asyncio.get_running_loop().create_task(
                        self._renew(group), name=f"tenure-renew-{len(group)}"
                    )
                    self._calls[task] = group
                    task.add_done_callback(self._call_ended)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # A bug here must not end the renewals silently: the holders are told.
            logger.exception("the renewal loop failed unexpectedly")
            for m in list(self._members):
                m.lose(f"the renewal task failed: {exc!r}")

    def _call_ended(self, task: asyncio.Task[None]) -> None:
        for m in self._calls.pop(task, ()):
            if m._lock.locked():
                m._lock.release()
            if m.alive:
                self.wake_for(m)

    async def _renew(self, batch: list[Renewer]) -> None:
        """One renewal of every lease in ``batch``, retried until each one's deadline."""
        try:
            await self._renew_until_done(batch)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            what = f"lease {batch[0].key!r}" if len(batch) == 1 else f"{len(batch)} leases"
            logger.exception("renewal of %s failed unexpectedly", what)
            for m in batch:
                m.lose(f"the renewal task failed: {exc!r}")

    async def _renew_until_done(self, batch: list[Renewer]) -> None:
        every = min(m.every for m in batch)
        delay = min(_MIN_BACKOFF, every / 4)
        error: object = None
        while True:
            sent = self._clock()
            for m in batch:
                if m.alive and sent >= m.deadline:
                    m.lose(m._deadline_reason(error))
            pending = [m for m in batch if m.alive]
            if not pending:
                return
            call = asyncio.ensure_future(self._send(pending))
            try:
                await self._watch(call, pending, "the renew call did not return in time")
            finally:
                if not call.done():
                    call.cancel()
                    await asyncio.gather(call, return_exceptions=True)
            if call.cancelled():
                # Every lease in it was lost (at its deadline) or let go meanwhile:
                # for the lost ones, a renewal that did not return in time.
                hung = sum(1 for m in pending if m.lost.is_set())
                if hung:
                    telemetry.count(
                        "tenure.lease.renew.failures", {"tenure.error": "TimeoutError"}, amount=hung
                    )
                return
            exc = call.exception()
            if isinstance(exc, BackendClosed):
                for m in pending:
                    m.lose("the backend was closed")
                return
            if exc is not None:
                if not isinstance(exc, Exception):
                    raise exc
                error = _failed(pending, exc)
                soonest = min(m.deadline for m in pending)
                await asyncio.sleep(max(0.0, min(delay, soonest - self._clock())))
                delay = min(delay * 2, every / 2)
                continue
            self._renewed(pending, call.result(), sent)
            return

    def _renewed(self, pending: list[Renewer], results: list[bool], sent: float) -> None:
        """Apply the answers of a renew call sent at ``sent`` to the leases in it."""
        now = self._clock()
        for m, ok in zip(pending, results, strict=True):
            if not m.alive:
                continue  # lost at its deadline while the call was in flight, or released
            if not ok:
                m.lose(
                    "a renewal was refused: the backend reports the lease is no longer "
                    "held by its owner"
                )
            elif now >= m.deadline:
                m.lose(m._deadline_reason("the renewal succeeded only after it"))
            else:
                m.valid_from = sent

    async def _send(self, pending: list[Renewer]) -> list[bool]:
        if len(pending) == 1:
            m = pending[0]
            return [await self.provider.renew_lease(m.key, m.owner, self.ttl_ms)]
        results = await cast(Backend, self.provider).renew_owned(
            [(m.key, m.owner) for m in pending], self.ttl_ms
        )
        if len(results) != len(pending):
            raise RuntimeError(
                f"{type(self.provider).__name__}.renew_owned returned {len(results)} results "
                f"for {len(pending)} leases"
            )
        return results

    async def _watch(
        self, call: asyncio.Future[list[bool]], pending: list[Renewer], why: str
    ) -> None:
        """Wait for ``call``; each lease in it still waiting at its deadline is lost then."""
        while not call.done():
            live = [m for m in pending if m.alive]
            if not live:
                return
            timeout = min(m.deadline for m in live) - self._clock()
            if timeout > 0:
                await asyncio.wait([call], timeout=timeout)
                continue
            now = self._clock()
            for m in live:
                if now >= m.deadline:
                    m.lose(m._deadline_reason(why))


def _failed(pending: list[Renewer], exc: Exception) -> str:
    """Log and count a renew call of ``pending`` that raised ``exc``; why it failed."""
    error = "the renew call did not return in time" if isinstance(exc, TimeoutError) else repr(exc)
    logger.warning(
        "renewing %s failed, retrying until the renew deadline: %s",
        f"lease {pending[0].key!r} of {pending[0].owner!r}"
        if len(pending) == 1
        else f"{len(pending)} leases",
        error,
    )
    telemetry.count(
        "tenure.lease.renew.failures", {"tenure.error": type(exc).__name__}, amount=len(pending)
    )
    return error
