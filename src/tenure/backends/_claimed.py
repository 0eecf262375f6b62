"""The client side of a SQL event log with claim rows, shared by SQLite and PostgreSQL.

Both backends keep one *claim* row per (consumer group, event): a member takes
it for ``visibility_timeout``, and settles it naming the delivery (consumer and
attempt), so an outcome that a reclaim or another member's take has overtaken
changes nothing. What one process does with the claims it took is the same on
both and lives here, in :class:`ClaimedEvents`: its local view of each group
(:class:`ClaimGroup`), the delivery workers with their retry-or-drop rule, the
queue of outcomes, and the plumbing of ``subscribe``, ``unsubscribe``,
``reclaim``, ``backlog`` and closing. Each backend supplies the SQL and how it
runs it: joining and leaving a group, the fetch loop that takes claims, writing
outcomes in batches, and the upkeep (heartbeats, pruning).
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from .._errors import InvalidArgument
from .._pubsub import (
    Callback,
    Event,
    LeaseFence,
    PubSub,
    call_back,
    check_backlog,
    check_publish,
    check_subscribe,
    join_slot,
    remove_member,
)
from .._validate import check_name
from ._core import prefix_range

__all__ = ["ClaimGroup", "ClaimedEvents", "EventOptions", "Outcome"]

# (group id, event id, attempt delivered, failed): an acknowledgement, or a
# failed attempt that the consumer delivers again itself.
Outcome = tuple[int, int, int, bool]


@dataclass(frozen=True)
class EventOptions:
    """The event half's settings (seconds unless said otherwise)."""

    visibility_timeout: float = 30.0
    max_attempts: int = 5
    poll_interval: float = 1.0
    prune_interval: float = 10.0
    retention: float = 7 * 24 * 3600.0
    dedupe_window: float = 24 * 3600.0


# Ties in a group's queue (the same event and attempt twice) go in arrival order.
_arrivals = itertools.count()


@dataclass(eq=False)
class ClaimGroup(abc.ABC):
    """This instance's view of one consumer group on one topic.

    A fan-out subscriber has a private group of its own; a named group is shared
    by its members in every process, who compete for its claims.
    """

    topic: str
    name: str | None
    gid: int
    # The claims taken and not yet delivered, oldest event first (event id,
    # attempt, arrival, event): an event whose callback raised goes back before
    # the newer ones taken with it, as a take would have ordered them.
    queue: asyncio.PriorityQueue[tuple[int, int, int, Event]] = field(
        default_factory=asyncio.PriorityQueue
    )
    workers: dict[Callback, asyncio.Task[None]] = field(default_factory=dict)
    # Event id -> attempt, for the claims this instance took and has not yet
    # settled; the heartbeat extends them. A queued event whose attempt is not
    # (or no longer) here was reclaimed or taken by another member: not delivered.
    held: dict[int, int] = field(default_factory=dict)
    # The fence of each subscribed callback (None: unfenced); see fence_arrays.
    fences: dict[Callback, LeaseFence | None] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    fetcher: asyncio.Task[None] | None = None

    @property
    def private(self) -> bool:
        return self.name is None

    @abc.abstractmethod
    def behind(self, mark: int) -> bool:
        """Whether the fetch loop has not yet reached ``mark`` (what ``flush`` waits for)."""

    async def catch_up(self, mark: int) -> None:
        """Wake the fetch loop until it reaches ``mark`` (or stops); then wait for the queue."""
        while self.behind(mark) and self.fetcher is not None and not self.fetcher.done():
            self.progress.clear()
            self.wake.set()
            await self.progress.wait()
        if self.workers:
            await self.queue.join()

    async def stop_fetching(self) -> None:
        if self.fetcher is not None:
            self.fetcher.cancel()
            await asyncio.gather(self.fetcher, return_exceptions=True)

    def fence_arrays(self) -> tuple[list[bytes], list[bytes]]:
        """The lease keys and owner prefixes a take must find one of held (both
        empty: unfenced, as when any subscriber of this view is unfenced)."""
        fences = list(self.fences.values())
        if not fences or any(f is None for f in fences):
            return [], []
        pairs = {(f.key.encode(), f.owner_prefix.encode()) for f in fences if f is not None}
        return [k for k, _ in pairs], [p for _, p in pairs]

    def queue_claimed(self, claimed: Iterable[tuple[int, int, str]]) -> None:
        """Hold and queue the claims taken, each ``(event id, attempt, body)``."""
        for event_id, attempt, body in claimed:
            self.held[event_id] = attempt
            self.put(event_id, Event.from_json(body, attempt))

    def put(self, event_id: int, event: Event) -> None:
        """Queue ``event`` for delivery, in event order."""
        self.queue.put_nowait((event_id, event.attempt, next(_arrivals), event))

    def unfinished(self) -> list[tuple[int, int]]:
        """Empty the queue: the (event id, attempt) still held and never delivered."""
        unfinished: list[tuple[int, int]] = []
        while not self.queue.empty():
            event_id, _, _, event = self.queue.get_nowait()
            if self.held.get(event_id) == event.attempt:
                del self.held[event_id]
                unfinished.append((event_id, event.attempt))
        return unfinished


_G = TypeVar("_G", bound=ClaimGroup)


class ClaimedEvents(PubSub, Generic[_G]):
    """Pub/sub over claim rows: the event-loop side both SQL backends share.

    A subclass names its tasks and logger, and supplies the statements:
    :meth:`_join`, :meth:`_drop`, :meth:`_leave`, :meth:`_fetch_loop`,
    :meth:`_reclaim`, :meth:`_backlog`, :meth:`_write_outcomes` and :meth:`_maintain`.
    """

    _task_prefix: ClassVar[str]  # "tenure-<backend>"
    _logger: ClassVar[logging.Logger]

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...  # from LeaseCore, first in the backend's MRO

    def _init_claimed(self, opts: EventOptions, consumer: object) -> None:
        self._event_opts = opts
        # This instance, as the claims it takes name it.
        self._consumer = consumer
        self._topics: dict[str, dict[str | Callback, _G]] = {}
        self._maintenance_task: asyncio.Task[None] | None = None
        self._outcomes: deque[Outcome] = deque()

    def _groups(self) -> list[_G]:
        return [g for gs in self._topics.values() for g in gs.values()]

    def _wake(self, topic: str) -> None:
        for group in self._topics.get(topic, {}).values():
            group.wake.set()

    # -- what each backend supplies ---------------------------------------------------

    @abc.abstractmethod
    async def _append(self, topic: str, event: Event, given: bool) -> str | None:
        """Store ``event`` (deduplicated when its id is ``given``); the first one's body
        instead when an event with that id is kept, else ``None``."""

    @abc.abstractmethod
    async def _join(self, topic: str, group: str | None) -> _G:
        """Join (creating it if needed) the group in the store; its local view, not yet fetching."""

    @abc.abstractmethod
    async def _drop(self, target: _G) -> None:
        """Delete the private group just joined for a callback that another subscribe won."""

    @abc.abstractmethod
    async def _leave(self, target: _G) -> None:
        """Stop fetching; forget a private group, hand back what a named group's queue held."""

    @abc.abstractmethod
    async def _fetch_loop(self, group: _G) -> None:
        """Take claims for ``group`` whenever woken; queue them (:meth:`ClaimGroup.queue_claimed`)."""

    @abc.abstractmethod
    async def _reclaim(self, topic: bytes, name: bytes) -> Sequence[tuple[int, int, object]]:
        """Make every taken claim of a named group due now; (event id, attempt, consumer) of each."""

    @abc.abstractmethod
    async def _backlog(self, name: bytes, low: bytes, high: bytes) -> list[str]:
        """The topics in [low, high) whose group ``name`` has events not yet acknowledged."""

    @abc.abstractmethod
    def _write_outcomes(self) -> None:
        """Start writing the queued outcomes in batches, unless that is under way."""

    @abc.abstractmethod
    async def _maintain(self) -> None:
        """While there are subscribers: due redeliveries, heartbeats and pruning."""

    def _subscriptions_changed(self) -> None:
        """Called after a subscribe or an unsubscribe."""

    # -- the contract -----------------------------------------------------------------

    async def publish(self, topic: str, event: Event) -> Event:
        """Store ``event`` for every consumer group of ``topic``; nothing without a group.

        If the caller set ``event.id`` and an event with that id is kept for
        ``topic`` (see ``dedupe_window``), nothing is stored and that first
        event is returned.
        """
        event, given = check_publish(topic, event)
        self._check_open()
        first = await self._append(topic, event, given)
        if first is not None:
            return Event.from_json(first)
        self._wake(topic)
        return event

    async def subscribe(
        self,
        topic: str,
        callback: Callback,
        *,
        group: str | None = None,
        fence: LeaseFence | None = None,
    ) -> None:
        """Deliver events published on ``topic`` from now on to ``callback``.

        With ``group``, join that durable group (created if it does not exist
        yet, in any process); members compete for its events. With ``fence``
        (``Capability.FENCED_TAKES``: the backend's takes check it), events are
        taken for this subscription only while that lease is held (see
        :class:`~tenure.LeaseFence`).
        """
        check_subscribe(topic, callback, group, fence)
        self._check_open()
        groups, slot = join_slot(self._topics, topic, callback, group)
        target = groups.get(slot)
        loop = asyncio.get_running_loop()
        if target is None:
            try:
                joined = await self._join(topic, group)
            except BaseException:
                if not groups:
                    del self._topics[topic]
                raise
            target = groups.get(slot)  # another subscribe may have won while we waited
            if target is None:
                target = groups[slot] = joined
                target.fetcher = loop.create_task(
                    self._fetch_loop(target), name=f"{self._task_prefix}-fetch-{topic}"
                )
            elif group is None:  # the same callback subscribed twice at once
                await self._drop(joined)
                raise InvalidArgument(f"callback is already subscribed to topic {topic!r}")
        if callback in target.workers:
            raise InvalidArgument(f"callback is already subscribed to topic {topic!r}")
        target.fences[callback] = fence
        target.workers[callback] = loop.create_task(
            self._deliver(target, callback), name=f"{self._task_prefix}-{topic}"
        )
        target.wake.set()
        self._subscriptions_changed()
        if self._maintenance_task is None or self._maintenance_task.done():
            self._maintenance_task = loop.create_task(
                self._maintain(), name=f"{self._task_prefix}-maintenance"
            )

    async def unsubscribe(self, topic: str, callback: Callback) -> None:
        check_name(topic, "topic")
        self._check_open()
        groups = self._topics.get(topic, {})
        views = list(groups.values())
        for slot, target in await remove_member(groups, callback):
            del groups[slot]
            await self._leave(target)
        # Only now: without its fence, a view left with no fenced member would
        # take unfenced while the member's delivery task was being stopped.
        for target in views:
            target.fences.pop(callback, None)
        if not groups:
            self._topics.pop(topic, None)
        self._subscriptions_changed()

    async def reclaim(self, topic: str, group: str) -> int:
        """Give every event a member of ``group`` took and has not acknowledged back to the group now.

        Returns how many (0 if the topic or group does not exist). Members take
        them before any newer event, oldest first, each as one more attempt.
        """
        check_name(topic, "topic")
        check_name(group, "group")
        self._check_open()
        taken = await self._reclaim(topic.encode(), group.encode())
        target = self._topics.get(topic, {}).get(group)
        if target is not None:
            for event_id, attempt, consumer in taken:
                if consumer == self._consumer and target.held.get(event_id) == attempt:
                    del target.held[event_id]
            target.wake.set()
        return len(taken)

    async def backlog(self, prefix: str, group: str, *, skip: Collection[str] = ()) -> list[str]:
        """The topics starting with ``prefix`` whose ``group`` has events not yet
        acknowledged, but those in ``skip``."""
        check_backlog(prefix, group)
        self._check_open()
        try:
            low, high = prefix_range(prefix.encode())
        except UnicodeEncodeError:
            raise InvalidArgument("prefix must be encodable as UTF-8") from None
        busy: list[str] = await self._backlog(group.encode(), low, high)
        return [topic for topic in busy if topic not in skip] if skip else busy

    # -- delivering -------------------------------------------------------------------

    def _dropped(self, group: _G, event_id: int, attempts: int) -> None:
        self._logger.error(
            "event %d of topic %r was delivered %d times without being acknowledged "
            "(its subscribers died or raised); dropping it",
            event_id,
            group.topic,
            attempts,
        )

    async def _deliver(self, group: _G, callback: Callback) -> None:
        queue_ = group.queue
        held = group.held
        while True:
            event_id, _, _, event = await queue_.get()
            if held.get(event_id) != event.attempt:
                queue_.task_done()  # reclaimed or taken by another member meanwhile
                continue
            try:
                failure = await call_back(callback, event)
                self._delivered(group, event_id, event, failure)
            except asyncio.CancelledError:
                # Unsubscribed mid-delivery: hand the event to another member.
                group.put(event_id, event)
                raise
            finally:
                queue_.task_done()

    def _delivered(
        self, group: _G, event_id: int, event: Event, failure: BaseException | None
    ) -> None:
        """Settle, retry or drop the delivery of ``event`` whose callback raised ``failure``."""
        held = group.held
        max_attempts = self._event_opts.max_attempts
        if failure is None:
            if held.get(event_id) == event.attempt:
                del held[event_id]
            # Written even when reclaimed meanwhile: it then changes nothing.
            self._settle(group.gid, event_id, event.attempt)
        elif held.get(event_id) != event.attempt:
            pass  # reclaimed while it ran: no longer ours to retry or drop
        elif event.attempt < max_attempts:
            self._logger.warning(
                "callback for topic %r raised on event %s (attempt %d of %d); redelivering",
                group.topic,
                event.id,
                event.attempt,
                max_attempts,
                exc_info=failure,
            )
            self._settle(group.gid, event_id, event.attempt, failed=True)
            held[event_id] = event.attempt + 1
            group.put(event_id, replace(event, attempt=event.attempt + 1))
        else:
            self._logger.error(
                "callback for topic %r raised on event %s %d times; dropping it",
                group.topic,
                event.id,
                event.attempt,
                exc_info=failure,
            )
            del held[event_id]
            self._settle(group.gid, event_id, event.attempt)

    def _settle(self, gid: int, event_id: int, attempt: int, *, failed: bool = False) -> None:
        """Queue the outcome of delivery ``attempt``: acknowledged, or failed; written in batches."""
        self._outcomes.append((gid, event_id, attempt, failed))
        self._write_outcomes()

    def _forget(self, groups: list[_G], lost: Iterable[tuple[int, int, int]]) -> None:
        """Drop the claims (group id, event id, attempt) this instance no longer holds."""
        by_gid = {g.gid: g for g in groups}
        for gid, event_id, attempt in lost:
            owner = by_gid.get(gid)
            if owner is not None and owner.held.get(event_id) == attempt:
                del owner.held[event_id]

    # -- closing ----------------------------------------------------------------------

    async def _stop_events(self) -> list[_G]:
        """Stop the maintenance task and every delivery worker; the groups they served."""
        groups = self._groups()
        self._topics.clear()
        tasks = [t for g in groups for t in g.workers.values()]
        if self._maintenance_task is not None:
            tasks.append(self._maintenance_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return groups
