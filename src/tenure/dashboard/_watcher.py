"""One look at the backend's leases, shared by every page and every browser.

A single task scans the leases under the dashboard's prefix (``scan_leases``,
the operations API) every ``interval`` seconds and keeps what it saw: the
leases, the changes between two looks (``tenure watch``'s own
:func:`~tenure._watch.changes`) and a short history per key. Pages and
Server-Sent Events render from that, so the backend's load does not grow with
the number of browsers, and a browser gets at most one update per look
however busy the backend is.

It looks every ``interval`` while a page is open (a live page connected, or
a page served in the last ``WATCHED_S`` seconds), and every
``idle_interval`` otherwise, so a dashboard nobody looks at costs the
backend one scan every few seconds. A page asked for after such a pause is
rendered at once from the last look, and the look it wakes reaches it as a
live update. When a scan takes long (a large key space), the
pause after it grows so that scanning stays under a quarter of the time.
Right after start, the leases page does not wait for the whole first look:
it is shown from the leases that look has read so far (:meth:`first_leases`),
and the whole list reaches it as a live update when the look ends.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .._contract import LeaseRecord
from .._errors import TenureError
from .._watch import Seen, changes

__all__ = [
    "STATES",
    "Event",
    "Handover",
    "LeaseFilter",
    "LeaseRow",
    "LeaseWatcher",
    "Shared",
    "last_handover",
]

logger = logging.getLogger("tenure.dashboard")

#: A page served keeps the watcher at its fast pace for this long.
WATCHED_S = 10.0

#: The renewal health a lease can be filtered by.
STATES = ("ok", "stalled", "expiring")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Event:
    """One thing the dashboard saw happen to a key (wall-clock seconds)."""

    at: float
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A live lease as a page shows it: ``ttl_ms`` is counted to the moment it is shown."""

    key: str
    owner: str
    token: int
    ttl_ms: int
    state: str


@dataclass(frozen=True, slots=True)
class LeaseFilter:
    """What the leases page shows: the query string of its URL, so it survives a reload."""

    prefix: str = ""
    owner: str = ""
    state: str = ""
    page: int = 1

    def matches(self, row: LeaseRow) -> bool:
        return (
            row.key.startswith(self.prefix)
            and self.owner in row.owner
            and (not self.state or row.state == self.state)
        )

    def query(self, **changed: Any) -> dict[str, str]:
        """The URL parameters of this filter (with ``changed``), empty ones left out."""
        values: dict[str, Any] = {
            "prefix": self.prefix,
            "owner": self.owner,
            "state": self.state,
            "page": self.page,
        }
        values.update(changed)
        if values["page"] == 1:
            del values["page"]
        return {name: str(value) for name, value in values.items() if value}


@dataclass(frozen=True, slots=True)
class Handover:
    """A key's last change of holder as the dashboard saw it: when the new holder
    was seen, and how long the key looked unowned before (``None``: not seen)."""

    at: float
    kind: str
    unowned_s: float | None


_TAKEN = ("granted", "transferred", "regranted")
_FREED = ("released", "expired", "revoked")


def last_handover(events: list[Event]) -> Handover | None:
    """The last hand-over in ``events`` (newest first, as :meth:`LeaseWatcher.history`)."""
    for i, event in enumerate(events):
        if event.kind not in _TAKEN:
            continue
        if event.kind == "transferred":
            return Handover(event.at, event.kind, 0.0)
        for older in events[i + 1 :]:
            if older.kind in _FREED:
                return Handover(event.at, event.kind, event.at - older.at)
            if older.kind in _TAKEN:
                break
        return Handover(event.at, event.kind, None)
    return None


class LeaseWatcher:
    """The shared poller; :meth:`run` is its task (see the module docstring)."""

    def __init__(
        self,
        backend: Any,
        prefix: str = "",
        interval: float = 0.5,
        *,
        idle_interval: float | None = None,
        keys_remembered: int = 10_000,
        events_per_key: int = 50,
    ) -> None:
        self._backend = backend
        self.prefix = prefix
        self.interval = interval
        self.idle_interval = max(interval, 5.0) if idle_interval is None else idle_interval
        #: Live pages connected now (Server-Sent Events).
        self.viewers = 0
        self._watched_until = 0.0
        self._wake = asyncio.Event()
        self.looked_at = 0.0
        self.known: dict[str, Seen] = {}
        self._sorted: list[str] = []
        self.version = 0
        self.scans = 0
        self.last_scan_s = 0.0
        #: Seconds spent scanning since the start (the backend's share of the time).
        self.scanning_s = 0.0
        self.error: str | None = None
        self.ready = asyncio.Event()
        #: During the first look: the leases read so far, in the backend's order.
        self._reading: dict[str, LeaseRecord] = {}
        self._read_enough = asyncio.Event()
        self._enough = 0
        #: When the first look started (monotonic): its leases' TTLs count from then.
        self.reading_since = 0.0
        self._changed = asyncio.Event()
        self._history: OrderedDict[str, deque[Event]] = OrderedDict()
        #: The first look (wall time, leases): what was held before the dashboard started.
        self._first: tuple[float, dict[str, LeaseRecord]] = (0.0, {})
        self._keys_remembered = keys_remembered
        self._events_per_key = events_per_key

    # -- the task --------------------------------------------------------------

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.look()
            except TenureError as exc:
                self.error = str(exc)
                self._bump()
            except (
                Exception
            ) as exc:  # the pages must stay up and say so; a driver's text may hold a secret
                logger.exception("tenure dashboard: a look at the leases failed")
                self.error = f"a look at the leases failed ({type(exc).__name__}); see the log"
                self._bump()
            finally:
                self.ready.set()
            took = time.monotonic() - started
            watched = self.viewers or time.monotonic() < self._watched_until
            pace = self.interval if watched else self.idle_interval
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(pace - took, 3 * took))

    def watched(self) -> None:
        """A page is being looked at: look at the fast pace (at once, after a slow pause)."""
        now = time.monotonic()
        if now >= self._watched_until:
            self._wake.set()
        self._watched_until = now + WATCHED_S

    async def ready_for_a_page(self) -> None:
        """Once there is a first look; a page is rendered from the last one at once
        (its TTLs counted to now), and its live updates bring the next."""
        await self.ready.wait()
        self.watched()

    async def first_leases(self, count: int) -> dict[str, LeaseRecord] | None:
        """Before the first look has ended: once it has read ``count`` leases (or
        ended), the leases it has read so far, in the backend's order (by key in
        SQL backends); ``None`` once there is a whole look to render from."""
        self.watched()
        if self.ready.is_set():
            return None
        if len(self._reading) < count:
            self._enough = count
            self._read_enough.clear()
            await _first(self.ready.wait(), self._read_enough.wait())
        return None if self.ready.is_set() else dict(self._reading)

    async def look(self) -> None:
        """One scan, its changes recorded and every waiting browser woken."""
        at = time.monotonic()
        if self.scans:
            now = {key: record async for key, record in self._backend.scan_leases(self.prefix)}
        else:  # the first look: a page can be shown from its first leases (first_leases)
            self.reading_since = at
            now = self._reading = {}
            try:
                async for key, record in self._backend.scan_leases(self.prefix):
                    now[key] = record
                    if self._enough and len(now) >= self._enough:
                        self._read_enough.set()
            finally:
                self._reading = {}
        done = time.monotonic()
        if self.scans:
            found, after = changes(self.known, now, at, done)
        else:  # held before the dashboard looked: not grants it saw (history() says so)
            found, after = [], {key: Seen(record, at, record.ttl_ms) for key, record in now.items()}
            self._first = (time.time(), now)
        if after.keys() != self.known.keys():
            self._sorted = sorted(after)
        self.known = after
        self.scans += 1
        self.last_scan_s = done - at
        self.scanning_s += done - at
        self.looked_at = at
        self.error = None
        wall = time.time()
        for change in found:
            self.note(change.key, change.kind, change.text, wall)
        self._bump()

    def _bump(self) -> None:
        self.version += 1
        woken, self._changed = self._changed, asyncio.Event()
        woken.set()

    async def wait_change(self, version: int, timeout: float) -> int:
        """The version after ``version``, or ``version`` again after ``timeout`` seconds."""
        if self.version == version:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
        return self.version

    # -- history -----------------------------------------------------------------

    def note(self, key: str, kind: str, text: str, at: float | None = None) -> None:
        """Remember that ``kind`` happened to ``key`` (the oldest keys are forgotten first)."""
        events = self._history.get(key)
        if events is None:
            events = self._history[key] = deque(maxlen=self._events_per_key)
            while len(self._history) > self._keys_remembered:
                self._history.popitem(last=False)
        else:
            self._history.move_to_end(key)
        events.append(Event(time.time() if at is None else at, kind, text))

    def revoked(self, key: str, token: int, text: str) -> None:
        """``key``'s lease carrying ``token`` was revoked here: pages stop showing it now,
        not at the next look."""
        self.note(key, "revoked", text)
        seen = self.known.get(key)
        if seen is not None and seen.record.token == token:
            self.known = {k: v for k, v in self.known.items() if k != key}
            self._sorted = [k for k in self._sorted if k != key]
        self._bump()

    def history(self, key: str) -> list[Event]:
        """What the dashboard saw happen to ``key``, newest first."""
        events = list(reversed(self._history.get(key, ())))
        at, first = self._first
        record = first.get(key)
        if record is not None and len(events) < self._events_per_key:
            events.append(Event(at, "seen", f"held by {record.owner} (token {record.token})"))
        return events

    # -- reading -------------------------------------------------------------------

    def row(self, key: str, now: float | None = None) -> LeaseRow | None:
        seen = self.known.get(key)
        return None if seen is None else _row(key, seen, self.interval, now or time.monotonic())

    def rows(self, keys: Iterable[str], now: float | None = None) -> Iterable[LeaseRow]:
        at = now or time.monotonic()
        for key in keys:
            seen = self.known.get(key)
            if seen is not None:
                yield _row(key, seen, self.interval, at)

    def preview(
        self, read: dict[str, LeaseRecord], chosen: LeaseFilter, size: int
    ) -> list[LeaseRow]:
        """The first ``size`` rows, by key, that ``chosen`` matches among the leases
        ``read`` so far by the first look (see :meth:`first_leases`)."""
        rows = []
        now = time.monotonic()
        for key in sorted(read):
            seen = Seen(read[key], self.reading_since, read[key].ttl_ms)
            row = _row(key, seen, self.interval, now)
            if chosen.matches(row):
                rows.append(row)
                if len(rows) == size:
                    break
        return rows

    def select(self, chosen: LeaseFilter, size: int) -> tuple[list[LeaseRow], int]:
        """Page ``chosen.page`` (``size`` rows, by key) of the leases ``chosen`` matches,
        and how many it matches."""
        keys = self._sorted
        if chosen.prefix:
            low = bisect.bisect_left(keys, chosen.prefix)
            high = low
            while high < len(keys) and keys[high].startswith(chosen.prefix):
                high += 1
            keys = keys[low:high]
        first = (chosen.page - 1) * size
        if not chosen.owner and not chosen.state:
            return list(self.rows(keys[first : first + size])), len(keys)
        matching = [row for row in self.rows(keys) if chosen.matches(row)]
        return matching[first : first + size], len(matching)


async def _first(*waits: Awaitable[Any]) -> None:
    """Until the first of ``waits`` is done (the others cancelled)."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _row(key: str, seen: Seen, interval: float, now: float) -> LeaseRow:
    record: LeaseRecord = seen.record
    left = max(0, int(record.ttl_ms - (now - seen.at) * 1000))
    if not seen.stalled:
        state = "ok"
    elif left < max(1000, 2000 * interval):
        state = "expiring"
    else:
        state = "stalled"
    return LeaseRow(key, record.owner, record.token, left, state)


class Shared(Generic[T]):
    """A value read from the backend at most once per ``max_age`` seconds, however
    many pages ask for it (one read at a time; the others wait for it)."""

    def __init__(self, read: Callable[[], Awaitable[T]], max_age: float) -> None:
        self._read = read
        self._max_age = max_age
        self._value: tuple[float, T] | None = None
        self._lock = asyncio.Lock()
        self.reads = 0

    async def get(self) -> T:
        async with self._lock:
            if self._value is None or time.monotonic() - self._value[0] >= self._max_age:
                value = await self._read()
                self.reads += 1
                self._value = (time.monotonic(), value)
            return self._value[1]
