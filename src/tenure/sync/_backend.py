"""``tenure.sync.from_url``: a blocking backend that runs the async backend on the portal's loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, NoReturn, cast

from .._contract import AcquireResult, Backend, Capability, LeaseRecord, capabilities_of
from .._errors import BackendClosed, ConfigurationError, InvalidArgument
from .._lifecycle import Closeable
from .._pubsub import Event, check_subscribe
from .._url import default_url
from .._url import from_url as async_from_url
from .._url_options import redact_url
from . import _portal
from ._portal import call

__all__ = ["SyncBackend", "SyncCallback", "from_url"]

SyncCallback = Callable[[Event], Any]

# What the facade offers: the lease extensions, operations and the event methods. Anything
# else a backend declares has no blocking twin here, so it is not declared.
logger = logging.getLogger("tenure.sync")

_SUPPORTED = (
    Capability.LEASES | Capability.RENEW_OWNED | Capability.RUNTIME_LOG | Capability.OPERATIONS
)


class SyncBackend(Closeable):
    """A backend of :func:`tenure.from_url`, with blocking methods.

    Each method runs the async backend's method on tenure's loop thread and
    waits for it: same arguments, same results, same errors. Safe to share
    between threads. ``capabilities`` is what the async backend declares (of the
    lease extensions and event methods, which all have blocking twins here).

    Pub/sub: ``subscribe(topic, callback, group=None)`` takes a plain function,
    run in a pool of worker threads (never on the loop thread, so it may block
    and may call this backend). Returning acknowledges the event; raising gets
    it redelivered, as in the async API. A callback still running when it is
    unsubscribed runs to its end; its outcome is ignored and the event goes back
    to the group.

    ``fork()``: the child builds a fresh async backend from the URL on its first
    call (its own connections, file handle and loop thread); the parent's are
    never touched in the child. Subscriptions stay with the parent. A
    ``memory://`` backend starts empty in the child.
    """

    capabilities: Capability

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self._url = url
        self._options = options
        self._lock = threading.Lock()
        self._closed = False
        self._warn_unclosed = True
        self._inner: Backend | None = None
        # (topic, callback) -> the coroutine function subscribed on the loop.
        self._callbacks: dict[tuple[str, SyncCallback], Callable[[Event], Any]] = {}
        inner = self._build()
        self.capabilities = capabilities_of(inner) & _SUPPORTED
        _portal.on_fork(self)

    def _build(self) -> Backend:
        with self._lock:
            inner = self._inner
            if inner is None:
                if self._closed:  # closed in a forked child before its first call
                    raise BackendClosed(f"{self!r} is closed")
                url, options = self._url, self._options

                async def build() -> Backend:
                    return async_from_url(url, **options)

                inner = self._inner = call(build, what="from_url()")
            return inner

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        if self._inner is not None:
            _portal._inherited.append(self._inner)
            self._inner = None
        self._callbacks = {}

    @property
    def backend(self) -> Backend:
        """The async backend this one runs (use it only on tenure's loop thread)."""
        return self._inner or self._build()

    # -- leases ----------------------------------------------------------------

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        return call((self._inner or self._build()).acquire_lease, key, owner, ttl_ms)

    def get_lease_owner(self, key: str) -> str | None:
        return call((self._inner or self._build()).get_lease_owner, key)

    def release_lease(self, key: str, owner: str) -> None:
        call((self._inner or self._build()).release_lease, key, owner)

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return call((self._inner or self._build()).renew_lease, key, owner, ttl_ms)

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return call(
            (self._inner or self._build()).transfer_lease, key, from_owner, to_owner, ttl_ms
        )

    def get_lease(self, key: str) -> LeaseRecord | None:
        return call((self._inner or self._build()).get_lease, key)

    def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        return call((self._inner or self._build()).renew_leases, keys, owner, ttl_ms)

    def renew_owned(self, leases: Sequence[tuple[str, str]], ttl_ms: int) -> list[bool]:
        return call((self._inner or self._build()).renew_owned, leases, ttl_ms)

    def wait_lease_released(self, key: str, timeout: float) -> bool:
        return call((self._inner or self._build()).wait_lease_released, key, timeout)

    # -- operations ----------------------------------------------------------------

    def _declaring(self, capability: Capability, cannot: str) -> Any:
        """The async backend, or ``ConfigurationError`` if it does not declare ``capability``."""
        inner = self._inner or self._build()
        if capability not in self.capabilities:
            raise ConfigurationError(
                f"{type(inner).__name__} cannot {cannot} "
                f"(it does not declare Capability.{capability.name})"
            )
        return inner

    def _operations(self) -> Any:
        return self._declaring(Capability.OPERATIONS, "list or revoke leases")

    def scan_leases(
        self, prefix: str = "", limit: int | None = None
    ) -> Iterator[tuple[str, LeaseRecord]]:
        """The live leases under ``prefix``, as ``(key, record)`` pairs, read a page at a time.

        Arguments are checked (and the backend's state) when this is called, as
        by the async ``scan_leases``; each step of the iteration then blocks.
        """
        operations = self._operations()

        async def start() -> Any:
            return operations.scan_leases(prefix, limit)

        return _pairs(call(start, what="scan_leases()"))

    def revoke_lease(self, key: str, token: int | None = None) -> bool:
        return cast(bool, call(self._operations().revoke_lease, key, token))

    # -- events ------------------------------------------------------------------

    def _events(self) -> Any:
        return self._declaring(Capability.EVENTS, "carry events")

    def publish(self, topic: str, event: Event) -> Event:
        return cast(Event, call(self._events().publish, topic, event))

    def subscribe(self, topic: str, callback: SyncCallback, *, group: str | None = None) -> None:
        """Deliver events of ``topic`` to ``callback(event)``, run in a worker thread.

        A callback subscribed to ``topic`` already is refused with
        :class:`~tenure.InvalidArgument`, as by the async API.
        """
        events = self._events()
        check_subscribe(topic, callback, group)
        slot = (topic, callback)
        deliver = self._deliver(events, topic, callback)
        with self._lock:
            if slot in self._callbacks:
                raise InvalidArgument(f"callback is already subscribed to topic {topic!r}")
            self._callbacks[slot] = deliver

        async def subscribe() -> None:
            await events.subscribe(topic, deliver, group=group)

        try:
            call(subscribe)
        except BaseException:
            with self._lock:
                if self._callbacks.get(slot) is deliver:
                    del self._callbacks[slot]
            raise

    def _deliver(
        self, events: Any, topic: str, callback: SyncCallback
    ) -> Callable[[Event], Awaitable[None]]:
        """The coroutine function subscribed on the loop for ``callback``."""
        pool = _portal.portal().callbacks

        async def deliver(event: Event) -> None:
            try:
                job = asyncio.get_running_loop().run_in_executor(
                    pool, _run_callback, callback, event
                )
            except RuntimeError as exc:
                # The callback never ran: tenure's own machinery failed (at
                # interpreter shutdown concurrent.futures takes no new work). Not
                # the callback's failure: this member leaves, and hands what it
                # holds back to its group for the other members.
                await self._leave(events, topic, callback, deliver, exc)
            await job

        return deliver

    async def _leave(
        self, events: Any, topic: str, callback: SyncCallback, deliver: Any, exc: Exception
    ) -> NoReturn:
        logger.error(
            "tenure.sync cannot run the callback subscribed to topic %r any more (%s): "
            "unsubscribing it; the events it held go back to its group",
            topic,
            exc,
        )
        with self._lock:
            if self._callbacks.get((topic, callback)) is deliver:
                del self._callbacks[(topic, callback)]
        leaving = asyncio.get_running_loop().create_task(events.unsubscribe(topic, deliver))
        # Unsubscribing cancels this delivery (the event is then handed back)
        # before it ends; it waits here until then.
        with contextlib.suppress(Exception):
            await asyncio.shield(leaving)
        await asyncio.Future()
        raise AssertionError("unreachable")  # pragma: no cover

    def unsubscribe(self, topic: str, callback: SyncCallback) -> None:
        events = self._events()
        with self._lock:
            deliver = self._callbacks.pop((topic, callback), None)
        if deliver is not None:
            call(events.unsubscribe, topic, deliver)

    def flush(self) -> None:
        call(self._events().flush)

    def reclaim(self, topic: str, group: str) -> int:
        return cast(int, call(self._events().reclaim, topic, group))

    def backlog(self, prefix: str, group: str) -> list[str]:
        return cast(list[str], call(self._events().backlog, prefix, group))

    # -- life cycle ----------------------------------------------------------------

    def close(self) -> None:
        """Close the async backend (subscriptions end); later calls raise ``BackendClosed``."""
        self._closed = True
        inner = self._inner
        if inner is not None:
            call(inner.aclose)

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"SyncBackend({redact_url(self._url)!r}{state})"

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        inner = getattr(self, "_inner", None)
        if getattr(self, "_closed", True) or inner is None:
            return
        if not self._warn_unclosed:
            return
        _warn(f"unclosed {self!r}: closing it in the background", ResourceWarning, stacklevel=1)
        current = _portal._portal
        if current is not None and not current.loop.is_closed():
            current.submit(inner.aclose())


def _run_callback(callback: SyncCallback, event: Event) -> None:
    """``callback(event)``, in a worker thread; any exception it raises is an ``Exception``.

    A ``SystemExit`` (``sys.exit()``) or other ``BaseException`` would end
    tenure's loop thread when the delivery awaits it: it is the callback's
    failure like any other raise.
    """
    try:
        callback(event)
    except Exception:
        raise
    except BaseException as exc:
        raise RuntimeError(f"the callback raised {exc!r}") from exc


def _pairs(pairs: Any) -> Iterator[tuple[str, LeaseRecord]]:
    async def step() -> tuple[str, LeaseRecord] | None:
        try:
            return cast(tuple[str, LeaseRecord], await anext(pairs))
        except StopAsyncIteration:
            return None

    async def close() -> None:
        await pairs.aclose()

    try:
        while (pair := call(step, what="scan_leases()")) is not None:
            yield pair
    finally:
        call(close, what="scan_leases()")


def from_url(url: str | None = None, **options: Any) -> SyncBackend:
    """The blocking twin of :func:`tenure.from_url`: same URLs, same options.

    ``with tenure.sync.from_url(url) as backend:`` closes it at the end;
    otherwise call ``backend.close()``. Nothing is connected until the first
    call. Raises :class:`~tenure.ConfigurationError` for a URL that cannot work,
    and :class:`~tenure.sync.SyncCallInEventLoop` when called from a running event
    loop (use :func:`tenure.from_url` there).
    """
    _portal.check_blocking_allowed("from_url()")
    return SyncBackend(default_url() if url is None else url, options)
