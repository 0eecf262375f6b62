"""Release wake-ups on etcd: one watch on the backend's key prefix.

A delete (release, expiry clean-up, revocation) or a transfer's write of a
key wakes one local waiter of that key; when the watch ends or fails, every
waiter is woken (it then reads the key itself).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..._errors import BackendUnavailable
from ..._waiters import KeyWaiters
from .._core import prefix_range
from ._connection import EtcdChannel, rpc
from ._keys import LEADER_ONLY, TRANSFER_TOKEN

__all__ = ["ReleaseWatch"]

logger = logging.getLogger("tenure.etcd")

_DELETE = rpc.Event.EventType.DELETE


class ReleaseWatch:
    """The watch of one backend, started by the first waiter, shared by all."""

    def __init__(
        self,
        channel: EtcdChannel,
        prefix: bytes,
        waiters: KeyWaiters,
        *,
        timeout: float,
        check_open: Callable[[], None],
    ) -> None:
        self._ch = channel
        self._p = prefix
        self._waiters = waiters
        self._timeout = timeout
        self._check_open = check_open
        self._watcher: asyncio.Task[None] | None = None
        self._watch_lock: asyncio.Lock | None = None

    async def start(self) -> None:
        """Make sure the watch runs (confirmed by the server) before a waiter waits."""
        if self._watcher is not None and not self._watcher.done():
            return
        if self._watch_lock is None:
            self._watch_lock = asyncio.Lock()
        async with self._watch_lock:
            if self._watcher is not None and not self._watcher.done():
                return
            self._check_open()
            call = await self._create()
            self._watcher = asyncio.get_running_loop().create_task(
                self._listen(call), name="tenure-etcd-watch"
            )

    async def _create(self) -> Any:
        low, high = prefix_range(self._p)
        call = self._ch.watch.Watch(metadata=LEADER_ONLY)
        try:
            with self._ch.errors("watch"):
                create = rpc.WatchCreateRequest(key=low, range_end=high)
                await asyncio.wait_for(
                    call.write(rpc.WatchRequest(create_request=create)), self._timeout
                )
                # Wait for the confirmation: a release before it would be missed.
                reply = await asyncio.wait_for(call.read(), self._timeout)
                if reply is None or not getattr(reply, "created", False):
                    raise BackendUnavailable(f"etcd at {self._ch.where} did not create the watch")
        except BaseException:
            call.cancel()
            raise
        return call

    async def _listen(self, call: Any) -> None:
        skip = len(self._p)
        failed = "the etcd watch at %s failed (%s); waking every waiter"
        try:
            with self._waiters.all_woken_after(logger, failed, self._ch.where):
                while True:
                    reply = await call.read()
                    if not isinstance(reply, rpc.WatchResponse) or reply.canceled:
                        break
                    for event in reply.events:
                        if event.type == _DELETE or event.kv.value.startswith(
                            TRANSFER_TOKEN + b":"
                        ):
                            self._waiters.wake_one(
                                bytes(event.kv.key[skip:]).decode("utf-8", "replace")
                            )
                logger.warning("the etcd watch at %s ended; waking every waiter", self._ch.where)
        finally:
            call.cancel()

    async def aclose(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
