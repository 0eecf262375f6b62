"""``tenure doctor``: is the backend, as deployed, safe for leases?

Each of tenure's backends has ``diagnose()``, which looks at its server or
file and returns :class:`Finding` s: what was checked, what was found, and
the fix. ``unsafe`` means a key can get two owners or lose its lease while
it is held; ``warn`` means a weaker guarantee, or a check that could not be
made. The command exits 1 when anything is unsafe.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any, Literal

from ._errors import BackendUnavailable, ConfigurationError, InvalidArgument
from ._url import default_url, from_url
from ._url_options import redact_url

__all__ = ["EXIT_UNAVAILABLE", "EXIT_UNSAFE", "Finding", "doctor", "parse_info"]

EXIT_UNSAFE = 1
EXIT_UNAVAILABLE = 69
Level = Literal["ok", "warn", "unsafe"]


@dataclass(frozen=True)
class Finding:
    """One check of ``tenure doctor``."""

    level: Level
    check: str
    detail: str
    fix: str = ""


def ok(check: str, detail: str) -> Finding:
    return Finding("ok", check, detail)


def warn(check: str, detail: str, fix: str = "") -> Finding:
    return Finding("warn", check, detail, fix)


def unsafe(check: str, detail: str, fix: str) -> Finding:
    return Finding("unsafe", check, detail, fix)


_SKEW_WARN_S = 1.0


def clock_finding(skew_s: float, *, why: str = "") -> Finding:
    """The finding for a server clock ``skew_s`` seconds from this host's: a warning
    past a second, with ``why`` it matters on this backend."""
    # z: a skew that rounds to zero prints as +0, never -0.
    text = f"the server's clock is {skew_s * 1000:+z.0f} ms from this host's"
    if abs(skew_s) > _SKEW_WARN_S:
        return warn("clock", text + why, "run NTP on both hosts")
    return ok("clock", text)


def parse_info(text: bytes | str) -> dict[str, str]:
    """The ``field:value`` lines of a Redis ``INFO`` reply."""
    raw = text.decode() if isinstance(text, bytes) else text
    fields: dict[str, str] = {}
    for line in raw.splitlines():
        if line and not line.startswith("#") and ":" in line:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return fields


def _print(url: str, findings: list[Finding]) -> int:
    print(f"tenure doctor: {redact_url(url)}")
    width = max((len(f.check) for f in findings), default=0)
    for f in findings:
        label = {"ok": "ok", "warn": "warn", "unsafe": "UNSAFE"}[f.level]
        print(f"  {label:<7} {f.check:<{width}}  {f.detail}")
        if f.fix:
            print(f"  {'':<7} {'':<{width}}  fix: {f.fix}")
    bad = sum(f.level == "unsafe" for f in findings)
    warned = sum(f.level == "warn" for f in findings)
    verdict = "UNSAFE" if bad else "ok"
    print(f"verdict: {verdict} ({bad} unsafe, {warned} warning{'' if warned == 1 else 's'})")
    return EXIT_UNSAFE if bad else 0


def doctor(url: str | None) -> int:
    """``tenure doctor``: print the findings; 1 if any is unsafe, 69 if unreachable."""
    where = url or default_url()

    async def run() -> list[Finding]:
        backend: Any
        try:
            built = from_url(where)
        except ConfigurationError as exc:
            # The URL is refused as it stands (e.g. a SQLite file in a
            # directory that does not exist): what from_url says is the finding.
            return [unsafe("configuration", str(exc), "correct the URL")]
        async with built as backend:
            diagnose = getattr(backend, "diagnose", None)
            if diagnose is None:
                return [warn("backend", f"{type(backend).__name__} has no checks")]
            findings: list[Finding] = await diagnose()
            return findings

    try:
        findings = asyncio.run(run())
    except (BackendUnavailable, ConfigurationError, InvalidArgument) as exc:
        print(f"tenure doctor: {exc} (backend {redact_url(where)})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return _print(where, findings)
