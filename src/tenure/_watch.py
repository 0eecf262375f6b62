"""``tenure watch``: a live view of leases changing hands.

It scans the leases under a prefix every ``interval`` seconds and reports what
changed since the last look: grants, transfers, releases (or revocations),
expiries, and leases whose renewals stopped (their TTL ran below a third of
the longest seen without being extended). One line per change, with the
time, or on a terminal with ``rich`` a live table of the leases with the
recent changes below it. The scan works on every backend
(``Capability.OPERATIONS``); a change shorter than the interval can be missed
(a grant and release between two looks), which the header says.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ._contract import Capability, LeaseRecord, capabilities_of
from ._errors import BackendUnavailable, ConfigurationError, InvalidArgument
from ._operate import _shown
from ._url import default_url, from_url
from ._url_options import redact_url

__all__ = ["Change", "Seen", "changes", "watch"]

EXIT_UNAVAILABLE = 69
# Two reads of one lease's TTL differ by more than the time between them only
# when it was renewed; this much is allowed for where in a scan each was read.
_SLACK_MS = 100


@dataclass(frozen=True, slots=True)
class Seen:
    """What a watcher knows of one lease: its last record, when it was read
    (monotonic seconds), the longest TTL seen, and whether a stop was reported."""

    record: LeaseRecord
    at: float
    longest_ms: int
    stalled: bool = False


@dataclass(frozen=True, slots=True)
class Change:
    kind: str  # granted, transferred, regranted, released, expired, stalled
    key: str
    text: str


def changes(
    before: dict[str, Seen], now: dict[str, LeaseRecord], at: float, done: float | None = None
) -> tuple[list[Change], dict[str, Seen]]:
    """The changes from ``before`` to the leases ``now``, and what is known after them.

    ``now`` was read between ``at`` and ``done`` (default ``at``). A TTL read
    then counts from no earlier than ``at``; a lease missing from ``now`` was
    last looked for no later than ``done``. So a lease is called released, not
    expired, only if it could not have expired by ``done``: a slow look (a
    loaded machine) never turns an expiry into a release.
    """
    done = at if done is None else done
    found: list[Change] = []
    who = _shown  # owners go into the texts as a terminal may show them
    after: dict[str, Seen] = {}
    for key, record in now.items():
        old = before.get(key)
        if old is None:
            found.append(
                Change("granted", key, f"granted to {who(record.owner)} (token {record.token})")
            )
            after[key] = Seen(record, at, record.ttl_ms)
            continue
        prev = old.record
        if record.token != prev.token:
            if record.owner != prev.owner and _was_live(old, done):
                text = (
                    f"transferred {who(prev.owner)} -> {who(record.owner)} (token {record.token})"
                )
                found.append(Change("transferred", key, text))
            else:
                text = f"granted again to {who(record.owner)} (token {record.token}, was {who(prev.owner)})"
                found.append(Change("regranted", key, text))
            after[key] = Seen(record, at, record.ttl_ms)
            continue
        longest = max(old.longest_ms, record.ttl_ms)
        renewed = record.ttl_ms > prev.ttl_ms - (at - old.at) * 1000 + _SLACK_MS
        stalled = old.stalled and not renewed
        if not renewed and not old.stalled and record.ttl_ms < longest / 3:
            text = f"not renewed: {who(record.owner)} has {record.ttl_ms} ms left"
            found.append(Change("stalled", key, text))
            stalled = True
        after[key] = Seen(record, at, longest, stalled)
    for key, old in before.items():
        if key in now:
            continue
        if _was_live(old, done):
            text = f"released by {who(old.record.owner)} (or revoked) (token {old.record.token})"
            found.append(Change("released", key, text))
        else:
            text = f"expired: {who(old.record.owner)} stopped renewing (token {old.record.token})"
            found.append(Change("expired", key, text))
    return found, after


def _was_live(old: Seen, at: float) -> bool:
    """Whether the lease last seen in ``old`` could not have expired by ``at``."""
    return old.record.ttl_ms - (at - old.at) * 1000 > 0


def _stamp() -> str:
    return time.strftime("%H:%M:%S", time.localtime())


def _line(change: Change) -> str:
    """A change as one line; a key with control characters is shown escaped, never
    played to the terminal (owners are escaped in the change's text)."""
    return f"{_stamp()}  {change.kind:<11}  {_shown(change.key)}  {change.text}"


class _Lines:
    """Plain lines, one per change (piped output, or no ``rich``)."""

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def say(self, text: str) -> None:
        print(text, flush=True)

    def show(self, leases: dict[str, LeaseRecord], found: list[Change]) -> None:
        for change in found:
            self.say(_line(change))


class _Live(_Lines):
    """On a terminal with ``rich``: the live leases as a table, the recent changes below."""

    _ROWS = 30
    _RECENT = 10

    def __init__(self) -> None:
        from rich.live import Live

        self._live = Live(auto_refresh=False)
        self._recent: list[str] = []

    def __enter__(self) -> _Live:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(None, None, None)

    def say(self, text: str) -> None:
        self._live.console.print(text, markup=False, highlight=False)

    def show(self, leases: dict[str, LeaseRecord], found: list[Change]) -> None:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text  # keys are shown as they are, never read as markup

        self._recent += [_line(c) for c in found]
        self._recent = self._recent[-self._RECENT :]
        table = Table("KEY", "OWNER", "TOKEN", "TTL", title=f"{len(leases)} live leases")
        for key in sorted(leases)[: self._ROWS]:
            record = leases[key]
            table.add_row(
                Text(_shown(key)),
                Text(_shown(record.owner)),
                str(record.token),
                f"{record.ttl_ms / 1000:.1f}s",
            )
        self._live.update(Group(table, *(Text(line) for line in self._recent)), refresh=True)


def _screen() -> _Lines:
    if sys.stdout.isatty():
        try:
            return _Live()
        except ImportError:  # rich is the optional "demo" extra
            pass
    return _Lines()


async def _looks(url: str, prefix: str, interval: float, most: int | None) -> None:
    async with from_url(url) as backend:
        if Capability.OPERATIONS not in capabilities_of(backend):
            raise ConfigurationError(f"{type(backend).__name__} cannot list leases")
        with _screen() as screen:
            screen.say(
                f"watching {redact_url(url)} under {prefix!r} every {interval:g} s "
                "(a change shorter than that can be missed)"
            )
            at = time.monotonic()
            now = {key: record async for key, record in backend.scan_leases(prefix)}
            known = {key: Seen(record, at, record.ttl_ms) for key, record in now.items()}
            screen.say(f"{_stamp()}  {len(known)} live lease{'' if len(known) == 1 else 's'}")
            screen.show(now, [])
            reported = 0
            for tick in _ticks(interval):
                await asyncio.sleep(max(0.0, tick - time.monotonic()))
                at = time.monotonic()
                now = {key: record async for key, record in backend.scan_leases(prefix)}
                found, known = changes(known, now, at, time.monotonic())
                screen.show(now, found)
                reported += len(found)
                if most is not None and reported >= most:
                    return


def _ticks(interval: float) -> Iterator[float]:
    """Monotonic times of the looks: a fixed rate, not drifting with the scans."""
    start = time.monotonic()
    n = 0
    while True:
        n += 1
        yield start + n * interval


def watch(url: str | None, prefix: str, interval: float, most: int | None = None) -> int:
    """``tenure watch``: runs until interrupted (or ``most`` changes were shown)."""
    where = url or default_url()
    try:
        asyncio.run(_looks(where, prefix, interval, most))
    except KeyboardInterrupt:
        return 0
    except (BackendUnavailable, ConfigurationError, InvalidArgument) as exc:
        print(f"tenure watch: {exc} (backend {redact_url(where)})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0
