"""Thread output streams in PostgreSQL (``tenure.runtime`` replies).

An append is one statement (``sql/output_append.sql``): the fence (the lease
row with the writer's owner, token and a live deadline, locked ``FOR SHARE``),
the insert, retention and a ``NOTIFY`` on the backend's event channel. Readers
wait on the backend's one LISTEN connection; their notifications carry a mark
no topic has, and everything else goes on to the event half as before.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psycopg import sql

from ..._errors import Fenced
from ..._output import wait_woken
from ._sql import _DDL_LOCK_ID, derived_name, load

if TYPE_CHECKING:
    from ..._output import Retention, WriteFence
    from ._backend import PostgresPubSub

__all__ = ["PostgresOutput"]

# Names never hold NUL, so no topic's notification starts with this.
_MARK = b"\0output\0"


class _Readers:
    """Who waits for which stream, in this process, for one backend object."""

    def __init__(self, backend: PostgresPubSub) -> None:
        self.waiters: dict[bytes, list[asyncio.Future[None]]] = {}
        self.ready = False
        events, gap = backend._on_event_notify, backend._wake_all

        def notified(payload: str) -> None:
            try:
                raw = bytes.fromhex(payload)
            except ValueError:
                raw = b""
            if raw.startswith(_MARK):
                self.wake(raw[len(_MARK) :])
            else:
                events(payload)

        def lost_some() -> None:
            gap()
            for stream in list(self.waiters):
                self.wake(stream)

        backend._conn.on_events(notified, lost_some)

    def wake(self, stream: bytes) -> None:
        for waiter in self.waiters.pop(stream, []):
            if not waiter.done():
                waiter.set_result(None)


_readers: weakref.WeakKeyDictionary[PostgresPubSub, _Readers] = weakref.WeakKeyDictionary()


class PostgresOutput:
    """Output streams of one :class:`PostgresPubSub`, on its pool."""

    def __init__(self, backend: PostgresPubSub) -> None:
        self._backend = backend
        conn = backend._conn
        output = sql.Identifier(conn.names.schema, derived_name(conn.names.table, "_output"))
        self._output_name = derived_name(conn.names.table, "_output")
        names = {**conn.names.identifiers(), "output": output}
        self._q_schema = sql.SQL(load("output_schema")).format(**names).as_string(None)
        self._q_append = sql.SQL(load("output_append")).format(**names).as_string(None)
        self._q_read = sql.SQL(load("output_read")).format(**names).as_string(None)
        readers = _readers.get(backend)
        if readers is None:
            readers = _readers[backend] = _Readers(backend)
        self._readers = readers

    async def _prepare(self, op: str) -> None:
        if self._readers.ready:
            return
        conn = self._backend._conn
        await conn.prepare_events(op)

        async def create() -> None:
            async with conn.pool.connection() as c, c.transaction():
                await c.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s)", (_DDL_LOCK_ID,))
                await c.execute(self._q_schema)

        try:
            await conn.bounded(op, create())
        except Exception as exc:
            if isinstance(exc, TimeoutError | asyncio.CancelledError):
                raise
            from ..._errors import TenureError

            if isinstance(exc, TenureError):
                raise
            raise conn.error(op, exc) from exc
        self._readers.ready = True

    async def append(
        self, stream: str, fence: WriteFence, bodies: Sequence[str], retention: Retention
    ) -> int:
        self._backend._check_open()
        await self._prepare("output append")
        params: dict[str, Any] = {
            "key": fence.lease_key.encode(),
            "owner": fence.owner.encode(),
            "token": fence.token,
            "stream": stream.encode(),
            "bodies": list(bodies),
            "count": len(bodies),
            "max_items": retention.max_items,
            "max_age": retention.max_age,
            "channel": self._backend._conn.names.event_channel,
            "payload": (_MARK + stream.encode()).hex(),
        }
        rows = await self._backend._conn.execute(
            "output append", self._q_append, params, retry=False
        )
        last = rows[0][0]
        if last is None:
            raise Fenced(fence.lease_key, fence.owner, "the lease is no longer this writer's")
        return int(last)

    async def read(self, stream: str, after: int, limit: int) -> tuple[int, list[tuple[int, str]]]:
        self._backend._check_open()
        await self._prepare("output read")
        params = {"stream": stream.encode(), "after": after, "limit": max(limit, 0)}
        rows = await self._backend._conn.execute("output read", self._q_read, params, retry=True)
        head = int(rows[0][0]) if rows else 0
        return head, [(int(p), str(b)) for _, p, b in rows if p is not None]

    async def wait(self, stream: str, after: int, timeout: float) -> list[tuple[int, str]]:
        await self._backend._conn.listen("output wait")
        return await wait_woken(
            self, self._readers.waiters, stream.encode(), stream, after, timeout
        )

    async def aclose(self) -> None:
        pass
