"""Leases and pub/sub inside one process.

The in-memory backend is the reference implementation of the contract and the
test double for code built on tenure: it passes the same contract suite as the
networked backends.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import logging
import math
import time
import warnings
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._contract import AcquireResult, Capability, LeaseRecord, RefusalReason
from .._errors import ConfigurationError, InvalidArgument
from .._output import OutputStore
from .._pubsub import (
    Callback,
    Event,
    PubSub,
    call_back,
    check_backlog,
    check_publish,
    check_subscribe,
    join_slot,
    remove_member,
)
from .._validate import check_name
from ._core import EXTEND, LEASE_CAPABILITIES, PAGE, REFUSE, LeaseCore, acquire_step, holds

__all__ = ["MemoryPubSub"]

logger = logging.getLogger("tenure.memory")

# Event ids remembered per topic for de-duplicating retried publishes.
_DEDUPE_IDS = 100_000
# Callbacks of one member running at once.
_IN_FLIGHT = 64


# A lease is a list [deadline, owner, token, grant]: the lease operations are
# the backend's hot path and a list is several times cheaper to build than an
# object. ``grant`` is the AcquireResult of the grant, returned again to a
# same-owner re-acquire (same owner, same token).
_DEADLINE, _OWNER, _TOKEN, _GRANT = 0, 1, 2, 3
_Lease = list[Any]

# AcquireResult(True, owner, token) without the frozen __init__'s cost (see _grant).
_new = object.__new__
_set_acquired = AcquireResult.__dict__["acquired"].__set__
_set_owner = AcquireResult.__dict__["owner"].__set__
_set_token = AcquireResult.__dict__["token"].__set__
_set_retry_after = AcquireResult.__dict__["retry_after_ms"].__set__
_set_reason = AcquireResult.__dict__["reason"].__set__
_HELD = RefusalReason.HELD


@dataclass(eq=False)
class _Group:
    """A group's queue of events, what its members are handling, and the members.

    A fan-out subscriber has a private group of one; a named group is shared by
    its members, who compete for its events, and outlives them (while the
    backend lives), so events published while it has no member wait for the next.
    """

    name: str | None
    # Ready events, oldest first, with their publish sequence numbers.
    queue: deque[tuple[int, Event]] = field(default_factory=deque)
    # Taken by a member and not settled: event id -> (sequence, event, epoch).
    inflight: dict[str, tuple[int, Event, int]] = field(default_factory=dict)
    workers: dict[Callback, asyncio.Task[None]] = field(default_factory=dict)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    # Bumped by reclaim(): a delivery of an older epoch settles nothing.
    epoch: int = 0

    @property
    def idle(self) -> bool:
        return not self.queue and not self.inflight

    def drained(self) -> bool:
        """Nothing left for the members to do (or no member left to do it)."""
        return self.idle or not self.workers

    def put_back(self, seq: int, event: Event) -> None:
        """Return an event to the queue in publish order (it goes before newer ones)."""
        queue = self.queue
        index = len(queue)
        while index > 0 and queue[index - 1][0] > seq:
            index -= 1
        queue.insert(index, (seq, event))


class _Events(abc.ABC):
    """The event half of :class:`MemoryPubSub`."""

    _topics: dict[str, dict[str | Callback, _Group]]
    _recent: dict[str, OrderedDict[str, Event]]
    _max_attempts: int
    _seq: Iterator[int]

    @abc.abstractmethod
    def _check_open(self) -> None: ...

    async def publish(self, topic: str, event: Event) -> Event:
        event, given = check_publish(topic, event)
        self._check_open()
        assert event.id is not None
        recent = self._recent.setdefault(topic, OrderedDict())
        if given:
            if event.id in recent:
                return recent[event.id]  # a retried publish: stored once
            # Only a publisher's own id is kept, as on the other backends: a
            # generated one is never published again.
            recent[event.id] = event
            if len(recent) > _DEDUPE_IDS:
                recent.popitem(last=False)
        seq = next(self._seq)
        for target in self._topics.get(topic, {}).values():
            target.queue.append((seq, event))
            await self._notify(target)
        return event

    @staticmethod
    async def _notify(target: _Group) -> None:
        async with target.changed:
            target.changed.notify_all()

    async def subscribe(self, topic: str, callback: Callback, *, group: str | None = None) -> None:
        check_subscribe(topic, callback, group)
        self._check_open()
        groups, slot = join_slot(self._topics, topic, callback, group)
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
        for slot, target in await remove_member(groups, callback):
            if target.name is None:  # a named group keeps its events for the next member
                del groups[slot]
        if not groups:
            self._topics.pop(topic, None)

    async def flush(self) -> None:
        self._check_open()
        for groups in list(self._topics.values()):
            for target in list(groups.values()):
                if target.workers:
                    async with target.changed:
                        await target.changed.wait_for(target.drained)

    async def reclaim(self, topic: str, group: str) -> int:
        """Put every event of ``group`` that a member took but did not settle back, first.

        The members that took them can no longer settle them: a raise or a
        return from their callback changes nothing. Returns how many came back.
        """
        check_name(topic, "topic")
        check_name(group, "group")
        self._check_open()
        target = self._topics.get(topic, {}).get(group)
        if target is None or not target.inflight:
            return 0
        target.epoch += 1
        taken = sorted(target.inflight.values(), key=lambda item: item[0])
        target.inflight.clear()
        for seq, event, _ in taken:
            target.put_back(seq, replace(event, attempt=event.attempt + 1))
        await self._notify(target)
        return len(taken)

    async def backlog(self, prefix: str, group: str, *, skip: Collection[str] = ()) -> list[str]:
        """The topics starting with ``prefix`` whose ``group`` has events not yet
        acknowledged, but those in ``skip``."""
        check_backlog(prefix, group)
        self._check_open()
        return [
            topic
            for topic, groups in self._topics.items()
            if topic.startswith(prefix)
            and topic not in skip
            and group in groups
            and not groups[group].idle
        ]

    async def _deliver(self, topic: str, target: _Group, callback: Callback) -> None:
        """A member's worker: starts its callbacks in queue order, at most
        ``_IN_FLIGHT`` at once (a slow event does not hold up the next ones)."""
        running: set[asyncio.Task[None]] = set()
        room = asyncio.Semaphore(_IN_FLIGHT)
        try:
            while True:
                await room.acquire()
                async with target.changed:
                    await target.changed.wait_for(lambda: bool(target.queue))
                    seq, event = target.queue.popleft()
                    assert event.id is not None
                    epoch = target.epoch
                    target.inflight[event.id] = (seq, event, epoch)
                task = asyncio.get_running_loop().create_task(
                    self._handle(topic, target, callback, seq, event, epoch)
                )
                running.add(task)
                task.add_done_callback(running.discard)
                task.add_done_callback(lambda _: room.release())
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _handle(
        self, topic: str, target: _Group, callback: Callback, seq: int, event: Event, epoch: int
    ) -> None:
        try:
            failure = await call_back(callback, event)
        except asyncio.CancelledError:
            # Unsubscribed mid-delivery: hand the event to another member, not
            # counting the delivery nobody finished.
            if self._settle(target, event, epoch):
                target.put_back(seq, event)
                await asyncio.shield(self._notify(target))
            raise
        if not self._settle(target, event, epoch):
            return
        if failure is None:
            pass
        elif event.attempt < self._max_attempts:
            logger.warning(
                "callback for topic %r raised on event %s (attempt %d of %d); redelivering",
                topic,
                event.id,
                event.attempt,
                self._max_attempts,
                exc_info=failure,
            )
            target.put_back(seq, replace(event, attempt=event.attempt + 1))
        else:
            logger.error(
                "callback for topic %r raised on event %s %d times; dropping it",
                topic,
                event.id,
                event.attempt,
                exc_info=failure,
            )
        await self._notify(target)

    @staticmethod
    def _settle(target: _Group, event: Event, epoch: int) -> bool:
        """Take ``event`` out of flight; ``False`` if a reclaim took it away meanwhile."""
        assert event.id is not None
        entry = target.inflight.get(event.id)
        if entry is None or entry[2] != epoch:
            return False
        del target.inflight[event.id]
        return True


class MemoryPubSub(LeaseCore, _Events, PubSub):
    """Pub/sub and leases for one process (``memory://``).

    Leases: atomic because every operation runs to completion on the event loop
    without awaiting. Deadlines are kept on ``clock`` (``time.monotonic`` by
    default, injectable for tests, in seconds). Fencing tokens come from one
    counter for the whole backend, so they strictly increase for every key, also
    after a lease expired and its bookkeeping was dropped. Expired leases are
    swept whenever the table has doubled since the last sweep, so memory stays
    within about twice the live leases.
    A lease is lost only when its owner stops renewing it, it is revoked, or the
    process exits.

    Pub/sub: kept in this process only, never across a restart. Events
    published while a topic has no group are dropped; a named group, once
    created by its first member, keeps its events while it has no member
    (until the backend is closed). Events are delivered in publish order; a
    raising callback gets the event again before newer ones (with ``attempt``
    increased) up to ``max_attempts`` deliveries, then the event is dropped
    and logged at ERROR. A publish with an ``id`` among the topic's last
    100,000 is not stored again (``DEDUPE``); ``reclaim`` and ``backlog``
    serve a sole consumer elected by a lease (see :class:`tenure.Capability`).
    """

    capabilities = (
        LEASE_CAPABILITIES
        | Capability.EVENTS
        | Capability.DEDUPE
        | Capability.RECLAIM
        | Capability.BACKLOG
    )

    def output_store(self) -> OutputStore:
        """A store of thread output streams on this backend (``ThreadRuntime(output=...)``)."""
        from ._memory_output import MemoryOutput

        return MemoryOutput(self)

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
        self._recent: dict[str, OrderedDict[str, Event]] = {}
        self._seq = itertools.count()
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
        self._last_token = token = self._last_token + 1
        result: AcquireResult = _new(AcquireResult)
        _set_acquired(result, True)
        _set_owner(result, owner)
        _set_token(result, token)
        _set_retry_after(result, None)
        _set_reason(result, None)
        self._leases[key] = [deadline, owner, token, result]
        return result

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        self._args(key, owner, ttl_ms)
        now = self._clock()
        lease = self._leases.get(key)
        if lease is None:
            return self._grant(key, owner, now + ttl_ms / 1000, now)
        step = acquire_step(lease[_OWNER], lease[_DEADLINE], owner, now)
        if step == REFUSE:
            return AcquireResult(False, lease[_OWNER], None, reason=_HELD)
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
        lease = self._leases.get(key)
        # holds(), spelled out: the release is half of the hot path's cycle.
        if lease is not None and lease[_OWNER] == owner and lease[_DEADLINE] > self._clock():
            del self._leases[key]
            if self._waiters.queues:  # _freed(), spelled out
                self._waiters.wake_one(key)

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

    async def _scan(self, prefix: str) -> AsyncGenerator[list[tuple[str, LeaseRecord]], None]:
        keys = sorted(k for k in self._leases if k.startswith(prefix))
        for start in range(0, len(keys), PAGE):
            page = []
            for key in keys[start : start + PAGE]:
                record = await self._read(key)
                if record is not None:
                    page.append((key, record))
            yield page

    async def _revoke(self, key: str, token: int | None) -> bool:
        lease = self._leases.get(key)
        if lease is None or lease[_DEADLINE] <= self._clock():
            return False
        if token is not None and lease[_TOKEN] != token:
            return False
        del self._leases[key]
        return True

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many of ``owner``'s leases at once; one ``bool`` per key, in order."""
        key_list, ttl = self._args_batch(keys, owner, ttl_ms)
        return self._renew_pairs([(key, owner) for key in key_list], ttl)

    async def _renew_owned(self, pairs: list[tuple[str, str]], ttl_ms: int) -> list[bool]:
        return self._renew_pairs(pairs, ttl_ms)

    def _renew_pairs(self, pairs: list[tuple[str, str]], ttl_ms: int) -> list[bool]:
        now = self._clock()
        deadline = now + ttl_ms / 1000
        results = []
        for key, owner in pairs:
            lease = self._held_by(key, owner, now)
            if lease is not None:
                lease[_DEADLINE] = deadline
            results.append(lease is not None)
        return results

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
        # getattr: a constructor that refused its arguments set no _topics.
        if not self._closed and getattr(self, "_topics", None):
            _warn(f"unclosed {self!r} with active subscriptions", ResourceWarning, stacklevel=1)
