"""The LISTEN connection of one PostgreSQL backend instance.

A session of its own, outside the pool (LISTEN needs a session connection, not
PgBouncer's transaction pooling). It listens on the lease channel (release
wake-ups) and the event channel, pings the server between notifications so
that a connection that died silently (a paused server, a black hole) is found
and replaced, and calls the gap handlers after every reconnection:
notifications sent meanwhile are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from ..._errors import BackendUnavailable, TenureError
from ._errors import PgErrors

__all__ = ["PgListener"]

logger = logging.getLogger("tenure.postgres")


class PgListener:
    """One LISTEN session on the lease channel and the event channel.

    Handed what it needs: the connection string, the two ``channels`` (lease,
    event), the error translation, the time limit of a ping, ``prepare`` (the
    backend's first use, run before listening) and ``is_closed``.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        channels: tuple[str, str],
        errors: PgErrors,
        call_timeout: float,
        prepare: Callable[[str], Awaitable[None]],
        is_closed: Callable[[], bool],
        on_notify: Callable[[str], None],
        on_gap: Callable[[], None],
        ping_interval: float,
    ) -> None:
        self._conninfo = conninfo
        self._channel, self._event_channel = channels
        self._errors = errors
        self._call_timeout = call_timeout
        self._prepare = prepare
        self._is_closed = is_closed
        self._handlers: dict[str, Callable[[str], None]] = {self._channel: on_notify}
        self._gap_handlers: list[Callable[[], None]] = [on_gap]
        self._ping_interval = ping_interval
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        # Pings abandoned at their time limit (psycopg may still be cancelling them).
        self._stragglers: set[asyncio.Task[Any]] = set()

    def on_events(self, notify: Callable[[str], None], gap: Callable[[], None]) -> None:
        """Also deliver the event channel's notifications to ``notify``, and call
        ``gap`` after a reconnection."""
        self._handlers[self._event_channel] = notify
        self._gap_handlers.append(gap)

    def _gap(self) -> None:
        for handler in self._gap_handlers:
            handler()

    async def ensure(self, op: str) -> None:
        """Start the connection if it is not running; wait until it listens."""
        await self._prepare(op)
        task = self._task
        if task is None or task.done():
            ready = self._ready = asyncio.get_running_loop().create_future()
            # A first failure nobody awaits any more must not be logged as lost.
            ready.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._task = asyncio.create_task(
                self._listen(ready), name=f"tenure-postgres-listen-{self._channel}"
            )
        assert self._ready is not None
        await asyncio.shield(self._ready)

    async def _listen(self, ready: asyncio.Future[None]) -> None:
        errors = self._errors
        listen = sql.SQL("").join(
            sql.SQL("LISTEN {};").format(sql.Identifier(channel))
            for channel in (self._channel, self._event_channel)
        )
        delay = 0.1
        while not self._is_closed():
            try:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                try:
                    await conn.execute(listen)
                    if ready.done():
                        # Reconnected: notifications may have been missed meanwhile.
                        self._gap()
                    else:
                        ready.set_result(None)
                    delay = 0.1
                    while True:
                        async for note in conn.notifies(timeout=self._ping_interval):
                            handler = self._handlers.get(note.channel)
                            if handler is not None:
                                handler(note.payload)
                        await self._ping(conn)
                finally:
                    await conn.close()
            except (psycopg.Error, BackendUnavailable) as exc:
                if not ready.done():
                    ready.set_exception(
                        exc if isinstance(exc, TenureError) else errors.error("LISTEN", exc)
                    )
                    return
                self._gap()
                logger.warning(
                    "LISTEN connection to PostgreSQL at %s lost (%s); reconnecting in %.1f s",
                    errors.where,
                    errors.redact(str(exc)),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _ping(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """One ``SELECT 1`` on the LISTEN connection within ``call_timeout``."""
        limit = self._call_timeout
        task = asyncio.ensure_future(conn.execute("SELECT 1"))
        await asyncio.wait((task,), timeout=limit)
        if not task.done():
            task.cancel()
            self._stragglers.add(task)
            task.add_done_callback(self._forget)
            raise BackendUnavailable(f"no answer to a ping within {limit:g} s")
        task.result()

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._stragglers.discard(task)
        if not task.cancelled():
            task.exception()  # nobody waits for it any more: retrieved, not logged

    async def aclose(self) -> None:
        """Stop the connection and the pings abandoned on it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # An abandoned ping may be inside psycopg's cancellation of its
        # statement (seconds on a dead network): cancelling it again makes
        # psycopg close that connection at once.
        for _ in range(50):
            if not self._stragglers:
                break
            for straggler in self._stragglers:
                straggler.cancel()
            await asyncio.wait(self._stragglers, timeout=0.1)
