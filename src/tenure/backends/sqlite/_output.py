"""Thread output streams in the SQLite file (``tenure.runtime`` replies).

An append is one ``BEGIN IMMEDIATE`` transaction whose insert carries the fence
(the lease row with the writer's owner, token and a live deadline) in its own
``WHERE``: a writer that lost the lease stores nothing. Readers in other
processes are woken through the file's wake-up sockets (:mod:`._wake`), with a
channel of the store's own so that waiting for output never depends on the
backend's subscriptions; a dropped datagram is covered by the reader's poll.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..._errors import Fenced
from ..._output import wait_woken
from ._connection import load_sql
from ._wake import PUBLISHED, WakeChannel

if TYPE_CHECKING:
    from ..._output import Retention, WriteFence
    from ._backend import SqlitePubSub

__all__ = ["SqliteOutput"]

_SCHEMA = load_sql("output_schema")
_APPEND = load_sql("output_append")
_PRUNE = load_sql("output_prune")
_READ = load_sql("output_read")
_HEAD = load_sql("output_head")

# What a wake-up datagram names after its first byte: the stream, marked so no
# topic of the event half is mistaken for it (names never hold NUL).
_MARK = b"\0output\0"


class SqliteOutput:
    """Output streams of one :class:`SqlitePubSub` (its worker thread, its lease rows)."""

    def __init__(self, backend: SqlitePubSub) -> None:
        self._backend = backend
        self._ready = False
        self._channel = WakeChannel(backend._file)
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    # -- jobs, on the backend's worker thread ---------------------------------------------

    def _schema(self, conn: sqlite3.Connection) -> None:
        if not self._ready:
            conn.execute(_SCHEMA)
            self._ready = True

    def _append(
        self,
        conn: sqlite3.Connection,
        stream: bytes,
        fence: WriteFence,
        bodies: Sequence[str],
        retention: Retention,
    ) -> int | None:
        self._schema(conn)
        now = time.time()
        last = None
        conn.execute("BEGIN IMMEDIATE")
        deadline_now = self._backend._clock()
        owner = fence.owner.encode()
        key = fence.lease_key.encode()
        for body in bodies:
            row = conn.execute(
                _APPEND, (stream, body, now, key, owner, fence.token, deadline_now)
            ).fetchone()
            if row is None:
                conn.rollback()
                return None
            last = int(row[0])
        assert last is not None
        conn.execute(_PRUNE, (stream, last, retention.max_items, now - retention.max_age))
        conn.execute("COMMIT")
        self._channel.ring(PUBLISHED, _MARK + stream)
        return last

    def _read(
        self, conn: sqlite3.Connection, stream: bytes, after: int, limit: int
    ) -> tuple[int, list[tuple[int, str]]]:
        self._schema(conn)
        conn.execute("BEGIN")  # one snapshot for the head and the rows
        head = conn.execute(_HEAD, (stream,)).fetchone()[0]
        rows = conn.execute(_READ, (stream, after, limit)).fetchall() if limit > 0 else []
        conn.execute("COMMIT")
        return int(head), [(int(p), str(b)) for p, b in rows]

    # -- the store ----------------------------------------------------------------------

    async def append(
        self, stream: str, fence: WriteFence, bodies: Sequence[str], retention: Retention
    ) -> int:
        self._backend._check_open()
        last = await self._backend._run(self._append, stream.encode(), fence, bodies, retention)
        if last is None:
            raise Fenced(fence.lease_key, fence.owner, "the lease is no longer this writer's")
        self._woken([_MARK_MESSAGE + stream.encode()])  # readers of this process
        return last

    async def read(self, stream: str, after: int, limit: int) -> tuple[int, list[tuple[int, str]]]:
        self._backend._check_open()
        return await self._backend._run(self._read, stream.encode(), after, limit)

    async def wait(self, stream: str, after: int, timeout: float) -> list[tuple[int, str]]:
        self._channel.listen(self._woken)
        return await wait_woken(self, self._waiters, stream, stream, after, timeout)

    def _woken(self, messages: list[bytes]) -> None:
        for message in messages:
            if not message:
                streams = list(self._waiters)  # some were dropped: wake everyone
            elif message[0] == PUBLISHED and message[1:].startswith(_MARK):
                streams = [message[1 + len(_MARK) :].decode("utf-8", "replace")]
            else:
                continue
            for stream in streams:
                for waiter in self._waiters.pop(stream, []):
                    if not waiter.done():
                        waiter.set_result(None)

    async def aclose(self) -> None:
        """Stop listening; the sending socket is closed on the thread that uses it."""
        self._channel.close()
        if self._backend._closed:
            self._channel.close_sender()  # its thread has ended
        else:
            await self._backend._run(_close_sender, self._channel)


def _close_sender(conn: sqlite3.Connection, channel: WakeChannel) -> None:
    channel.close_sender()


_MARK_MESSAGE = bytes((PUBLISHED,)) + _MARK
