"""Structural capability detection and the no-op fallback (CONTRACT section 4)."""

from __future__ import annotations

import logging
from typing import TypeGuard, cast

from ._contract import (
    AcquireResult,
    Capability,
    EventBackend,
    LeaseProvider,
    LeaseRecord,
    capabilities_of,
)
from ._errors import ConfigurationError
from ._validate import check_name, check_ttl

__all__ = [
    "LEASE_METHODS",
    "NoopLeaseProvider",
    "events_of",
    "is_lease_provider",
    "lease_provider_for",
]

logger = logging.getLogger("tenure")

LEASE_METHODS = (
    "acquire_lease",
    "get_lease_owner",
    "release_lease",
    "renew_lease",
    "transfer_lease",
)


def is_lease_provider(obj: object) -> TypeGuard[LeaseProvider]:
    """True exactly when ``obj`` has the five lease methods as callables.

    Structural on purpose: a backend from another package, built against another
    copy of tenure or written without importing tenure at all, is detected.
    """
    return all(callable(getattr(obj, name, None)) for name in LEASE_METHODS)


def lease_provider_for(backend: object) -> LeaseProvider:
    """The lease provider to use with ``backend``.

    A callable ``get_lease_provider()`` on the backend wins (``None`` from it
    means "no leases"); otherwise the backend itself if it is a provider;
    otherwise a :class:`NoopLeaseProvider`, announced with one INFO log line.
    """
    getter = getattr(backend, "get_lease_provider", None)
    if callable(getter):
        provider = getter()
        if provider is not None:
            if not is_lease_provider(provider):
                raise TypeError(
                    f"{type(backend).__name__}.get_lease_provider() returned "
                    f"{type(provider).__name__}, which lacks the lease methods"
                )
            return provider
    elif is_lease_provider(backend):
        return backend
    logger.info(
        "%s provides no leases: leases are disabled and behaviour is single-process "
        "(every caller wins its own race)",
        type(backend).__name__,
    )
    return cast(LeaseProvider, NoopLeaseProvider())


def events_of(backend: object) -> EventBackend:
    """``backend`` typed as an :class:`~tenure.EventBackend`, if it declares ``Capability.EVENTS``.

    Raises :class:`~tenure.ConfigurationError` naming the backend otherwise.
    """
    if Capability.EVENTS not in capabilities_of(backend):
        raise ConfigurationError(
            f"{type(backend).__name__} cannot carry events (it does not declare Capability.EVENTS)"
        )
    return cast(EventBackend, backend)


class NoopLeaseProvider:
    """Every caller wins its own race; nothing is coordinated.

    Keeps single-process behaviour for a pub/sub backend that cannot lease:
    ``acquire_lease`` grants with ``token=None``, ``get_lease_owner`` and
    ``get_lease`` return ``None``, ``release_lease`` does nothing and
    ``renew_lease`` / ``transfer_lease`` return ``True``. Arguments are still
    validated, so code that passes here passes on a real backend.
    """

    __slots__ = ()
    capabilities = Capability.RECORD | Capability.ATOMIC_TRANSFER

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        check_name(key, "key")
        check_name(owner, "owner")
        check_ttl(ttl_ms)
        return AcquireResult(acquired=True, owner=owner, token=None)

    async def get_lease_owner(self, key: str) -> str | None:
        check_name(key, "key")
        return None

    async def get_lease(self, key: str) -> LeaseRecord | None:
        check_name(key, "key")
        return None

    async def release_lease(self, key: str, owner: str) -> None:
        check_name(key, "key")
        check_name(owner, "owner")

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        check_name(key, "key")
        check_name(owner, "owner")
        check_ttl(ttl_ms)
        return True

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        check_name(key, "key")
        check_name(from_owner, "from_owner")
        check_name(to_owner, "to_owner")
        check_ttl(ttl_ms)
        return True

    def __repr__(self) -> str:
        return "NoopLeaseProvider()"
