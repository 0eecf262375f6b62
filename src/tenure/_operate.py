"""``tenure leases list|get|revoke`` and ``tenure threads``: leases and the
runtime's threads as an operator sees them.

Every command works on any backend that declares ``Capability.OPERATIONS``
(all of tenure's), through ``scan_leases``, ``get_lease`` and
``revoke_lease``. Records print as aligned columns, or with ``--json`` as one
JSON object per line (JSON Lines, so a listing of any size streams).
Exit status: 0; 1 when ``get`` finds no live lease or ``revoke`` revokes
nothing; 69 when the backend cannot be reached or is misconfigured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TextIO

from ._contract import Capability, LeaseRecord, capabilities_of
from ._errors import BackendUnavailable, ConfigurationError, InvalidArgument
from ._url import default_url, from_url
from ._url_options import redact_url

if TYPE_CHECKING:
    from .runtime._status import ThreadStatus

__all__ = ["EXIT_UNAVAILABLE", "get", "listing", "revoke", "threads"]

EXIT_UNAVAILABLE = 69
_COLUMNS = ("KEY", "OWNER", "TOKEN", "TTL")
_THREAD_COLUMNS = ("THREAD", "OWNER", "TOKEN", "TTL", "PENDING")


def _shown(name: str) -> str:
    """A key or owner for a terminal: as is when printable, else escaped."""
    return name if name.isprintable() else repr(name)[1:-1]


def _ttl(ms: int) -> str:
    return f"{ms / 1000:.1f}s" if ms < 600_000 else f"{ms / 60_000:.0f}m"


def _as_json(key: str, record: LeaseRecord) -> str:
    return json.dumps(
        {"key": key, "owner": record.owner, "token": record.token, "ttl_ms": record.ttl_ms},
        ensure_ascii=False,
    )


def _fail(message: str) -> int:
    print(f"tenure: {message}", file=sys.stderr, flush=True)
    return EXIT_UNAVAILABLE


def _operate(url: str | None, work: Callable[[Any], Awaitable[int]]) -> int:
    """Open the backend of ``url``, check it can operate, run ``work(backend)``."""
    where = url or default_url()

    async def run() -> int:
        async with from_url(where) as backend:
            if Capability.OPERATIONS not in capabilities_of(backend):
                return _fail(f"{type(backend).__name__} cannot list or revoke leases")
            return await work(backend)

    try:
        return asyncio.run(run())
    except (BackendUnavailable, ConfigurationError, InvalidArgument) as exc:
        return _fail(f"{exc} (backend {redact_url(where)})")


async def _print_table(
    header: tuple[str, ...], rows: AsyncIterator[tuple[str, ...]], out: TextIO
) -> int:
    """Aligned columns under ``header``, nothing but the header when there are no
    rows; widths from the first 100 rows, so a long listing streams. Returns the
    number of rows."""
    widths = [len(c) for c in header]
    first: list[tuple[str, ...]] | None = []
    count = 0

    def line(values: tuple[str, ...]) -> None:
        print("  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip(), file=out)

    def head(rows: list[tuple[str, ...]]) -> None:
        for row in rows:
            widths[:] = [max(w, len(v)) for w, v in zip(widths, row, strict=True)]
        line(header)
        for row in rows:
            line(row)

    async for row in rows:
        count += 1
        if first is None:
            line(row)
            continue
        first.append(row)
        if len(first) == 100:
            head(first)
            first = None
    if first is not None:
        head(first)
    return count


async def _lease_rows(
    pairs: AsyncIterator[tuple[str, LeaseRecord]],
) -> AsyncIterator[tuple[str, ...]]:
    async for key, record in pairs:
        yield (_shown(key), _shown(record.owner), str(record.token), _ttl(record.ttl_ms))


async def _print_leases(pairs: AsyncIterator[tuple[str, LeaseRecord]], out: TextIO) -> int:
    count = await _print_table(_COLUMNS, _lease_rows(pairs), out)
    print(f"({count} lease{'' if count == 1 else 's'})", file=out)
    return 0


async def _one(key: str, record: LeaseRecord) -> AsyncIterator[tuple[str, LeaseRecord]]:
    yield key, record


def listing(url: str | None, prefix: str, limit: int | None, as_json: bool) -> int:
    """``tenure leases list``."""

    async def work(backend: Any) -> int:
        pairs = backend.scan_leases(prefix, limit)
        if as_json:
            async for key, record in pairs:
                print(_as_json(key, record))
            return 0
        return await _print_leases(pairs, sys.stdout)

    return _operate(url, work)


def get(url: str | None, key: str, as_json: bool) -> int:
    """``tenure leases get``: exit 1 when the key has no live lease."""

    async def work(backend: Any) -> int:
        record = await backend.get_lease(key)
        if record is None:
            print(f"tenure: no live lease on {_shown(key)!r}", file=sys.stderr)
            return 1
        if as_json:
            print(_as_json(key, record))
            return 0
        return await _print_leases(_one(key, record), sys.stdout)

    return _operate(url, work)


def revoke(url: str | None, key: str, token: int | None) -> int:
    """``tenure leases revoke``: exit 1 when nothing was revoked."""

    async def work(backend: Any) -> int:
        if await backend.revoke_lease(key, token):
            print(f"revoked {_shown(key)!r}")
            return 0
        which = "no live lease" if token is None else f"no live lease with token {token}"
        print(f"tenure: {which} on {_shown(key)!r}: nothing revoked", file=sys.stderr)
        return 1

    return _operate(url, work)


async def _thread_rows(found: Iterable[ThreadStatus]) -> AsyncIterator[tuple[str, ...]]:
    for s in found:
        yield (
            _shown(s.thread_key),
            "-" if s.owner is None else _shown(s.owner),
            "-" if s.token is None else str(s.token),
            "-" if s.ttl_ms is None else _ttl(s.ttl_ms),
            "yes" if s.pending else "no",
        )


def threads(url: str | None, namespace: str, as_json: bool) -> int:
    """``tenure threads``: the namespace's threads with a run or unfinished signals."""
    from .runtime._names import ThreadNames
    from .runtime._status import thread_statuses

    async def work(backend: Any) -> int:
        found = await thread_statuses(backend, backend, ThreadNames(namespace))
        if as_json:
            for status in found:
                print(json.dumps(dataclasses.asdict(status), ensure_ascii=False))
            return 0
        count = await _print_table(_THREAD_COLUMNS, _thread_rows(found), sys.stdout)
        print(f"({count} thread{'' if count == 1 else 's'} in {namespace!r})")
        return 0

    return _operate(url, work)
