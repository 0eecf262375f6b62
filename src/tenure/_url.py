"""``from_url``: a URL scheme → backend registry (CONTRACT section 7)."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ._errors import ConfigurationError

__all__ = ["default_url", "from_url", "redact_url"]


@dataclass(frozen=True)
class _Scheme:
    module: str
    factory: str
    extra: str | None
    driver: str | None


# The backend module is imported only when its scheme is used, so a missing
# optional driver costs nothing until someone asks for it.
_SCHEMES: dict[str, _Scheme] = {
    "memory": _Scheme("tenure.backends.memory", "MemoryPubSub", None, None),
    "sqlite": _Scheme("tenure.backends.sqlite", "SqlitePubSub", None, None),
    "redis": _Scheme("tenure.backends.redis", "RedisStreamsPubSub", "redis", "redis"),
    "rediss": _Scheme("tenure.backends.redis", "RedisStreamsPubSub", "redis", "redis"),
    "postgresql": _Scheme(
        "tenure.backends.postgres", "PostgresLeaseProvider", "postgres", "psycopg"
    ),
    "postgres": _Scheme("tenure.backends.postgres", "PostgresLeaseProvider", "postgres", "psycopg"),
}


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for errors, logs and reprs)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port is not None else ""
        netloc = f"{user}:***@{host}{port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    except ValueError:
        return "<unparseable url>"


def _data_dir() -> Path:
    if sys.platform == "win32":  # pragma: no cover - not tested here
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":  # pragma: no cover - not tested here
        base = str(Path.home() / "Library" / "Application Support")
    else:
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tenure"


def default_url() -> str:
    """The URL ``from_url()`` uses when given none.

    ``$TENURE_URL`` when set, otherwise a SQLite file in the user's data
    directory (``$XDG_DATA_HOME/tenure/tenure.db``, by default
    ``~/.local/share/tenure/tenure.db``), which every process of the user on
    this host shares.
    """
    env = os.environ.get("TENURE_URL")
    if env:
        return env
    return f"sqlite:///{_data_dir() / 'tenure.db'}"


def from_url(url: str | None = None, **options: Any) -> Any:
    """Build the backend for ``url``.

    Schemes: ``memory://``, ``sqlite:///path``, ``redis://``, ``rediss://``,
    ``postgresql://``. With no URL, :func:`default_url` decides. Keyword
    options go to the backend's constructor. The result is an async context
    manager; nothing is connected until it is first used.
    """
    if url is None:
        url = default_url()
    if not isinstance(url, str):
        raise ConfigurationError(f"url must be a str, got {type(url).__name__}")
    known = ", ".join(f"{name}://" for name in sorted(_SCHEMES))
    if "://" not in url:
        raise ConfigurationError(f"the URL has no scheme; known schemes: {known}")
    scheme = url.split("://", 1)[0].lower()
    entry = _SCHEMES.get(scheme)
    if entry is None:
        raise ConfigurationError(f"unknown URL scheme {scheme + '://'!r}; known schemes: {known}")
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        if (
            entry.extra is not None
            and exc.name is not None
            and exc.name.split(".")[0] == entry.driver
        ):
            raise ConfigurationError(
                f"the {scheme}:// scheme needs the optional dependency {entry.driver!r}: "
                f"pip install 'tenure[{entry.extra}]'"
            ) from None
        raise
    factory = getattr(module, entry.factory)
    return factory.from_url(url, **options)
