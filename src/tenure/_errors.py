"""One rooted error tree. Every error tenure raises is a :class:`TenureError`."""

from __future__ import annotations

__all__ = [
    "BackendClosed",
    "BackendUnavailable",
    "ConfigurationError",
    "Fenced",
    "InvalidArgument",
    "LeaseLost",
    "LeaseUnavailable",
    "OutputTruncated",
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
    """The lease is held by someone else, or the backend refuses new grants for now.

    ``holder`` names the current owner (``None`` if it was released between the
    attempt and the read, or if no holder could be named), ``key`` the lease
    key. ``retry_after_ms`` is set when the backend refused every new grant for
    a while (a Redis quarantine after it may have lost leases; see
    :attr:`AcquireResult.retry_after_ms`); the message then says so.
    ``reason`` is the refusal's :attr:`AcquireResult.reason` (``"held"``,
    ``"quarantine"``), ``None`` when it is not known.
    """

    def __init__(
        self,
        key: str,
        holder: str | None,
        message: str | None = None,
        *,
        retry_after_ms: int | None = None,
        reason: str | None = None,
    ) -> None:
        self.key = key
        self.holder = holder
        self.retry_after_ms = retry_after_ms
        self.reason = reason
        super().__init__(message or unavailable_message(key, holder, retry_after_ms))


def unavailable_message(key: str, holder: str | None, retry_after_ms: int | None) -> str:
    """Why ``key`` was not granted, in words: its holder, or the backend's refusal."""
    if holder is None and retry_after_ms is not None:
        return (
            f"lease {key!r} was refused with no holder: the backend refuses new grants for "
            f"{retry_after_ms / 1000:.1f} s more because it may have lost leases (a Redis "
            "quarantine after a restart, FLUSHALL, eviction or failover; see the README, "
            "'Redis: the quarantine')"
        )
    return f"lease {key!r} is held by {holder!r}"


class LeaseLost(TenureError):
    """A held lease was lost: a renewal failed or did not succeed before the renew deadline."""

    def __init__(self, key: str, owner: str, reason: str) -> None:
        self.key = key
        self.owner = owner
        self.reason = reason
        super().__init__(f"lease {key!r} held by {owner!r} was lost: {reason}")


class Fenced(LeaseLost):
    """A write under a lease was refused: the writer's fencing token is no longer the lease's.

    Checked by the backend atomically with the write, so nothing of it landed.
    A :class:`LeaseLost`: code that stops on a lost lease stops on this too.
    """


class OutputTruncated(TenureError):
    """A reader asked for output older than the stream keeps (its retention).

    ``after`` is the position the reader gave; ``first`` the oldest position
    still kept (the reader may go on from ``first - 1``, knowing it missed some).
    """

    def __init__(self, stream: str, after: int, first: int) -> None:
        self.stream = stream
        self.after = after
        self.first = first
        super().__init__(
            f"output of {stream!r} after position {after} is gone: the oldest kept is {first}"
        )
