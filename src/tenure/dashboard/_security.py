"""Who may look and who may act: authentication, CSRF tokens, the loopback rule.

The secret comes from a file or an environment variable, never from the
command line (where ``ps`` shows it to every user of the host). A line
``user:password`` asks for HTTP basic authentication; any other line is a
bearer token, also accepted as the password of basic authentication (any
user name) so that a browser can log in with it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigurationError

__all__ = ["AUTH_ENV", "Credentials", "Csrf", "is_loopback", "load_credentials"]

#: The environment variable that may hold the credentials instead of a file.
AUTH_ENV = "TENURE_DASHBOARD_AUTH"


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a request must present: ``user`` is ``None`` for a bearer token."""

    user: str | None
    secret: str

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, secret='***')"

    def check(self, authorization: str | None) -> str | None:
        """The name of whoever presented ``authorization`` (a header), or ``None``."""
        if not authorization:
            return None
        scheme, _, value = authorization.strip().partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer":
            if self.user is None and _same(value.strip(), self.secret):
                return "bearer token"
            return None
        if scheme != "basic":
            return None
        try:
            user, sep, password = (
                base64.b64decode(value.strip(), validate=True).decode().partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not sep or not _same(password, self.secret):
            return None
        if self.user is not None and not _same(user, self.user):
            return None
        return user or "bearer token"


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def load_credentials(
    path: Path | None, environ: dict[str, str] | None = None
) -> Credentials | None:
    """The credentials of ``path`` (first line), else of ``$TENURE_DASHBOARD_AUTH``, else ``None``."""
    env = os.environ if environ is None else environ
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read the dashboard's credentials file {str(path)!r}: {exc.strerror}"
            ) from None
        where = f"the credentials file {str(path)!r}"
    elif env.get(AUTH_ENV):
        text = env[AUTH_ENV]
        where = f"${AUTH_ENV}"
    else:
        return None
    line = text.splitlines()[0].strip() if text.strip() else ""
    if not line:
        raise ConfigurationError(f"{where} is empty: give a bearer token or user:password")
    user, sep, password = line.partition(":")
    if sep:
        if not user or not password:
            raise ConfigurationError(f"{where} has an empty user or password (user:password)")
        return Credentials(user, password)
    if len(line) < 16:
        raise ConfigurationError(
            f"the bearer token in {where} is too short (16 characters at least)"
        )
    return Credentials(None, line)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this host only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Csrf:
    """Tokens for forms, bound to a browser's random cookie by a key of this process.

    A page that shows a form sets the cookie when the browser has none; an
    action needs the cookie and the form's token to match. The cookie is
    ``SameSite=Strict``, and another site cannot read the page to learn the
    token, so a cross-site form cannot act.
    """

    COOKIE = "tenure_csrf"
    FIELD = "csrf"

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    @staticmethod
    def new_cookie() -> str:
        return secrets.token_urlsafe(24)

    def token_for(self, cookie: str) -> str:
        return hmac.new(self._key, cookie.encode(), hashlib.sha256).hexdigest()

    def check(self, cookie: str | None, token: str | None) -> bool:
        if not cookie or not token:
            return False
        return hmac.compare_digest(self.token_for(cookie), token)
