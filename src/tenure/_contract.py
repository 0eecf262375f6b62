"""The lease contract (CONTRACT sections 2 and 3): protocol and result types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["AcquireResult", "LeaseProvider", "LeaseRecord"]


@dataclass(frozen=True, slots=True, init=False)
class AcquireResult:
    """The outcome of ``acquire_lease``.

    On success ``acquired`` is true, ``owner`` is the caller and ``token`` the
    fencing token of the grant. On failure ``owner`` is the holder read in the
    same atomic step (``None`` only if the backend could not name one) and
    ``token`` is ``None``.
    """

    acquired: bool
    owner: str | None
    token: int | None = None

    # Hand-written because it is on every backend's hot path: the generated
    # frozen __init__ is about twice as slow.
    def __init__(
        self,
        acquired: bool,
        owner: str | None,
        token: int | None = None,
        *,
        _set: Callable[[object, str, object], None] = object.__setattr__,
    ) -> None:
        _set(self, "acquired", acquired)
        _set(self, "owner", owner)
        _set(self, "token", token)


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
