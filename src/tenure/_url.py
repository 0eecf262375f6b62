"""``from_url``: the URL scheme → backend registry (CONTRACT section 7).

Option parsing and redaction, which backends share, are in :mod:`tenure._url_options`.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._contract import Backend
from ._errors import BackendUnavailable, ConfigurationError, InvalidArgument
from ._url_options import redact, url_secrets

__all__ = ["backend_class", "default_url", "from_url"]


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
    "redis+sentinel": _Scheme("tenure.backends.redis", "RedisStreamsPubSub", "redis", "redis"),
    "redis+cluster": _Scheme("tenure.backends.redis", "RedisClusterPubSub", "redis", "redis"),
    "postgresql": _Scheme("tenure.backends.postgres", "PostgresPubSub", "postgres", "psycopg"),
    "postgres": _Scheme("tenure.backends.postgres", "PostgresPubSub", "postgres", "psycopg"),
    "etcd": _Scheme("tenure.backends.etcd", "EtcdLeases", "etcd", "aetcd"),
    "etcds": _Scheme("tenure.backends.etcd", "EtcdLeases", "etcd", "aetcd"),
}


# -- the registry --------------------------------------------------------------


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
    ``~/.local/share/tenure/tenure.db``, created at first use), which every
    process of the user on this host shares.
    """
    env = os.environ.get("TENURE_URL")
    if env:
        return env
    # The data directory is tenure's own: creating it is expected.
    return f"sqlite:///{_data_dir() / 'tenure.db'}?create_dirs=1"


def _no_scheme(url: str, known: str) -> str:
    """What is wrong with a URL without ``://``: a known scheme badly followed, or none."""
    scheme, colon, rest = url.partition(":")
    if colon and scheme.lower() in _SCHEMES:
        slashes = len(rest) - len(rest.lstrip("/"))
        written = f"{scheme}:{'/' * slashes}"
        example = (
            "sqlite:///relative.db or sqlite:////absolute.db"
            if scheme.lower() == "sqlite"
            else f"{scheme.lower()}://…"
        )
        return (
            f"the URL starts {written!r}: a {scheme.lower()}:// URL needs two slashes "
            f"after the colon ({example})"
        )
    return f"the URL has no scheme (no '://'); known schemes: {known}"


def backend_class(url: str) -> type[Any]:
    """The backend class for ``url``'s scheme, importing its module (and driver) only now."""
    if not isinstance(url, str):
        raise ConfigurationError(f"url must be a str, got {type(url).__name__}")
    known = ", ".join(f"{name}://" for name in sorted(_SCHEMES))
    if "://" not in url:
        raise ConfigurationError(_no_scheme(url, known))
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
    cls: type[Any] = getattr(module, entry.factory)
    return cls


def from_url(url: str | None = None, **options: Any) -> Backend:
    """Build the backend for ``url``.

    Schemes: ``memory://``, ``sqlite:///path``, ``redis://``, ``rediss://``,
    ``redis+sentinel://``, ``redis+cluster://``, ``postgresql://``, ``etcd://``,
    ``etcds://`` (leases only). With no URL, :func:`default_url` decides. Keyword
    options go to the backend's constructor. The result is an async context
    manager; nothing is connected until it is first used. Its
    ``capabilities`` say what it offers beyond the lease methods; for the
    pub/sub methods see :func:`tenure.events_of`.
    """
    if url is None:
        url = default_url()
    try:
        backend: Backend = backend_class(url).from_url(url, **options)
    except (ConfigurationError, InvalidArgument, BackendUnavailable) as exc:
        # Each backend redacts its own messages; this is the net under them,
        # whatever a driver's parser chose to quote.
        secrets = url_secrets(url) if isinstance(url, str) else []
        shown = redact(str(exc), secrets)
        if shown != str(exc):
            raise type(exc)(shown) from None
        raise
    return backend
