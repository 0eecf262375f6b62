"""Holding leases on top of the five-method contract: ``hold``, ``acquire_wait``, ``renew_many``.

Everything here works with any lease provider. What a provider can do beyond
the five methods is read from its declared capabilities (:class:`tenure.Capability`),
with a fallback when it declares nothing:

- ``RECORD``, ``get_lease(key)``: the remaining TTL of the current holder, so a waiter sleeps
  exactly until the lease can expire (fallback: a bounded backoff).
- ``RELEASE_WAKEUPS``, ``wait_lease_released(key, timeout)``: wake a waiter as soon as the holder
  releases or transfers (fallback: sleep until the lease can expire).
- ``RENEW_MANY``, ``renew_leases(keys, owner, ttl_ms)``: renew many leases in one round trip
  (fallback: concurrent ``renew_lease`` calls, bounded).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
import warnings
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any

from . import telemetry
from ._contract import AcquireResult, Capability, LeaseProvider, LeaseRecord, capabilities_of
from ._errors import InvalidArgument, LeaseLost, LeaseUnavailable, unavailable_message
from ._renewer import Renewer, renew_timing
from ._validate import check_name, check_timeout, check_ttl

__all__ = ["HeldLease", "acquire_wait", "hold", "renew_many"]

logger = logging.getLogger("tenure.hold")

OnLost = Callable[["HeldLease"], Any]

# Fallback waiting when the provider cannot say how long the current lease lasts.
_MIN_BACKOFF = 0.025
_MAX_BACKOFF = 1.0
# Added to a holder's remaining TTL so a waiter does not wake a hair before expiry.
_EXPIRY_SLACK = 0.002
# Concurrent renew_lease calls in renew_many's fallback.
_RENEW_CONCURRENCY = 64

# Fire-and-forget tasks (on_lost coroutines, releases of abandoned leases): the
# event loop keeps only weak references to tasks, so they are kept alive here.
_background: set[asyncio.Task[Any]] = set()


def _spawn(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


def _extension(provider: object, capability: Capability, name: str) -> Callable[..., Any] | None:
    """The method behind a declared capability, or ``None`` when it is not declared."""
    if capability in capabilities_of(provider):
        method: Callable[..., Any] = getattr(provider, name)
        return method
    return None


# -- waiting -----------------------------------------------------------------


async def _acquire_wait(
    provider: LeaseProvider, key: str, owner: str, ttl_ms: int, timeout: float | None
) -> tuple[AcquireResult, float]:
    """``acquire_wait``'s loop; also returns when the winning request was sent (monotonic)."""
    started = time.monotonic()
    give_up = None if timeout is None else started + timeout
    wait_released = _extension(provider, Capability.RELEASE_WAKEUPS, "wait_lease_released")
    get_lease = _extension(provider, Capability.RECORD, "get_lease")
    backoff = _MIN_BACKOFF
    waited = False
    while True:
        sent = time.monotonic()
        result = await provider.acquire_lease(key, owner, ttl_ms)
        if result.acquired:
            if waited:  # how long the busy key took to come to this waiter
                telemetry.observe("tenure.lease.handoff.duration", time.monotonic() - started)
            return result, sent
        waited = True
        holder = result.owner
        left = math.inf if give_up is None else give_up - time.monotonic()
        if left <= 0:
            why = unavailable_message(key, holder, result.retry_after_ms)
            raise LeaseUnavailable(
                key,
                holder,
                f"{why}; gave up after waiting {timeout:g} s",
                retry_after_ms=result.retry_after_ms,
                reason=result.reason,
            )
        record: LeaseRecord | None = await get_lease(key) if get_lease is not None else None
        if record is not None:
            # Without a release the lease cannot end before its remaining TTL.
            nap = record.ttl_ms / 1000 + _EXPIRY_SLACK
            backoff = _MIN_BACKOFF
        elif get_lease is not None and backoff == _MIN_BACKOFF:
            # Freed between the two reads: try again at once, but only once in a row.
            nap = 0.0
            backoff *= 2
        else:
            nap = backoff
            backoff = min(backoff * 2, _MAX_BACKOFF)
        nap = min(nap, left)
        # Refused with no live lease to be seen (a Redis quarantine after a restart):
        # waiting for a release would return at once, so just sleep.
        live = record is not None or (get_lease is None and holder is not None)
        if wait_released is not None and live:
            # Returns early when the holder releases or transfers; only one local
            # waiter is woken per release, so the others keep sleeping.
            await wait_released(key, nap)
        else:
            await asyncio.sleep(nap)


async def acquire_wait(
    provider: LeaseProvider, key: str, owner: str, ttl_ms: int, *, timeout: float | None
) -> AcquireResult:
    """Acquire ``key`` for ``owner``, waiting while someone else holds it.

    Returns the grant (``acquired`` is always true). Raises
    :class:`~tenure.LeaseUnavailable` (``.holder`` names the last holder seen)
    when ``timeout`` seconds pass without a grant; ``timeout=None`` waits
    forever. ``timeout=0`` tries once.

    Never busy-polls. Between attempts the waiter sleeps until the current
    lease's remaining TTL has run out (read with the provider's ``get_lease``,
    or a bounded backoff of up to 1 s without it), and wakes at once when the
    holder releases or transfers if the provider has ``wait_lease_released``.
    Such a wake-up goes to one local waiter per release, so most waiters keep
    sleeping when one wins. When a holder dies without releasing, the waiters
    of this process all retry when its TTL ends; one wins.

    Errors from the provider (``BackendUnavailable``, ``BackendClosed``)
    propagate; retrying is safe.
    """
    check_name(key, "key")
    check_name(owner, "owner")
    check_ttl(ttl_ms)
    if timeout is not None:
        timeout = check_timeout(timeout)
    result, _ = await _acquire_wait(provider, key, owner, ttl_ms, timeout)
    return result


# -- many leases -------------------------------------------------------------


async def renew_many(
    provider: LeaseProvider, owner: str, keys: Iterable[str], ttl_ms: int
) -> set[str]:
    """Renew ``owner``'s leases on ``keys`` to a fresh ``ttl_ms``; returns the keys that were lost.

    A key is lost when ``owner`` no longer holds it (expired or taken over); a
    lost lease is never resurrected. Uses the provider's ``renew_leases`` when
    it has one (one round trip: a pipeline on Redis, one statement on SQL
    backends), otherwise concurrent ``renew_lease`` calls, at most 64 at once.

    Every argument is validated before anything is sent. If the backend fails,
    :class:`~tenure.BackendUnavailable` propagates and the outcome for each key is
    unknown (some may have been renewed); calling again is safe.
    """
    check_name(owner, "owner")
    check_ttl(ttl_ms)
    if isinstance(keys, str):
        raise InvalidArgument("keys must be an iterable of str, not a single str")
    key_list = [check_name(key, "key") for key in keys]
    if not key_list:
        return set()
    batch = _extension(provider, Capability.RENEW_MANY, "renew_leases")
    results: Sequence[bool]
    if batch is not None:
        results = await batch(key_list, owner, ttl_ms)
        if len(results) != len(key_list):
            raise RuntimeError(
                f"{type(provider).__name__}.renew_leases returned {len(results)} results "
                f"for {len(key_list)} keys"
            )
    else:
        results = await _renew_each(provider, key_list, owner, ttl_ms)
    return {key for key, ok in zip(key_list, results, strict=True) if not ok}


async def _renew_each(
    provider: LeaseProvider, keys: list[str], owner: str, ttl_ms: int
) -> list[bool]:
    results = [False] * len(keys)
    indexes = iter(range(len(keys)))

    async def worker() -> None:
        # Workers share one iterator, so at most _RENEW_CONCURRENCY calls are in flight.
        for i in indexes:
            results[i] = await provider.renew_lease(keys[i], owner, ttl_ms)

    workers = [asyncio.ensure_future(worker()) for _ in range(min(_RENEW_CONCURRENCY, len(keys)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return results


# -- holding -----------------------------------------------------------------


class _State:
    """A held lease: its :class:`Renewer` and what holding adds (the body, ``on_lost``).

    Kept apart from :class:`HeldLease` so that the renewal task never holds a
    strong reference to the lease object: a lease the user dropped can be
    collected (and warn) while its renewal is still scheduled.
    """

    def __init__(
        self,
        renewer: Renewer,
        token: int | None,
        on_lost: OnLost | None,
        cancel_on_loss: bool,
    ) -> None:
        self.renewer = renewer
        self.token = token
        renewer.on_lost = self._on_renewer_lost
        self.on_lost = on_lost
        self.cancel_on_loss = cancel_on_loss
        self.closed = False  # released, transferred or abandoned: nothing more to do
        self.loop = asyncio.get_running_loop()
        self.lease_ref: Callable[[], HeldLease | None] = lambda: None
        # The ``async with`` body, cancelled on loss; set by _Hold.__aenter__.
        self.body: asyncio.Task[Any] | None = None
        self.exiting = False
        self.cancelled_body = False

    @property
    def lost(self) -> asyncio.Event:
        return self.renewer.lost

    @property
    def reason(self) -> str | None:
        return self.renewer.reason

    def check(self) -> bool:
        """False once the lease is lost (the renew deadline passing counts, checked on the clock)."""
        return self.renewer.check()

    def _on_renewer_lost(self, reason: str) -> None:
        body = self.body
        # Whoever notices the loss, the body is cancelled, unless the body is the
        # one looking (``ensure_held`` then raises in it directly).
        if (
            self.cancel_on_loss
            and body is not None
            and not self.exiting
            and not body.done()
            and body is not asyncio.current_task()
        ):
            self.cancelled_body = True
            body.cancel(f"lease {self.renewer.key!r} lost: {reason}")
        lease = self.lease_ref()
        if self.on_lost is not None and lease is not None:
            try:
                outcome = self.on_lost(lease)
            except Exception:
                logger.exception("on_lost callback for lease %r raised", self.renewer.key)
            else:
                if inspect.isawaitable(outcome):
                    _spawn(self._await_callback(outcome), f"tenure-on-lost-{self.renewer.key!r}")

    async def _await_callback(self, outcome: Awaitable[Any]) -> None:
        try:
            await outcome
        except Exception:
            logger.exception("on_lost callback for lease %r raised", self.renewer.key)

    def abandon(self) -> None:
        """The lease object was collected unreleased: stop renewing and release it."""
        if self.closed:
            return
        self.closed = True
        _spawn(self._release_quietly(), f"tenure-release-{self.renewer.key!r}")

    async def _release_quietly(self) -> None:
        await self.renewer.stop(final=True)
        try:
            await self.renewer.provider.release_lease(self.renewer.key, self.renewer.owner)
        except Exception as exc:
            logger.warning(
                "releasing abandoned lease %r failed; it expires in at most %d ms: %r",
                self.renewer.key,
                self.renewer.ttl_ms,
                exc,
            )


class _LeaseView:
    """What a held lease, async or blocking, tells of itself: read from its hold's state."""

    __slots__ = ("_s",)

    def __init__(self, state: _State) -> None:
        self._s = state

    @property
    def key(self) -> str:
        return self._s.renewer.key

    @property
    def owner(self) -> str:
        return self._s.renewer.owner

    @property
    def token(self) -> int | None:
        return self._s.token

    @property
    def ttl_ms(self) -> int:
        return self._s.renewer.ttl_ms

    @property
    def lost_reason(self) -> str | None:
        return self._s.reason

    def _release_failed(self, log: logging.Logger, error: Exception) -> None:
        log.warning(
            "releasing lease %r failed; it expires in at most %d ms: %r",
            self.key,
            self.ttl_ms,
            error,
        )


class HeldLease(_LeaseView):
    """A lease this process holds and renews in the background (see :func:`hold`).

    ``token`` is the fencing token of the grant (``None`` from a provider
    without tokens, like the no-op provider): pass it to every downstream
    write so a store can reject a stale owner (see :mod:`tenure.fencing`).

    ``lost`` is set as soon as the lease is considered lost: the backend
    refused a renewal, or no renewal succeeded before the renew deadline
    (shorter than the TTL, so the holder gives up before anyone else can be
    granted the key). Once lost, a lease stays lost and is not renewed again.

    Drop a lease only after :meth:`release` or a successful :meth:`transfer_to`:
    a lease collected while still held emits a ``ResourceWarning`` and is
    released in the background.
    """

    __slots__ = ("__weakref__",)

    @property
    def lost(self) -> asyncio.Event:
        """Set when the lease is lost (never for a lease that was released or transferred)."""
        return self._s.lost

    @property
    def held(self) -> bool:
        """True while the lease is held: not lost, released or transferred, and renewed in time.

        Checks the renew deadline against the clock itself, so it is accurate
        even when the event loop was stalled and the renewal task has not run;
        finding it passed marks the lease lost (``lost`` is set and ``on_lost``
        called) without cancelling the caller.
        """
        s = self._s
        return not s.closed and s.check()

    def ensure_held(self) -> None:
        """Raise :class:`~tenure.LeaseLost` unless the lease is held (call it before acting)."""
        s = self._s
        if s.closed and not s.lost.is_set():
            raise LeaseLost(s.renewer.key, s.renewer.owner, "it was released or transferred")
        if not s.check():
            raise LeaseLost(s.renewer.key, s.renewer.owner, s.reason or "lost")

    async def transfer_to(self, new_owner: str, ttl_ms: int | None = None) -> bool:
        """Hand the lease to ``new_owner`` with no gap (``transfer_lease``); stop renewing it.

        ``ttl_ms`` defaults to this lease's TTL. True when handed over; False
        when this owner no longer held it (the lease is then marked lost, and
        ``new_owner`` should fall back to acquiring). Renewal goes on until the
        transfer succeeds, so if the backend fails (the error propagates, the
        outcome is unknown) or the call is cancelled, the next renewal tells
        whether the lease is still ours.
        """
        check_name(new_owner, "new_owner")
        s = self._s
        ttl = s.renewer.ttl_ms if ttl_ms is None else check_ttl(ttl_ms)
        if s.closed:
            return False
        renewer = s.renewer
        async with renewer.paused():
            if s.closed or not renewer.check():
                return False
            ok = await s.renewer.provider.transfer_lease(
                s.renewer.key, s.renewer.owner, new_owner, ttl
            )
            if ok:
                s.closed = True
                renewer.finished = True
        if not ok:
            renewer.lose("the transfer found the lease no longer held by its owner")
            return False
        await renewer.stop(final=True)
        return True

    async def release(self) -> None:
        """Stop renewing and release the lease; idempotent.

        The release is atomic on the backend and does nothing if someone else
        holds the key by now. If the backend fails, ``BackendUnavailable``
        propagates and the lease expires within its TTL, as it is no longer
        renewed.
        """
        s = self._s
        if s.closed:
            return
        s.closed = True
        await s.renewer.stop(final=True)
        await s.renewer.provider.release_lease(s.renewer.key, s.renewer.owner)

    def __repr__(self) -> str:
        s = self._s
        state = "released" if s.closed else "lost" if s.lost.is_set() else "held"
        return f"HeldLease(key={s.renewer.key!r}, owner={s.renewer.owner!r}, token={s.token!r}, {state})"

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        s = self._s
        if s.closed:
            return
        _warn(
            f"{self!r} was garbage-collected without release(); releasing it in the background",
            ResourceWarning,
            stacklevel=1,
        )
        if s.loop.is_closed():
            return
        if _running_loop() is s.loop:
            s.abandon()
        else:
            s.loop.call_soon_threadsafe(s.abandon)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Hold:
    """What :func:`hold` returns: an async context manager, or ``await ….start()``."""

    def __init__(
        self,
        provider: LeaseProvider,
        key: str,
        owner: str,
        ttl_ms: int,
        renew_every_ms: float | None,
        renew_deadline_ms: float | None,
        on_lost: OnLost | None,
        cancel_on_loss: bool,
        wait: float | None,
    ) -> None:
        self._provider = provider
        self._key = check_name(key, "key")
        self._owner = check_name(owner, "owner")
        self._ttl_ms = check_ttl(ttl_ms)
        self._every, self._deadline = renew_timing(self._ttl_ms, renew_every_ms, renew_deadline_ms)
        if on_lost is not None and not callable(on_lost):
            raise InvalidArgument(f"on_lost must be callable, got {type(on_lost).__name__}")
        self._on_lost = on_lost
        self._cancel_on_loss = bool(cancel_on_loss)
        self._wait = None if wait is None else check_timeout(wait, "wait")
        self._lease: HeldLease | None = None

    async def start(self) -> HeldLease:
        """Acquire the lease and start renewing it; raises ``LeaseUnavailable`` if held by another.

        With ``start()`` there is no ``async with`` body, so a loss is only
        signalled (``lost``, ``on_lost``); call :meth:`HeldLease.release` when done.
        """
        if self._lease is not None:
            raise RuntimeError("this hold() was already started; call hold() again")
        if self._wait == 0:
            sent = time.monotonic()
            result = await self._provider.acquire_lease(self._key, self._owner, self._ttl_ms)
            if not result.acquired:
                raise LeaseUnavailable(
                    self._key,
                    result.owner,
                    retry_after_ms=result.retry_after_ms,
                    reason=result.reason,
                )
        else:
            result, sent = await _acquire_wait(
                self._provider, self._key, self._owner, self._ttl_ms, self._wait
            )
        renewer = Renewer(
            self._provider,
            self._key,
            self._owner,
            self._ttl_ms,
            sent_at=sent,
            every=self._every,
            deadline=self._deadline,
        )
        state = _State(renewer, result.token, self._on_lost, self._cancel_on_loss)
        lease = HeldLease(state)
        state.lease_ref = weakref.ref(lease)
        state.renewer.start()
        self._lease = lease
        return lease

    async def __aenter__(self) -> HeldLease:
        lease = await self.start()
        lease._s.body = asyncio.current_task()
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._lease
        assert lease is not None
        s = lease._s
        # A body that finished after the renew deadline ran past its safe window
        # without being told: found here, it is a loss like any other.
        lost_at_exit = exc_type is None and not s.closed and not s.lost.is_set() and not s.check()
        s.exiting = True
        # Our own cancellation may not have reached the body (it finished first):
        # then it is still pending and would hit the release below.
        ours_pending = False
        others_cancelled = False
        if s.cancelled_body and s.body is not None:
            others_cancelled = s.body.uncancel() > 0
            ours_pending = exc_type is not asyncio.CancelledError
        release = _spawn(self._release(lease), f"tenure-release-{s.renewer.key!r}")
        if ours_pending and s.body is not None:
            # Delivered here if it is still pending; if the body swallowed it,
            # nothing comes, and a cancellation that arrives while we wait for
            # the release below is not ours to take. One delivery stands for
            # every request made so far: with another's among them (counted by
            # the task once ours was taken back), it goes on.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                if others_cancelled or s.body.cancelling():
                    raise
        # From here a cancellation came from outside: the release carries on by itself.
        await asyncio.shield(release)
        if (
            s.cancelled_body
            and not others_cancelled
            and (exc_type is None or exc_type is asyncio.CancelledError)
        ) or (lost_at_exit and s.cancel_on_loss):
            raise LeaseLost(s.renewer.key, s.renewer.owner, s.reason or "lost") from exc

    @staticmethod
    async def _release(lease: HeldLease) -> None:
        try:
            await lease.release()
        except Exception as exc:
            lease._release_failed(logger, exc)


def hold(
    provider: LeaseProvider,
    key: str,
    owner: str,
    ttl_ms: int,
    *,
    renew_every_ms: float | None = None,
    renew_deadline_ms: float | None = None,
    on_lost: OnLost | None = None,
    cancel_on_loss: bool = True,
    wait: float | None = 0,
) -> _Hold:
    """Hold ``key`` for ``owner``: acquire, renew in the background, release on exit.

    ::

        async with tenure.hold(provider, key, owner, ttl_ms=30_000) as lease:
            await store.write(key, lease.token, value)

    Acquiring raises :class:`~tenure.LeaseUnavailable` (naming the holder) when
    another owner holds the key; ``wait`` seconds (``None``: forever) makes it
    wait like :func:`acquire_wait` first. Holding a key this owner already
    holds (for instance one received with ``transfer_lease``) keeps its token.

    Renewal runs every ``renew_every_ms`` (default a third of the TTL). The lease
    is *lost* when the backend refuses a renewal, or when no renewal has
    succeeded within ``renew_deadline_ms`` (default two thirds of the TTL) of
    the previous one being sent; failing calls are retried until then. This
    deadline is shorter than the TTL, so the holder stops considering itself
    the owner before the backend can grant the key to someone else (assuming
    clock rates agree to within the margin). On loss: ``lease.lost`` is set,
    ``on_lost(lease)`` is called (a coroutine it returns is run in a task), and
    with ``cancel_on_loss`` (default) the body of the ``async with`` is
    cancelled and the block raises :class:`~tenure.LeaseLost`.

    On exit (normal, exception or cancellation) renewal stops and the lease is
    released; a failing release is logged, not raised (the lease then expires
    within its TTL). ``await hold(...).start()`` returns the lease without a
    body (loss is only signalled); call ``await lease.release()`` when done.
    """
    return _Hold(
        provider,
        key,
        owner,
        ttl_ms,
        renew_every_ms,
        renew_deadline_ms,
        on_lost,
        cancel_on_loss,
        wait,
    )
