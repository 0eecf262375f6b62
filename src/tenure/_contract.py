"""The lease contract (CONTRACT sections 2 and 3): protocol and result types."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self

from ._capabilities import Capability, capabilities_of

if TYPE_CHECKING:
    from ._pubsub import Callback, Event

__all__ = [
    "AcquireResult",
    "Backend",
    "Capability",
    "EventBackend",
    "LeaseProvider",
    "LeaseRecord",
    "RefusalReason",
    "capabilities_of",
]


class RefusalReason(enum.StrEnum):
    """Why ``acquire_lease`` refused (:attr:`AcquireResult.reason`).

    A string enum: it compares equal to, and prints as, its value. More
    reasons may come with new backends; treat an unknown one as a refusal.
    """

    #: Another owner holds the key; :attr:`AcquireResult.owner` names it.
    HELD = "held"
    #: The backend refuses every new grant for a while, because it may have
    #: lost leases that are still in use (the Redis backend after a restart,
    #: a flush, an eviction or a failover); grants resume after about
    #: :attr:`AcquireResult.retry_after_ms`. No holder is named.
    QUARANTINE = "quarantine"


@dataclass(frozen=True, slots=True, init=False)
class AcquireResult:
    """The outcome of ``acquire_lease``.

    On success ``acquired`` is true, ``owner`` is the caller, ``token`` the
    fencing token of the grant and ``reason`` is ``None``. On failure
    ``reason`` says why (a :class:`RefusalReason`), ``owner`` is the holder
    read in the same atomic step (``None`` when the refusal is not about a
    holder: a quarantine) and ``token`` is ``None``.

    ``retry_after_ms`` is set only on a refusal that names no holder because
    the backend refuses every new grant for a while (``reason`` is
    ``RefusalReason.QUARANTINE``): grants resume in about that many
    milliseconds. ``None`` otherwise.
    """

    acquired: bool
    owner: str | None
    token: int | None = None
    retry_after_ms: int | None = None
    reason: RefusalReason | None = None

    # Hand-written because it is on every backend's hot path: the generated
    # frozen __init__ is about twice as slow.
    def __init__(
        self,
        acquired: bool,
        owner: str | None,
        token: int | None = None,
        *,
        retry_after_ms: int | None = None,
        reason: RefusalReason | None = None,
        _set: Callable[[object, str, object], None] = object.__setattr__,
    ) -> None:
        _set(self, "acquired", acquired)
        _set(self, "owner", owner)
        _set(self, "token", token)
        _set(self, "retry_after_ms", retry_after_ms)
        _set(self, "reason", reason)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A live lease read in one atomic step: holder, fencing token, remaining TTL."""

    owner: str
    token: int
    ttl_ms: int


class LeaseProvider(Protocol):
    """The five lease methods every lease backend implements.

    Detection is structural (see :func:`tenure.is_lease_provider`): a class never
    needs to inherit from this protocol or import tenure to be a provider.
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        """Claim ``key`` for ``owner`` for ``ttl_ms``; idempotent for the current owner."""
        ...

    async def get_lease_owner(self, key: str) -> str | None:
        """The current holder of ``key``, or ``None`` when no live lease exists."""
        ...

    async def release_lease(self, key: str, owner: str) -> None:
        """Release ``key`` if ``owner`` holds it; otherwise do nothing."""
        ...

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Extend ``owner``'s lease to a fresh ``ttl_ms``; ``False`` if it was lost."""
        ...

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """Hand ``key`` from ``from_owner`` to ``to_owner`` with no gap; ``False`` if not held."""
        ...


class Backend(LeaseProvider, Protocol):
    """What every backend built by :func:`tenure.from_url` offers.

    The five lease methods, ``get_lease``, ``renew_leases``,
    ``renew_owned``,
    ``wait_lease_released``, ``scan_leases`` and ``revoke_lease``, its declared
    :class:`Capability` set, ``aclose()`` and ``async with``. The pub/sub
    methods are on :class:`EventBackend` (backends that declare
    ``Capability.EVENTS``).
    """

    @property
    def capabilities(self) -> Capability:
        """What the backend declares it can do (a class attribute on tenure's backends)."""
        ...

    async def get_lease(self, key: str) -> LeaseRecord | None:
        """The live lease of ``key`` in one atomic read, or ``None``."""
        ...

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many of ``owner``'s leases at once; one ``bool`` per key, in order."""
        ...

    async def renew_owned(self, leases: Sequence[tuple[str, str]], ttl_ms: int) -> list[bool]:
        """Renew many ``(key, owner)`` leases at once; one ``bool`` per pair, in order."""
        ...

    async def wait_lease_released(self, key: str, timeout: float) -> bool:
        """Wait until ``key`` is released or transferred; ``False`` on timeout."""
        ...

    def scan_leases(
        self, prefix: str = "", limit: int | None = None
    ) -> AsyncIterator[tuple[str, LeaseRecord]]:
        """The live leases whose key starts with ``prefix`` (``Capability.OPERATIONS``)."""
        ...

    async def revoke_lease(self, key: str, token: int | None = None) -> bool:
        """Force-release ``key``, if it still carries ``token`` when given (``OPERATIONS``)."""
        ...

    async def aclose(self) -> None:
        """Release every resource; later calls raise ``BackendClosed``."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class EventBackend(Backend, Protocol):
    """A :class:`Backend` that also carries events (``Capability.EVENTS``)."""

    async def publish(self, topic: str, event: Event) -> Event: ...

    async def subscribe(
        self, topic: str, callback: Callback, *, group: str | None = None
    ) -> None: ...

    async def unsubscribe(self, topic: str, callback: Callback) -> None: ...

    async def flush(self) -> None: ...
