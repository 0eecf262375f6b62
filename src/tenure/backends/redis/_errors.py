"""The one translation of redis-py's (and the socket's) errors into tenure's."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from redis.exceptions import RedisClusterException, RedisError

from ..._errors import BackendUnavailable
from ..._url_options import redact

__all__ = ["DRIVER_ERRORS", "DriverErrors"]

# RedisClusterException is not a RedisError (e.g. "no targets were found").
DRIVER_ERRORS = (RedisError, RedisClusterException, OSError)


class DriverErrors:
    """``with`` block in which a driver error (``RedisError``, ``OSError``) is
    raised as :class:`BackendUnavailable`, chained, with the secrets removed."""

    __slots__ = ("_secrets", "_where")

    def __init__(self, where: str, secrets: Sequence[str]) -> None:
        self._where = where
        self._secrets = tuple(secrets)

    def error(self, exc: BaseException) -> BackendUnavailable:
        text = f"Redis at {self._where} failed: {type(exc).__name__}: {exc}"
        return BackendUnavailable(redact(text, self._secrets))

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and isinstance(exc, DRIVER_ERRORS):
            raise self.error(exc) from exc
