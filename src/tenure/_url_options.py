"""URL options and secrets: one query parser, one redactor, for every backend.

Backends import these; :mod:`tenure._url` keeps only the scheme registry.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from ._errors import ConfigurationError

__all__ = [
    "QueryOptions",
    "parse_query",
    "redact",
    "redact_url",
    "to_bool",
    "to_int",
    "to_seconds",
    "to_seconds_or_off",
    "url_secrets",
]


# -- secrets -------------------------------------------------------------------

# ``password=…`` in a URL query or a key=value DSN, quoted or not.
_PASSWORD_FIELD = re.compile(
    r"(?i)(\b\w*password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]*)",
)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every secret in ``secrets`` (and its percent-encoded form) shown as ``***``.

    ``password=…`` fields (URL queries, key=value DSNs) are hidden too, whatever
    their value.
    """
    forms = {
        form
        for secret in secrets
        if secret
        for form in (secret, quote(secret, safe=""), quote(secret))
    }
    # Longest first: a secret that contains another must go whole.
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, "***")
    return _PASSWORD_FIELD.sub(lambda m: m.group(1) + "***", text)


def url_secrets(url: str) -> list[str]:
    """Every password written in ``url`` (a URL or a key=value DSN), as written and decoded.

    Found by plain text rules, not by a URL parser, so that a URL a parser
    refuses (an invalid percent escape, a raw ``@`` or ``#`` in the password)
    still gives its secrets up to :func:`redact`. It errs on the side of
    hiding more: every reading of the user-info counts.
    """
    found: list[str] = []
    _, sep, after = url.partition("://")
    if sep and "@" in after:
        # The user-info ends at the last "@" before the path, or at the last
        # "@" at all when a raw "/" or "#" is in the password.
        for end in {after.rfind("@"), after.split("/", 1)[0].rfind("@"), after.find("@")}:
            if end > 0:
                user_info = after[:end]
                if ":" in user_info:
                    found.append(user_info.partition(":")[2])
    found.extend(match.group(2).strip("'") for match in _PASSWORD_FIELD.finditer(url))
    secrets = {s for raw in found for s in (raw, unquote(raw), unquote(raw).replace("+", " "))}
    return sorted((s for s in secrets if s), key=len, reverse=True)


def redact_url(url: str) -> str:
    """``url`` without secrets: the user-info password and ``password=`` query values.

    A URL without secrets comes back unchanged; one that cannot be parsed is
    not shown at all.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        scheme = url.split("://", 1)[0] if "://" in url else ""
        return f"<unparseable {scheme}:// URL>" if scheme.isalnum() else "<unparseable URL>"
    shown = url
    if password is not None:
        user_info, _, host = parts.netloc.rpartition("@")
        user = user_info.partition(":")[0]
        shown = shown.replace(f"//{parts.netloc}", f"//{user}:***@{host}", 1)
    return _PASSWORD_FIELD.sub(lambda m: m.group(1) + "***", shown)


# -- options -------------------------------------------------------------------


def to_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError("expected true or false")


def to_int(low: int = 0) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise ValueError(f"expected an int >= {low}")
        return value

    return parse


def to_seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:
        raise ValueError("expected a finite number of seconds > 0")
    return value


def to_seconds_or_off(text: str) -> float:
    """Seconds of a retention: a finite number >= 0, 0 meaning off."""
    value = float(text)
    if not 0 <= value < math.inf:
        raise ValueError("expected a finite number of seconds >= 0 (0: off)")
    return value


@dataclass(frozen=True)
class QueryOptions:
    """What :func:`parse_query` found: tenure's options and the rest, untouched."""

    ours: dict[str, Any]
    #: The other parameters as they were written (still percent-encoded), in order.
    rest: list[str]

    def rest_query(self) -> str:
        return "&".join(self.rest)


def parse_query(
    url: str,
    ours: Mapping[str, Callable[[str], Any]],
    *,
    theirs: Mapping[str, Callable[[str], Any]] | None = None,
    pass_unknown: bool = False,
    what: str = "",
) -> QueryOptions:
    """Split the query of ``url`` into tenure's options (parsed) and the driver's.

    ``ours`` maps tenure's option names to parsers. ``theirs`` lists the driver's
    options (checked with their parser, passed on as written); with
    ``pass_unknown`` every other name is passed on too (the driver checks it),
    else it raises :class:`ConfigurationError`. Passed-on parameters keep their
    exact spelling, so a value survives unchanged. An option given twice, or a
    value its parser refuses, raises :class:`ConfigurationError`. Messages show
    the URL without secrets.
    """
    shown = redact_url(url)
    what = what or (url.split("://", 1)[0] + "://")
    try:
        query = urlsplit(url).query
    except ValueError:
        raise ConfigurationError(f"cannot parse the {what} URL {shown!r}") from None
    parsed: dict[str, Any] = {}
    rest: list[str] = []
    seen: set[str] = set()
    for segment in query.split("&"):
        if not segment:
            continue
        raw_name, _, raw_value = segment.partition("=")
        name, value = unquote(raw_name), unquote(raw_value)
        if name in seen:
            raise ConfigurationError(f"{what} option {name!r} is given twice in {shown!r}")
        seen.add(name)
        parser = ours.get(name)
        if parser is None and theirs is not None:
            parser = theirs.get(name)
            if parser is not None:
                rest.append(segment)
        elif parser is not None:
            pass
        elif pass_unknown:
            rest.append(segment)
            continue
        if parser is None:
            known = ", ".join(sorted([*ours, *(theirs or {})]))
            raise ConfigurationError(f"unknown {what} option {name!r} in {shown!r}; known: {known}")
        try:
            result = parser(value)
        except (TypeError, ValueError) as exc:
            shown_value = "***" if "password" in name.lower() else repr(value)
            detail = f" ({exc})" if str(exc) else ""
            raise ConfigurationError(
                f"bad value for {what} option {name!r}: {shown_value}{detail}"
            ) from None
        if name in ours:
            parsed[name] = result
    return QueryOptions(parsed, rest)
