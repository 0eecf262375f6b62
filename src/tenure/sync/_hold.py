"""Blocking ``hold``, ``acquire_wait``, ``renew_many`` and ``singleton``, over the async ones.

The lease is acquired and renewed on tenure's loop thread by the same
:class:`~tenure._renewer.Renewer` as :func:`tenure.hold`; the body runs in the
caller's thread. A thread cannot be cancelled, so where the async ``hold``
cancels its body on loss, the blocking one tells the body: ``lease.held`` and
``lease.ensure_held()`` read the loss (or the renew deadline passing, checked
on the clock in the caller's thread, so a stalled loop cannot hide it) and the
``with`` block raises :class:`~tenure.LeaseLost` at its exit.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from .._contract import AcquireResult
from .._errors import InvalidArgument, LeaseLost, TenureError
from .._hold import HeldLease, _Hold, _LeaseView
from .._hold import acquire_wait as async_acquire_wait
from .._hold import renew_many as async_renew_many
from . import _portal
from ._backend import SyncBackend, from_url
from ._portal import call

__all__ = [
    "SyncHeldLease",
    "acquire_wait",
    "current_lease",
    "hold",
    "renew_many",
    "singleton",
]

logger = logging.getLogger("tenure.sync")

_P = ParamSpec("_P")
_R = TypeVar("_R")

SyncOnLost = Callable[["SyncHeldLease"], Any]

_current: contextvars.ContextVar[SyncHeldLease | None] = contextvars.ContextVar(
    "tenure_sync_current_lease", default=None
)


def _backend(backend: object) -> SyncBackend:
    if not isinstance(backend, SyncBackend):
        raise InvalidArgument(
            f"backend must come from tenure.sync.from_url(), got {type(backend).__name__} "
            "(an async backend belongs to its own event loop: use tenure.hold there)"
        )
    return backend


class SyncHeldLease(_LeaseView):
    """A lease held by :func:`hold`, renewed on tenure's loop thread while the body runs.

    ``token`` is the fencing token of the grant: pass it to every downstream
    write. ``lost`` is a :class:`threading.Event`, set when the lease is
    declared lost; ``held`` and :meth:`ensure_held` also compare the renew
    deadline with the clock themselves. Safe to read from any thread.
    """

    __slots__ = ("__weakref__", "_lease", "_lost", "_pid")

    def __init__(self, lease: HeldLease, lost: threading.Event) -> None:
        super().__init__(lease._s)
        self._lease = lease
        self._lost = lost
        self._pid = os.getpid()

    @property
    def lost(self) -> threading.Event:
        """Set when the lease is lost (never for a lease that was released or transferred)."""
        return self._lost

    def _failure(self) -> str | None:
        """Why the lease is not held now, or ``None`` while it is."""
        s = self._s
        if os.getpid() != self._pid:
            return "it belongs to the process that forked this one"
        if self._lost.is_set():
            return s.reason or "lost"
        if s.closed:
            return "it was released or transferred"
        if time.monotonic() >= s.renewer.deadline:
            # The loop has not noticed yet (it may be stalled): have it declare
            # the loss, so ``lost`` is set and ``on_lost`` called there.
            loop = s.loop
            if not loop.is_closed():
                loop.call_soon_threadsafe(s.check)
            return s.renewer._deadline_reason(None)
        return None

    @property
    def held(self) -> bool:
        """True while the lease is held: not lost, released or transferred, and renewed in time."""
        return self._failure() is None

    def ensure_held(self) -> None:
        """Raise :class:`~tenure.LeaseLost` unless the lease is held (call it before acting)."""
        reason = self._failure()
        if reason is not None:
            raise LeaseLost(self.key, self.owner, reason)

    def release(self) -> None:
        """Stop renewing and release the lease; idempotent (see :meth:`tenure.HeldLease.release`)."""
        if os.getpid() == self._pid:
            call(self._lease.release)

    def transfer_to(self, new_owner: str, ttl_ms: int | None = None) -> bool:
        """Hand the lease to ``new_owner`` with no gap (see :meth:`tenure.HeldLease.transfer_to`)."""
        if os.getpid() != self._pid:
            return False
        return call(self._lease.transfer_to, new_owner, ttl_ms)

    def __repr__(self) -> str:
        return "Sync" + repr(self._lease)


class _SyncHold:
    """What :func:`hold` returns: a context manager, or ``.start()`` for a lease without a body."""

    def __init__(
        self,
        backend: SyncBackend,
        key: str,
        owner: str,
        ttl_ms: int,
        renew_every_ms: float | None,
        renew_deadline_ms: float | None,
        on_lost: SyncOnLost | None,
        wait: float | None,
    ) -> None:
        if on_lost is not None and not callable(on_lost):
            raise InvalidArgument(f"on_lost must be callable, got {type(on_lost).__name__}")
        self._backend = backend
        self._user_on_lost = on_lost
        self._lost = threading.Event()
        self._lease: SyncHeldLease | None = None
        self._reset: contextvars.Token[SyncHeldLease | None] | None = None
        # Built here so that a bad argument raises in the caller before any I/O.
        self._hold = _Hold(
            backend.backend,
            key,
            owner,
            ttl_ms,
            renew_every_ms,
            renew_deadline_ms,
            self._on_lost,
            False,  # a thread cannot be cancelled: the body is told instead
            wait,
        )

    def _on_lost(self, lease: HeldLease) -> None:
        # On the loop thread: never run the user's function here, it may block.
        self._lost.set()
        user, sync_lease = self._user_on_lost, self._lease
        if user is not None and sync_lease is not None:
            try:
                _portal.portal().callbacks.submit(self._run_user_on_lost, user, sync_lease)
            except RuntimeError:
                # The pool takes no new work (interpreter shutdown): the user's
                # function still runs, in a thread of its own.
                threading.Thread(
                    target=self._run_user_on_lost,
                    args=(user, sync_lease),
                    name="tenure-sync-on-lost",
                    daemon=True,
                ).start()

    @staticmethod
    def _run_user_on_lost(user: SyncOnLost, lease: SyncHeldLease) -> None:
        try:
            user(lease)
        except Exception:
            logger.exception("on_lost callback for lease %r raised", lease.key)

    def start(self) -> SyncHeldLease:
        """Acquire and start renewing; raises ``LeaseUnavailable`` if another owner holds the key.

        Without a ``with`` body, a loss is only signalled (``lost``, ``on_lost``);
        call :meth:`SyncHeldLease.release` when done.
        """
        if self._lease is not None:
            raise RuntimeError("this hold() was already started; call hold() again")
        lease = SyncHeldLease(call(self._hold.start, what="hold()"), self._lost)
        self._lease = lease
        _portal.on_fork(self)
        return lease

    def _after_fork_in_child(self) -> None:
        # The parent's lease: never released or finalised from the child.
        _portal._inherited.append(self._lease)

    def __enter__(self) -> SyncHeldLease:
        lease = self.start()
        self._reset = _current.set(lease)
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._lease
        assert lease is not None
        if self._reset is not None:
            _current.reset(self._reset)
            self._reset = None
        s = lease._s
        lost = lease._failure() if not s.closed or self._lost.is_set() else None
        try:
            lease.release()
        except Exception as error:
            lease._release_failed(logger, error)
        if exc_type is None and lost is not None:
            raise LeaseLost(lease.key, lease.owner, lost)


def hold(
    backend: SyncBackend,
    key: str,
    owner: str,
    ttl_ms: int,
    *,
    renew_every_ms: float | None = None,
    renew_deadline_ms: float | None = None,
    on_lost: SyncOnLost | None = None,
    wait: float | None = 0,
) -> _SyncHold:
    """Hold ``key`` for ``owner`` in a ``with`` block: acquire, renew in the background, release.

    ::

        with tenure.sync.hold(backend, "invoice-7", "worker-a", ttl_ms=30_000) as lease:
            store.write("invoice-7", value, token=lease.token)

    The blocking twin of :func:`tenure.hold`, with the same arguments and the
    same meaning of a loss (a refused renewal, or none succeeding within
    ``renew_deadline_ms``, two thirds of the TTL by default). Renewal runs on
    tenure's loop thread. The body runs in the caller's thread and is not
    interrupted on loss: ``lease.ensure_held()`` raises :class:`~tenure.LeaseLost`
    from then on, ``lease.held`` turns false, ``on_lost(lease)`` runs in a worker
    thread, and a body that ends normally after the loss makes the block raise
    ``LeaseLost``. Acquiring raises :class:`~tenure.LeaseUnavailable` (naming the
    holder) when another owner holds the key; ``wait`` seconds (``None``:
    forever) waits for it first. The lease is released at exit, also on an
    exception. :func:`current_lease` returns it inside the block.
    """
    return _SyncHold(
        _backend(backend), key, owner, ttl_ms, renew_every_ms, renew_deadline_ms, on_lost, wait
    )


def current_lease() -> SyncHeldLease:
    """The lease of the innermost :func:`hold` block or :func:`singleton` call running in this thread.

    Raises :class:`~tenure.TenureError` outside of one.
    """
    lease = _current.get()
    if lease is None:
        raise TenureError(
            "tenure.sync.current_lease() was called outside a tenure.sync.hold() block "
            "and outside a @tenure.sync.singleton call"
        )
    return lease


def acquire_wait(
    backend: SyncBackend, key: str, owner: str, ttl_ms: int, *, timeout: float | None
) -> AcquireResult:
    """The blocking twin of :func:`tenure.acquire_wait` (woken by releases, never busy-polling)."""
    inner = _backend(backend).backend
    return call(
        functools.partial(async_acquire_wait, timeout=timeout),
        inner,
        key,
        owner,
        ttl_ms,
        what="acquire_wait()",
    )


def renew_many(backend: SyncBackend, owner: str, keys: Iterable[str], ttl_ms: int) -> set[str]:
    """The blocking twin of :func:`tenure.renew_many`: renews in one round trip; returns the lost keys."""
    inner = _backend(backend).backend
    return call(async_renew_many, inner, owner, keys, ttl_ms, what="renew_many()")


def _default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"


def _resolver(backend: SyncBackend | str) -> Callable[[], SyncBackend]:
    """The backend of each call: ``backend``, or one made from the URL at the first call."""
    if isinstance(backend, SyncBackend):
        return lambda: backend
    url = backend
    made: list[SyncBackend] = []
    lock = threading.Lock()

    def resolve() -> SyncBackend:
        with lock:
            if not made:
                made.append(from_url(url))
                made[0]._warn_unclosed = False  # lives as long as the function
            return made[0]

    return resolve


def singleton(
    backend: SyncBackend | str,
    *,
    key: str | Callable[..., str],
    ttl_ms: int = 30_000,
    wait: float | None = None,
    renew_every_ms: float | None = None,
    renew_deadline_ms: float | None = None,
    on_lost: SyncOnLost | None = None,
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Run each call of the decorated function under a held lease on ``key``: one at a time per key.

    ::

        @tenure.sync.singleton("redis://localhost", key=lambda invoice_id: f"invoice:{invoice_id}")
        def bill(invoice_id: str) -> None:
            store.write(invoice_id, token=tenure.sync.current_lease().token)

    ``backend`` is a :class:`SyncBackend` or a URL (a backend is then made on
    the first call, and again in a forked child). ``key`` is a string, or a
    function given the call's arguments. Each call holds the lease as a new
    owner (host, pid, thread and a random part) for its whole run, with
    :func:`hold`'s renewal and loss rules; inside it,
    :func:`current_lease` gives the lease and its fencing ``token``.

    ``wait``: seconds to wait while another call holds the key (``None``, the
    default: wait as long as it takes; ``0``: raise
    :class:`~tenure.LeaseUnavailable` at once). A call whose lease was lost
    raises :class:`~tenure.LeaseLost` after the function returns (its result is
    dropped); the function sees the loss earlier through
    ``current_lease().ensure_held()``.
    """
    if not (isinstance(backend, str | SyncBackend)):
        raise InvalidArgument(
            f"backend must be a URL or come from tenure.sync.from_url(), got {type(backend).__name__}"
        )
    if not (isinstance(key, str) or callable(key)):
        raise InvalidArgument(f"key must be a str or a function, got {type(key).__name__}")
    resolve = _resolver(backend)

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(fn)
        def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            name = key if isinstance(key, str) else key(*args, **kwargs)
            with hold(
                resolve(),
                name,
                _default_owner(),
                ttl_ms,
                renew_every_ms=renew_every_ms,
                renew_deadline_ms=renew_deadline_ms,
                on_lost=on_lost,
                wait=wait,
            ):
                return fn(*args, **kwargs)

        return run

    return decorate
