"""One rooted error tree. Every error tenure raises is a :class:`TenureError`."""

from __future__ import annotations

__all__ = [
    "BackendClosed",
    "BackendUnavailable",
    "ConfigurationError",
    "InvalidArgument",
    "LeaseLost",
    "LeaseUnavailable",
    "TenureError",
]


class TenureError(Exception):
    """Base class of every error raised by tenure."""


class InvalidArgument(TenureError, ValueError):
    """An argument was rejected before anything was sent to the backend."""


class BackendUnavailable(TenureError):
    """The backend could not be reached or failed; chained from the driver's error.

    When this is raised by a lease operation the outcome is *unknown*: the
    operation may or may not have taken effect on the server (the reply can be
    lost after the server applied it). Every lease operation is safe to retry.
    """


class BackendClosed(TenureError):
    """The backend was closed with ``aclose()`` and cannot be used any more."""


class ConfigurationError(TenureError):
    """A URL or setting cannot be used (unknown scheme, missing extra, bad option)."""


class LeaseUnavailable(TenureError):
    """The lease is held by someone else.

    ``holder`` names the current owner (``None`` if it was released between the
    attempt and the read), ``key`` the lease key.
    """

    def __init__(self, key: str, holder: str | None, message: str | None = None) -> None:
        self.key = key
        self.holder = holder
        super().__init__(message or f"lease {key!r} is held by {holder!r}")


class LeaseLost(TenureError):
    """A held lease was lost: a renewal failed or did not succeed before the renew deadline."""

    def __init__(self, key: str, owner: str, reason: str) -> None:
        self.key = key
        self.owner = owner
        self.reason = reason
        super().__init__(f"lease {key!r} held by {owner!r} was lost: {reason}")
