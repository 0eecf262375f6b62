"""The async backend interface over a :class:`tenure.sync.SyncBackend`, for the contract suites.

Each call runs the blocking method in a worker thread (``asyncio.to_thread``),
so the suites check the facade exactly as a threaded program uses it: a call
crosses from the caller's thread to tenure's loop thread and back. An async
callback given to ``subscribe`` is run on the test's loop by a sync callback,
which the facade runs in its callback threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from typing import Any

from tenure import AcquireResult, Capability, Event, LeaseRecord
from tenure.sync import SyncBackend

__all__ = ["AsyncOverSync"]


class AsyncOverSync:
    def __init__(self, backend: SyncBackend) -> None:
        self.sync = backend
        self.capabilities: Capability = backend.capabilities
        self._delivering: dict[Any, set[concurrent.futures.Future[Any]]] = {}
        self._subscribed: dict[tuple[str, Any], Any] = {}
        # Callbacks being unsubscribed -> set once the facade has dropped them.
        self._leaving: dict[Any, threading.Event] = {}

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        return await asyncio.to_thread(self.sync.acquire_lease, key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return await asyncio.to_thread(self.sync.get_lease_owner, key)

    async def release_lease(self, key: str, owner: str) -> None:
        await asyncio.to_thread(self.sync.release_lease, key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await asyncio.to_thread(self.sync.renew_lease, key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return await asyncio.to_thread(self.sync.transfer_lease, key, from_owner, to_owner, ttl_ms)

    async def get_lease(self, key: str) -> LeaseRecord | None:
        return await asyncio.to_thread(self.sync.get_lease, key)

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        return await asyncio.to_thread(self.sync.renew_leases, keys, owner, ttl_ms)

    async def wait_lease_released(self, key: str, timeout: float) -> bool:
        return await asyncio.to_thread(self.sync.wait_lease_released, key, timeout)

    async def publish(self, topic: str, event: Event) -> Event:
        return await asyncio.to_thread(self.sync.publish, topic, event)

    async def subscribe(self, topic: str, callback: Any, *, group: str | None = None) -> None:
        loop = asyncio.get_running_loop()
        running = self._delivering.setdefault(callback, set())

        def deliver(event: Event) -> None:
            leaving = self._leaving.get(callback)
            if leaving is not None:
                # An async callback cannot run once its unsubscribe has begun (the
                # loop runs one or the other); here the facade's threads could
                # still start one, so it waits for the member to be gone and fails,
                # which hands the event back to the group.
                leaving.wait(10)
                raise RuntimeError("unsubscribed (expected by the test adapter)")
            future = asyncio.run_coroutine_threadsafe(callback(event), loop)
            running.add(future)
            try:
                future.result()
            finally:
                running.discard(future)

        self._subscribed[(topic, callback)] = deliver
        await asyncio.to_thread(self.sync.subscribe, topic, deliver, group=group)

    async def unsubscribe(self, topic: str, callback: Any) -> None:
        deliver = self._subscribed.pop((topic, callback), callback)
        gone = self._leaving[callback] = threading.Event()
        try:
            await asyncio.to_thread(self.sync.unsubscribe, topic, deliver)
        finally:
            gone.set()
            del self._leaving[callback]
        # A callback still running on the test's loop: the facade has handed its
        # event back; end it, as the async backends cancel theirs.
        for future in list(self._delivering.get(callback, ())):
            future.cancel()

    async def flush(self) -> None:
        await asyncio.to_thread(self.sync.flush)

    async def reclaim(self, topic: str, group: str) -> int:
        return await asyncio.to_thread(self.sync.reclaim, topic, group)

    async def backlog(self, prefix: str, group: str) -> list[str]:
        return await asyncio.to_thread(self.sync.backlog, prefix, group)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.sync.close)
