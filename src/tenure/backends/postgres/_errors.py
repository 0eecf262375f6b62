"""The one translation of psycopg's and the pool's errors into tenure's, with
every secret of the connection strings removed."""

from __future__ import annotations

import re

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolClosed

from ..._errors import BackendClosed, BackendUnavailable, ConfigurationError, TenureError
from ..._url_options import redact, url_secrets

__all__ = ["PgErrors", "describe", "misconfigured"]

# Wrong password, role or database: no retry will fix them.
_MISCONFIGURED_STATES = frozenset({"28P01", "28000", "3D000"})
# libpq reports a refused start-up as text only (no SQLSTATE): the server's
# messages for those states, plus a bad ``options`` parameter.
_MISCONFIGURED_TEXT = re.compile(
    r'authentication failed for user|role "[^"]*" does not exist|database "[^"]*" does not exist'
    r"|no pg_hba\.conf entry|pg_hba\.conf rejects|no password supplied"
    r"|unrecognized configuration parameter|invalid command-line argument"
)


def describe(conninfo: str) -> tuple[str, str | None]:
    """A password-free description of ``conninfo`` and the password (to redact)."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "postgresql://<unparseable conninfo>", None
    password = params.get("password")
    user = params.get("user")
    host = params.get("host") or "localhost"
    port = params.get("port")
    dbname = params.get("dbname") or ""
    where = f"postgresql://{f'{user}@' if user else ''}{host}{f':{port}' if port else ''}/{dbname}"
    # libpq's reading of a badly written URL can put the password in any field.
    secret = str(password) if password else None
    return redact(where, [secret, *url_secrets(conninfo)]), secret


def misconfigured(exc: BaseException) -> bool:
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate is not None:
        return exc.sqlstate in _MISCONFIGURED_STATES
    return _MISCONFIGURED_TEXT.search(str(exc)) is not None


class PgErrors:
    """Where the database is (without secrets), and the translation of its errors."""

    def __init__(self, conninfo: str, listen_conninfo: str) -> None:
        self.where, password = describe(conninfo)
        #: Everything that must never be shown: the passwords of both strings.
        self.secrets = (
            password,
            describe(listen_conninfo)[1],
            *url_secrets(conninfo),
            *url_secrets(listen_conninfo),
        )

    def redact(self, text: str) -> str:
        return redact(text, self.secrets)

    def error(
        self, op: str, exc: BaseException, detail: str | None = None, *, closed: bool = False
    ) -> TenureError:
        """The most specific tenure error for a driver or pool error during ``op``."""
        if closed and isinstance(exc, PoolClosed):
            return BackendClosed("PostgresLeaseProvider is closed")
        text = str(exc).strip() or type(exc).__name__
        if detail:
            text = f"{text} ({detail})"
        text = self.redact(text)
        if misconfigured(exc):
            return ConfigurationError(f"PostgreSQL at {self.where} refused {op}: {text}")
        return BackendUnavailable(
            f"PostgreSQL at {self.where} failed during {op}: {type(exc).__name__}: {text}"
        )
