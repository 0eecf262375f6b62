"""Backends written without importing tenure (for structural detection tests).

This module must never import tenure: it stands for a backend published in
another package.
"""

from __future__ import annotations

from typing import Any


class FiveMethods:
    """A complete lease provider by shape alone."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> Any:
        self.calls.append("acquire_lease")
        return None

    async def get_lease_owner(self, key: str) -> str | None:
        return None

    async def release_lease(self, key: str, owner: str) -> None:
        return None

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return True

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return True


class FourMethods:
    """Missing ``transfer_lease``: not a provider."""

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> Any:
        return None

    async def get_lease_owner(self, key: str) -> str | None:
        return None

    async def release_lease(self, key: str, owner: str) -> None:
        return None

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return True


class AttributeNotCallable(FourMethods):
    """``transfer_lease`` is present but not callable: not a provider."""

    transfer_lease = "not a method"


class Wrapper:
    """Delegates leases to an inner backend through ``get_lease_provider()``."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def get_lease_provider(self) -> object:
        return self.inner


class WrapperWithoutLeases(FiveMethods):
    """Has the five methods itself but says, through the hook, that it has no leases."""

    def get_lease_provider(self) -> None:
        return None
