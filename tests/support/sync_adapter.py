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
from collections.abc import AsyncIterator, Collection, Iterator, Sequence
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
        # Callbacks that must start no new delivery (see _hold_back), and the
        # event set once the facade has dropped them.
        self._held_back: set[Any] = set()
        self._gone: dict[Any, threading.Event] = {}

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

    async def renew_owned(self, leases: Sequence[tuple[str, str]], ttl_ms: int) -> list[bool]:
        return await asyncio.to_thread(self.sync.renew_owned, leases, ttl_ms)

    async def wait_lease_released(self, key: str, timeout: float) -> bool:
        return await asyncio.to_thread(self.sync.wait_lease_released, key, timeout)

    def scan_leases(
        self, prefix: str = "", limit: int | None = None
    ) -> AsyncIterator[tuple[str, LeaseRecord]]:
        # Checked at the call, as the async scan_leases is: in a helper thread,
        # since a blocking call on this thread (running the test's loop) refuses.
        with concurrent.futures.ThreadPoolExecutor(1) as helper:
            pairs = helper.submit(self.sync.scan_leases, prefix, limit).result()
        return self._pairs(pairs)

    @staticmethod
    async def _pairs(
        pairs: Iterator[tuple[str, LeaseRecord]],
    ) -> AsyncIterator[tuple[str, LeaseRecord]]:
        while (pair := await asyncio.to_thread(next, pairs, None)) is not None:
            yield pair

    async def revoke_lease(self, key: str, token: int | None = None) -> bool:
        return await asyncio.to_thread(self.sync.revoke_lease, key, token)

    async def publish(self, topic: str, event: Event) -> Event:
        return await asyncio.to_thread(self.sync.publish, topic, event)

    async def subscribe(self, topic: str, callback: Any, *, group: str | None = None) -> None:
        loop = asyncio.get_running_loop()
        running = self._delivering.setdefault(callback, set())

        gone = self._gone[callback] = threading.Event()

        def deliver(event: Event) -> None:
            if callback in self._held_back:
                # Wait for the member to be gone, then fail: the event goes back
                # to the group (the facade's delivery is cancelled by then).
                gone.wait(10)
                raise RuntimeError("held back (expected by the test adapter)")
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
        self._hold_back(callback)
        try:
            await asyncio.to_thread(self.sync.unsubscribe, topic, deliver)
        finally:
            self._held_back.discard(callback)
            gone = self._gone.pop(callback, None)
            if gone is not None:
                gone.set()
        # A callback still running on the test's loop: the facade has handed its
        # event back; end it, as the async backends cancel theirs.
        for future in list(self._delivering.get(callback, ())):
            future.cancel()

    async def flush(self) -> None:
        await asyncio.to_thread(self.sync.flush)

    async def reclaim(self, topic: str, group: str) -> int:
        # A member stuck in a delivery when its events are reclaimed stands for a
        # dead one in the suite: it takes nothing more until it unsubscribes.
        for callback, running in self._delivering.items():
            if running:
                self._hold_back(callback)
        return await asyncio.to_thread(self.sync.reclaim, topic, group)

    def _hold_back(self, callback: Any) -> None:
        """Start no new delivery to ``callback``.

        On an async backend a callback cannot be started between the test's
        unsubscribe (or reclaim) and its effect, since nothing yields in between;
        the facade's threads could start one then, so the adapter holds it back.
        """
        self._held_back.add(callback)

    async def backlog(self, prefix: str, group: str, *, skip: Collection[str] = ()) -> list[str]:
        busy: list[str] = await asyncio.to_thread(self.sync.backlog, prefix, group)
        return [topic for topic in busy if topic not in skip]

    async def aclose(self) -> None:
        await asyncio.to_thread(self.sync.close)
