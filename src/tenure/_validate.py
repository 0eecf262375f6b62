"""Argument validation shared by every backend (CONTRACT section 5).

Pure functions, no I/O. Every backend calls these before it sends anything, so
the messages are the same everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ._errors import InvalidArgument

__all__ = [
    "KNOWN_NAMES",
    "MAX_NAME_BYTES",
    "MAX_TTL_MS",
    "check_count",
    "check_keys",
    "check_name",
    "check_owned",
    "check_prefix",
    "check_text",
    "check_time",
    "check_timeout",
    "check_ttl",
    "remember_names",
]

MAX_NAME_BYTES = 1024
MAX_TTL_MS = 2**31 - 1

#: Keys and owners (``str`` exactly) already found valid, so that the lease
#: calls (``LeaseCore._args``) check one seen before with a set lookup instead
#: of its type, encoding and length (see :func:`remember_names`). Cleared when
#: full, so it holds at most ``_KNOWN_MAX`` names of at most 1024 bytes each.
KNOWN_NAMES: set[str] = set()
_KNOWN_MAX = 1024


def check_name(value: Any, arg: str) -> str:
    """Return ``value`` if it is a valid key or owner, else raise :class:`InvalidArgument`.

    Valid: a non-empty ``str`` of at most 1024 bytes in UTF-8. Any Unicode is
    allowed, NUL included; a lone surrogate (not encodable) is not.
    """
    # Fast path: ASCII strings are always encodable and one byte per character.
    if type(value) is str and value.isascii() and 0 < len(value) <= MAX_NAME_BYTES:
        return value
    text, size = _utf8(value, arg)
    if size > MAX_NAME_BYTES:
        raise InvalidArgument(f"{arg} must be at most {MAX_NAME_BYTES} bytes in UTF-8, got {size}")
    return text


def check_text(value: Any, arg: str) -> str:
    """Return ``value`` if it is a non-empty ``str`` encodable as UTF-8 (any length)."""
    if type(value) is str and value.isascii() and value:
        return value
    return _utf8(value, arg)[0]


def _utf8(value: Any, arg: str) -> tuple[str, int]:
    """``value`` and its size in UTF-8 if it is a non-empty ``str`` encodable as UTF-8,
    else raise :class:`InvalidArgument`."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{arg} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{arg} must not be empty")
    try:
        return value, len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"{arg} must be encodable as UTF-8 (it contains a lone surrogate)"
        ) from None


def check_time(value: Any, arg: str) -> float:
    """Return ``value`` (seconds since the epoch) as a ``float`` if it is a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{arg} must be a number of seconds, got {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise InvalidArgument(f"{arg} must be a finite number of seconds, got {value}")
    return seconds


def remember_names(*names: str) -> None:
    """Add ``names``, just passed by :func:`check_name`, to :data:`KNOWN_NAMES`.

    Only exact ``str``: a subclass could compare equal to a valid name without being one.
    """
    if len(KNOWN_NAMES) >= _KNOWN_MAX:
        KNOWN_NAMES.clear()
    KNOWN_NAMES.update(name for name in names if type(name) is str)


def check_ttl(value: Any, arg: str = "ttl_ms") -> int:
    """Return ``value`` if it is a valid TTL in milliseconds, else raise :class:`InvalidArgument`."""
    if type(value) is int and 1 <= value <= MAX_TTL_MS:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{arg} must be an int (milliseconds), got {type(value).__name__}")
    ttl = int(value)
    if 1 <= ttl <= MAX_TTL_MS:
        return ttl
    raise InvalidArgument(f"{arg} must be between 1 and {MAX_TTL_MS} milliseconds, got {ttl}")


def check_timeout(value: Any, arg: str = "timeout") -> float:
    """Return ``value`` as seconds if it is a finite number >= 0, else raise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{arg} must be a number of seconds, got {type(value).__name__}")
    if not value >= 0 or value == float("inf"):
        raise InvalidArgument(f"{arg} must be a finite number of seconds >= 0, got {value}")
    return float(value)


def check_count(value: Any, arg: str) -> int | None:
    """``None``, or an ``int`` >= 1 (a limit, a token), else raise :class:`InvalidArgument`."""
    if value is None or (type(value) is int and value >= 1):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{arg} must be None or an int >= 1, got {type(value).__name__}")
    if value < 1:
        raise InvalidArgument(f"{arg} must be None or an int >= 1, got {value}")
    return int(value)


def check_prefix(value: Any, arg: str = "prefix") -> str:
    """``""`` or a valid key's beginning, else raise :class:`InvalidArgument`."""
    if value == "" and type(value) is str:
        return ""
    return check_name(value, arg)


def check_owned(leases: Any, arg: str = "leases") -> list[tuple[str, str]]:
    """``leases`` as a list of valid ``(key, owner)`` pairs, else raise :class:`InvalidArgument`."""
    if isinstance(leases, str | bytes) or not isinstance(leases, Sequence):
        raise InvalidArgument(
            f"{arg} must be a sequence of (key, owner) pairs, got {type(leases).__name__}"
        )
    pairs = []
    for pair in leases:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidArgument(f"{arg} must hold (key, owner) pairs, got {pair!r}")
        pairs.append((check_name(pair[0], "key"), check_name(pair[1], "owner")))
    return pairs


def check_keys(keys: Any, arg: str = "keys") -> list[str]:
    """``keys`` as a list of valid keys (for batch calls), else raise :class:`InvalidArgument`.

    A ``str`` is refused rather than read as a sequence of one-character keys.
    """
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        raise InvalidArgument(f"{arg} must be a sequence of str, got {type(keys).__name__}")
    return [check_name(key, "key") for key in keys]
