"""Release wake-ups on Redis: one pub/sub connection per backend.

``release_lease`` and ``transfer_lease`` publish the key on
``<prefix>lease-released`` in the same script; the listener wakes one local
waiter per message, and every waiter when its connection is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ..._waiters import KeyWaiters
from ._connection import RedisConnection

__all__ = ["ReleaseListener"]

logger = logging.getLogger("tenure.redis")


class ReleaseListener:
    """The subscription of one backend to its release channel, started by the
    first waiter and shared by all."""

    def __init__(
        self, conn: RedisConnection, channel: bytes, waiters: KeyWaiters, *, instance: str
    ) -> None:
        self._conn = conn
        self._channel = channel
        self._waiters = waiters
        self._instance = instance
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def ensure(self) -> None:
        if self._task is not None and not self._task.done():
            return
        async with self._lock:
            if self._task is not None and not self._task.done():
                return
            if not self._conn.ready:
                await self._conn.prepare()
            pubsub = self._conn.pubsub()
            loop = asyncio.get_running_loop()
            try:
                with self._conn.driver_errors:
                    await pubsub.subscribe(self._channel)
                    # Wait for the confirmation: a release before it would be missed.
                    deadline = loop.time() + 10.0
                    while True:
                        msg = await pubsub.get_message(timeout=1.0)
                        if msg is not None and msg["type"] == "subscribe":
                            break
                        if loop.time() > deadline:
                            raise TimeoutError("no confirmation of SUBSCRIBE")
            except BaseException:
                await _close_pubsub(pubsub)
                raise
            self._pubsub = pubsub
            self._task = loop.create_task(
                self._listen(pubsub), name=f"tenure-redis-listener-{self._instance}"
            )

    async def _listen(self, pubsub: Any) -> None:
        loop = asyncio.get_running_loop()
        last_ping = loop.time()
        failed = "lease notification connection to Redis at %s lost (%s); waking every waiter"
        try:
            with self._waiters.all_woken_after(logger, failed, self._conn.where):
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and msg["type"] == "message":
                        self._waiters.wake_one(msg["data"].decode("utf-8"))
                    elif msg is None and loop.time() - last_ping > 5.0:
                        # Detects a dead or paused server while no message flows.
                        last_ping = loop.time()
                        await pubsub.ping()
        finally:
            if self._pubsub is pubsub:
                self._pubsub = None
            await _close_pubsub(pubsub)

    def cancel(self) -> asyncio.Task[None] | None:
        """Stop listening (closing): the task to await, if there was one."""
        listener, self._task = self._task, None
        if listener is not None:
            listener.cancel()
        return listener


async def _close_pubsub(pubsub: Any) -> None:
    with contextlib.suppress(Exception):
        await pubsub.aclose()
