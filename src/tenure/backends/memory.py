"""Leases and pub/sub inside one process.

The in-memory backend is the reference implementation of the contract and the
test double for code built on tenure: it passes the same contract suite as the
networked backends.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._contract import AcquireResult, Capability, LeaseRecord
from .._errors import ConfigurationError, InvalidArgument
from .._pubsub import Callback, Event, PubSub, check_callback, check_group, prepare_event
from .._validate import check_name
from ._core import EXTEND, REFUSE, LeaseCore, acquire_step, holds

__all__ = ["MemoryPubSub"]

logger = logging.getLogger("tenure.memory")


# A lease is a list [deadline, owner, token, grant]: the lease operations are
# the backend's hot path and a list is several times cheaper to build than an
# object. ``grant`` is the AcquireResult of the grant, returned again to a
# same-owner re-acquire (same owner, same token).
_DEADLINE, _OWNER, _TOKEN, _GRANT = 0, 1, 2, 3
_Lease = list[Any]

_new = object.__new__
_set_acquired = AcquireResult.__dict__["acquired"].__set__
_set_owner = AcquireResult.__dict__["owner"].__set__
_set_token = AcquireResult.__dict__["token"].__set__


def _granted(owner: str, token: int) -> AcquireResult:
    """``AcquireResult(True, owner, token)`` without the frozen ``__init__``'s cost."""
    result: AcquireResult = _new(AcquireResult)
    _set_acquired(result, True)
    _set_owner(result, owner)
    _set_token(result, token)
    return result


@dataclass(eq=False)
class _Group:
    """A queue of events and the workers that drain it.

    A fan-out subscriber has a private group of one; a named group is shared by
    its members, who compete for its events.
    """

    name: str | None
    queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    workers: dict[Callback, asyncio.Task[None]] = field(default_factory=dict)


class MemoryPubSub(LeaseCore, PubSub):
    """Pub/sub and leases for one process (``memory://``).

    Leases: atomic because every operation runs to completion on the event loop
    without awaiting. Deadlines are kept on ``clock`` (``time.monotonic`` by
    default, injectable for tests, in seconds). Fencing tokens come from one
    counter for the whole backend, so they strictly increase for every key, also
    after a lease expired and its bookkeeping was dropped. Expired leases are
    swept whenever the table has doubled since the last sweep, so memory stays
    within about twice the live leases.
    A lease is lost only when its owner stops renewing it or the process exits.

    Pub/sub: not durable. Events published while a topic has no subscriber are
    dropped; events queued for a group are lost when its last member
    unsubscribes or the backend closes. A raising callback gets the event again
    (with ``attempt`` increased) up to ``max_attempts`` deliveries, then the
    event is dropped and logged at ERROR.
    """

    capabilities = (
        Capability.RECORD
        | Capability.RENEW_MANY
        | Capability.RELEASE_WAKEUPS
        | Capability.ATOMIC_TRANSFER
        | Capability.EVENTS
    )

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, max_attempts: int = 5
    ) -> None:
        if type(max_attempts) is not int or max_attempts < 1:
            raise InvalidArgument(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        self._clock = clock
        self._max_attempts = max_attempts
        self._leases: dict[str, _Lease] = {}
        self._sweep_at = 1024
        self._last_token = 0
        self._topics: dict[str, dict[str | Callback, _Group]] = {}
        super().__init__()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MemoryPubSub:
        """``memory://`` (nothing may follow it); ``options`` go to the constructor."""
        if url.rstrip("/").lower() != "memory:":
            raise ConfigurationError(f"memory:// takes no host, path or query, got {url!r}")
        return cls(**options)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._leases)} leases"
        return f"MemoryPubSub({state})"

    # -- leases ------------------------------------------------------------

    def _sweep(self, now: float) -> None:
        leases = self._leases
        for key in [k for k, lease in leases.items() if lease[_DEADLINE] <= now]:
            del leases[key]
        # Amortised O(1) per new lease: the next sweep comes after the table
        # has grown by its live size again, so memory stays within about twice
        # the live leases however many keys come and go.
        self._sweep_at = 2 * len(leases) + 1024

    def _held_by(self, key: str, owner: str, now: float) -> _Lease | None:
        lease = self._leases.get(key)
        if lease is not None and holds(lease[_OWNER], lease[_DEADLINE], owner, now):
            return lease
        return None

    def _grant(self, key: str, owner: str, deadline: float, now: float) -> AcquireResult:
        if len(self._leases) >= self._sweep_at:
            self._sweep(now)
        self._last_token += 1
        result = _granted(owner, self._last_token)
        self._leases[key] = [deadline, owner, self._last_token, result]
        return result

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        self._args(key, owner, ttl_ms)
        now = self._clock()
        lease = self._leases.get(key)
        if lease is None:
            return self._grant(key, owner, now + ttl_ms / 1000, now)
        step = acquire_step(lease[_OWNER], lease[_DEADLINE], owner, now)
        if step == REFUSE:
            return AcquireResult(False, lease[_OWNER], None)
        if step == EXTEND:
            lease[_DEADLINE] = now + ttl_ms / 1000
            grant: AcquireResult = lease[_GRANT]
            return grant
        return self._grant(key, owner, now + ttl_ms / 1000, now)

    async def _read(self, key: str) -> LeaseRecord | None:
        now = self._clock()
        lease = self._leases.get(key)
        if lease is None or lease[_DEADLINE] <= now:
            return None
        remaining = max(1, math.ceil((lease[_DEADLINE] - now) * 1000))
        return LeaseRecord(lease[_OWNER], lease[_TOKEN], remaining)

    async def release_lease(self, key: str, owner: str) -> None:
        self._args_owner(key, owner)
        if self._held_by(key, owner, self._clock()) is not None:
            del self._leases[key]
            self._freed(key)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self._args(key, owner, ttl_ms)
        now = self._clock()
        lease = self._held_by(key, owner, now)
        if lease is None:
            return False
        lease[_DEADLINE] = now + ttl_ms / 1000
        return True

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        ttl = self._args_transfer(key, from_owner, to_owner, ttl_ms)
        now = self._clock()
        if self._held_by(key, from_owner, now) is None:
            return False
        self._grant(key, to_owner, now + ttl / 1000, now)
        self._freed(key)
        return True

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many of ``owner``'s leases at once; one ``bool`` per key, in order."""
        key_list, ttl = self._args_batch(keys, owner, ttl_ms)
        now = self._clock()
        deadline = now + ttl / 1000
        results = []
        for key in key_list:
            lease = self._held_by(key, owner, now)
            if lease is not None:
                lease[_DEADLINE] = deadline
            results.append(lease is not None)
        return results

    # -- pub/sub -----------------------------------------------------------

    async def publish(self, topic: str, event: Event) -> Event:
        check_name(topic, "topic")
        event = prepare_event(event)
        self._check_open()
        for group in self._topics.get(topic, {}).values():
            group.queue.put_nowait(event)
        return event

    async def subscribe(self, topic: str, callback: Callback, *, group: str | None = None) -> None:
        check_name(topic, "topic")
        check_callback(callback)
        check_group(group)
        self._check_open()
        groups = self._topics.setdefault(topic, {})
        if any(callback in g.workers for g in groups.values()):
            raise InvalidArgument(f"callback is already subscribed to topic {topic!r}")
        slot: str | Callback = callback if group is None else group
        target = groups.get(slot)
        if target is None:
            target = groups[slot] = _Group(group)
        target.workers[callback] = asyncio.get_running_loop().create_task(
            self._deliver(topic, target, callback), name=f"tenure-memory-{topic}"
        )

    async def unsubscribe(self, topic: str, callback: Callback) -> None:
        check_name(topic, "topic")
        self._check_open()
        groups = self._topics.get(topic, {})
        for slot, target in list(groups.items()):
            task = target.workers.pop(callback, None)
            if task is None:
                continue
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if not target.workers:
                del groups[slot]
        if not groups:
            self._topics.pop(topic, None)

    async def flush(self) -> None:
        self._check_open()
        for groups in list(self._topics.values()):
            for target in list(groups.values()):
                if target.workers:
                    await target.queue.join()

    async def _deliver(self, topic: str, target: _Group, callback: Callback) -> None:
        queue = target.queue
        while True:
            event = await queue.get()
            try:
                await callback(event)
            except asyncio.CancelledError:
                # Unsubscribed mid-delivery: hand the event to another member.
                queue.put_nowait(event)
                raise
            except Exception:
                if event.attempt < self._max_attempts:
                    logger.warning(
                        "callback for topic %r raised on event %s (attempt %d of %d); redelivering",
                        topic,
                        event.id,
                        event.attempt,
                        self._max_attempts,
                        exc_info=True,
                    )
                    queue.put_nowait(replace(event, attempt=event.attempt + 1))
                else:
                    logger.error(
                        "callback for topic %r raised on event %s %d times; dropping it",
                        topic,
                        event.id,
                        event.attempt,
                        exc_info=True,
                    )
            finally:
                queue.task_done()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = [
            t
            for groups in self._topics.values()
            for g in groups.values()
            for t in g.workers.values()
        ]
        self._topics.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._leases.clear()
        self._waiters.wake_all()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        if not self._closed and self._topics:
            _warn(f"unclosed {self!r} with active subscriptions", ResourceWarning, stacklevel=1)
