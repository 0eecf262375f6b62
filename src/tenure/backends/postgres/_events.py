"""The event half of the PostgreSQL backend: an event log, group claims, LISTEN wake-ups.

:class:`PostgresEvents` is the event-loop side, on the client side both SQL
backends share (:mod:`tenure.backends._claimed`: delivery, the outcome queue,
subscriptions): a fetch loop per local group that takes claims in batches
(woken by notifications, local publishes and a slow fallback poll), batched
outcomes, heartbeats and pruning. Every statement is one file in ``sql/``; see
:class:`PostgresPubSub` for the guarantees.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..._errors import BackendUnavailable
from ..._pubsub import Callback, Event
from .._claimed import ClaimedEvents, ClaimGroup, EventOptions, Outcome
from ._connection import PgConnection
from ._sql import Statements

__all__ = ["PostgresEvents"]

logger = logging.getLogger("tenure.postgres")

_BATCH = 100  # claims taken per fetch
_SETTLE_BATCH = 1000  # outcomes written per statement
_SETTLE_RETRY = 0.05  # seconds before writing outcomes again after a failure; doubles
_SETTLE_RETRY_MAX = 1.0
_FENCED_RETRY = 0.1  # seconds before a take that the fence held off looks again
_RECHECK = 0.05  # seconds after a take that found claims and one that found none: one more


@dataclass(frozen=True, slots=True)
class _Queries(Statements):
    """The event statements, each ``sql/<field name>.sql`` rendered for the schema."""

    claim_due: str
    claim_extend: str
    claim_hand_back: str
    claim_prune_orphans: str
    claim_reclaim: str
    claim_settle: str
    claim_take: str
    event_expire: str
    event_first: str
    event_prune: str
    event_publish: str
    group_alive: str
    group_backlog: str
    group_delete: str
    group_join: str
    group_prune_dead: str
    group_prune_idle: str
    lease_prune: str
    waiter_prune: str


@dataclass(eq=False)
class _Group(ClaimGroup):
    # flush: fetches asked for, and the last one that found nothing more due.
    asked: int = 0
    drained: int = 0
    # The last take found claims (the next empty one schedules a second look).
    busy: bool = False
    # A take failed with its outcome unknown: the next one takes back this
    # instance's claims that it does not hold (see claim_take.sql).
    unsure: bool = False

    def behind(self, mark: int) -> bool:
        return self.drained < mark


def _claim_arrays(consumer: object, claims: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Claims (group id, event id, attempt, ...) of ``consumer`` as a statement's arrays."""
    return {
        "groups": [c[0] for c in claims],
        "events": [c[1] for c in claims],
        "attempts": [c[2] for c in claims],
        "consumer": consumer,
    }


class _OutcomeWriter:
    """Writes the queued outcomes in batches, one task at a time, in order.

    A batch that fails is written again until it succeeds (each outcome names
    its delivery, so writing one twice changes nothing): an acknowledgement
    given up would bring a handled event back after ``visibility_timeout``, or
    at the next reclaim. Past that timeout, or once closing, the claims are due
    for redelivery anyway (at least once), and the batch goes.
    """

    def __init__(
        self,
        outcomes: deque[Outcome],
        write: Callable[[list[Outcome]], Awaitable[None]],
        give_up_after: float,
        closing: Callable[[], bool],
    ) -> None:
        self._outcomes = outcomes
        self._write = write
        self._give_up_after = give_up_after
        self._closing = closing
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        """Start writing what is queued, unless that is under way."""
        if self._task is None or self._task.done():
            self._idle.clear()
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name="tenure-postgres-settle"
            )

    async def drain(self) -> None:
        """Wait until every outcome queued so far is written (or given up)."""
        while self._outcomes or not self._idle.is_set():
            if self._task is None or self._task.done():
                if not self._outcomes:
                    break
                self.start()
            await self._idle.wait()

    def _next_batch(self) -> list[Outcome]:
        batch: list[Outcome] = []
        seen: set[tuple[int, int]] = set()
        # Each claim at most once per statement (a failure, then the retry's
        # success, go in two statements, in order).
        while self._outcomes and len(batch) < _SETTLE_BATCH:
            claim = self._outcomes[0][:2]
            if claim in seen:
                break
            seen.add(claim)
            batch.append(self._outcomes.popleft())
        # Locked in key order: no deadlock with a concurrent batch.
        batch.sort()
        return batch

    async def _loop(self) -> None:
        failing_since: float | None = None
        pause = _SETTLE_RETRY
        try:
            while self._outcomes:
                batch = self._next_batch()
                try:
                    await self._write(batch)
                except BackendUnavailable as exc:
                    now = time.monotonic()
                    failing_since = now if failing_since is None else failing_since
                    if self._closing() or now - failing_since >= self._give_up_after:
                        logger.warning("cannot write %d acknowledgements: %s", len(batch), exc)
                        failing_since = None
                        continue
                    logger.info("cannot write %d acknowledgements yet: %s", len(batch), exc)
                    self._outcomes.extendleft(reversed(batch))
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, _SETTLE_RETRY_MAX)
                else:
                    failing_since = None
                    pause = _SETTLE_RETRY
        finally:
            self._idle.set()


class Sql(Protocol):
    """A statement run on the events' connection (``PostgresEvents._sql``)."""

    async def __call__(
        self, op: str, query: str, params: dict[str, Any], *, retry: bool = False
    ) -> list[tuple[Any, ...]]: ...


# Clean-up statements, in order: (operation, statement of _Queries).
_PRUNE = (
    ("prune groups", "group_prune_dead"),
    ("prune groups", "group_prune_idle"),
    ("prune claims", "claim_prune_orphans"),
    ("prune events", "event_expire"),
    ("prune events", "event_prune"),
    ("prune waiters", "waiter_prune"),
    ("prune leases", "lease_prune"),
)


async def _look_again(group: _Group, asked: int, delay: float) -> None:
    """A take that read nothing (the backend failed, or the fence held it off):
    count the topic as read up to ``asked`` for ``flush``, and take again after ``delay``."""
    group.drained = max(group.drained, asked)
    group.progress.set()
    await asyncio.sleep(delay)
    group.wake.set()


class PostgresEvents(ClaimedEvents[_Group]):
    """Pub/sub on the event tables: the event-loop side (mixed into :class:`PostgresPubSub`)."""

    _task_prefix = "tenure-postgres"
    _logger = logger
    _conn: PgConnection
    _closed: bool

    def _init_events(self, opts: EventOptions, lease_retention: float = 0.0) -> None:
        self._init_claimed(opts, uuid.uuid4())
        self._lease_retention = lease_retention
        # A private group whose instance stops heart-beating (every
        # visibility_timeout / 3) is deleted by any instance after this long.
        self._alive_for = 5 * opts.visibility_timeout
        self._writer = _OutcomeWriter(
            self._outcomes, self._write_batch, opts.visibility_timeout, lambda: self._closed
        )
        self._events_q = _Queries.rendered(self._conn.names.render)
        self._conn.on_events(self._on_event_notify, self._wake_all)

    async def _sql(
        self, op: str, query: str, params: dict[str, Any], *, retry: bool = False
    ) -> list[tuple[Any, ...]]:
        if not self._conn.events_ready:
            await self._conn.bounded(op, self._conn.prepare_events(op))
        return await self._conn.execute(op, query, params, retry=retry)

    def _on_event_notify(self, payload: str) -> None:
        try:
            topic = bytes.fromhex(payload).decode("utf-8")
        except ValueError:
            logger.warning(
                "ignoring a malformed notification on %s", self._conn.names.event_channel
            )
            return
        self._wake(topic)

    def _wake_all(self) -> None:
        for group in self._groups():
            group.wake.set()

    # -- the contract -----------------------------------------------------------------

    async def _append(self, topic: str, event: Event, given: bool) -> str | None:
        # One statement: the event and one claim per consumer group of the topic.
        source = event.id.encode() if given and event.id is not None else None
        topic_b = topic.encode()
        params = {
            "topic": topic_b,
            "body": event.to_json(),
            "source": source,
            "keep": self._event_opts.dedupe_window if given else 0.0,
            "channel": self._conn.names.event_channel,
        }
        # With a caller id a retry after a broken connection is safe: the first
        # attempt, if it was stored, is found and returned.
        rows = await self._sql("publish", self._events_q.event_publish, params, retry=given)
        stored, first, _ = rows[0]
        body: str | None = first
        if stored is not None or source is None:
            return None
        if body is None:
            # A concurrent publish of the same id committed after this
            # statement's snapshot; or the topic has no group.
            found = await self._sql(
                "publish",
                self._events_q.event_first,
                {"topic": topic_b, "source": source},
                retry=True,
            )
            body = found[0][0] if found else None
        return body

    async def _join(self, topic: str, group: str | None) -> _Group:
        return _Group(topic, group, await self._group_id(topic, group))

    async def _drop(self, target: _Group) -> None:
        await self._sql("subscribe", self._events_q.group_delete, {"id": target.gid}, retry=True)

    async def _group_id(self, topic: str, group: str | None) -> int:
        """Join (creating it if needed) the group in the database; its id."""
        # LISTEN first: a publish committed after the group exists must wake us.
        await self._conn.listen("subscribe")
        name = b"\0fan-out\0" + uuid.uuid4().bytes if group is None else group.encode()
        rows = await self._sql(
            "subscribe",
            self._events_q.group_join,
            {
                "topic": topic.encode(),
                "name": name,
                "private": group is None,
                "alive": self._alive_for,
            },
            retry=True,
        )
        gid: int = rows[0][0]
        return gid

    async def unsubscribe(self, topic: str, callback: Callback) -> None:
        await super().unsubscribe(topic, callback)
        # What the member finished is acknowledged before this returns: a
        # successor that reclaims next does not get it again.
        await self._settle_all()

    async def _reclaim(self, topic: bytes, name: bytes) -> Sequence[tuple[int, int, object]]:
        # This instance's outcomes first, so an event it finished just before
        # is not delivered again.
        await self._settle_all()
        taken = await self._sql(
            "reclaim",
            self._events_q.claim_reclaim,
            {"topic": topic, "name": name, "channel": self._conn.names.event_channel},
            retry=True,
        )
        return [(event_id, attempt, consumer) for event_id, attempt, consumer, _ in taken]

    async def _backlog(self, name: bytes, low: bytes, high: bytes) -> list[str]:
        rows = await self._sql(
            "backlog",
            self._events_q.group_backlog,
            {"name": name, "low": low, "high": high},
            retry=True,
        )
        return [bytes(topic).decode() for (topic,) in rows]

    async def flush(self) -> None:
        """Wait until this instance's subscribers have handled what was published so far.

        Exactly: each local group takes claims until a take, started after the
        call, finds none due (every event committed before the call is then
        taken, by this instance or by another process's member of the same
        group), and every event this instance took by then has been handled
        (its callback returned, or raised its last allowed time). Events
        another process took, and redeliveries not yet due
        (``visibility_timeout``), are not waited for. Outcomes are written
        shortly after, in batches.
        """
        self._check_open()
        for group in self._groups():
            group.asked += 1
            await group.catch_up(group.asked)

    # -- taking and delivering ----------------------------------------------------------

    async def _leave(self, target: _Group) -> None:
        await target.stop_fetching()
        if target.private:
            await self._sql(
                "unsubscribe", self._events_q.group_delete, {"id": target.gid}, retry=True
            )
            return
        unfinished = target.unfinished()
        if unfinished:
            await self._sql(
                "unsubscribe",
                self._events_q.claim_hand_back,
                {
                    **_claim_arrays(self._consumer, [(target.gid, e, a) for e, a in unfinished]),
                    "topic": target.topic.encode(),
                    "channel": self._conn.names.event_channel,
                },
                retry=True,
            )

    async def _take(self, group: _Group) -> list[tuple[int, int, str]] | None:
        """The claims taken, sorted; ``None`` when the fence held this take off."""
        keys, prefixes = group.fence_arrays()
        rows = await self._sql(
            "take events",
            self._events_q.claim_take,
            {
                "group": group.gid,
                "limit": _BATCH,  # one at a time while a redelivery is due (claim_take.sql)
                "visible": self._event_opts.visibility_timeout,
                "consumer": self._consumer,
                "retake": group.unsure,
                "held": list(group.held) if group.unsure else [],
                "fence_keys": keys,
                "fence_prefixes": prefixes,
            },
        )
        if rows and rows[0][0] is None:
            return None  # unsure stays: the retake is still to be done
        group.unsure = False
        return sorted((int(e), int(a), body) for e, a, body in rows)

    async def _fetch_loop(self, group: _Group) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await group.wake.wait()
            group.wake.clear()
            asked = group.asked
            job = asyncio.ensure_future(self._take(group))
            try:
                claimed = await asyncio.shield(job)
            except asyncio.CancelledError:
                # Leaving: queue what the take got, so that leaving hands it
                # back instead of stranding it until the visibility timeout.
                with contextlib.suppress(Exception):
                    self._queue_claimed(group, await job or [])
                raise
            except BackendUnavailable as exc:
                logger.warning("cannot take events of topic %r: %s", group.topic, exc)
                # The take may have claimed events all the same: the next take
                # takes back what this instance holds and does not know of.
                group.unsure = True
                await _look_again(group, asked, 0.5)  # flush does not wait through an outage
                continue
            if claimed is None:
                # Fenced off: this subscriber's lease is not held (lost, or
                # not yet visible to this statement). Its holder unsubscribes
                # soon; look again meanwhile, slowly, without counting the
                # topic as read (flush does not wait for a fenced subscriber).
                await _look_again(group, asked, _FENCED_RETRY)
                continue
            self._queue_claimed(group, claimed)
            if len(claimed) >= _BATCH or any(attempt > 1 for _, attempt, _ in claimed):
                # More may wait (a redelivery is taken alone): take again once
                # these are handled, so no claim counts a delivery before its
                # callback can get it.
                group.progress.set()
                # At most a poll interval: a delivery that never completes here (a
                # stale subscriber's callback blocked until it leaves) must not stop
                # this group's takes.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(group.queue.join(), self._event_opts.poll_interval)
                group.wake.set()
            elif claimed:
                # Take again at once: a publish that found this batch's claims
                # still waiting to be taken did not notify.
                group.progress.set()
                group.wake.set()
                group.busy = True
            else:
                group.drained = max(group.drained, asked)
                group.progress.set()
                if group.busy:
                    # One more look shortly: such a publish may commit just
                    # after this take looked (the fallback poll would find it later).
                    group.busy = False
                    loop.call_later(_RECHECK, group.wake.set)

    def _queue_claimed(self, group: _Group, claimed: list[tuple[int, int, str]]) -> None:
        due: list[tuple[int, int, str]] = []
        for event_id, attempt, body in claimed:
            if attempt > self._event_opts.max_attempts:
                self._dropped(group, event_id, attempt - 1)
                self._settle(group.gid, event_id, attempt)
            else:
                due.append((event_id, attempt, body))
        group.queue_claimed(due)

    # -- outcomes, in batches -----------------------------------------------------------

    def _write_outcomes(self) -> None:
        self._writer.start()

    async def _settle_all(self) -> None:
        await self._writer.drain()

    async def _write_batch(self, batch: list[Outcome]) -> None:
        await self._sql(
            "acknowledge events",
            self._events_q.claim_settle,
            {
                **_claim_arrays(self._consumer, batch),
                "failed": [o[3] for o in batch],
                "visible": self._event_opts.visibility_timeout,
            },
            retry=True,
        )

    # -- upkeep -----------------------------------------------------------------------

    async def _maintain(self) -> None:
        """While there are subscribers: the fallback poll, heartbeats and pruning."""
        opts = self._event_opts
        tick = min(opts.poll_interval, opts.visibility_timeout / 4)
        next_heartbeat = time.monotonic() + opts.visibility_timeout / 3
        next_prune = time.monotonic()
        while self._topics or self._keeps_pruning():
            await asyncio.sleep(tick)
            now = time.monotonic()
            try:
                # The fallback poll: a lost notification (or a LISTEN connection
                # being replaced) delays an event by one tick at most; due
                # redeliveries are found the same way.
                await self._wake_due()
                if now >= next_heartbeat and self._topics:
                    next_heartbeat = now + opts.visibility_timeout / 3
                    await self._heartbeat()
                if now >= next_prune:
                    next_prune = now + opts.prune_interval
                    await _prune(self._sql, self._events_q, opts, self._lease_retention)
            except BackendUnavailable as exc:
                self._wake_all()  # each take finds out for itself
                logger.warning("cannot keep claims alive or prune: %s", exc)

    async def _wake_due(self) -> None:
        """Wake the groups with claims to take now, found in one statement for all."""
        groups = self._groups()
        due = await _due(self._sql, self._events_q, [g.gid for g in groups]) if groups else set()
        for group in groups:
            if group.gid in due or group.unsure:
                group.wake.set()

    async def _heartbeat(self) -> None:
        """Extend this instance's claims and groups; forget the claims and groups it lost."""
        await self._settle_all()  # the attempts compared below are then current
        groups = self._groups()
        held = [(g.gid, e, a) for g in groups for e, a in g.held.items()]
        kept: set[tuple[int, int]] = set()
        if held:
            visible = self._event_opts.visibility_timeout
            params = {**_claim_arrays(self._consumer, held), "visible": visible}
            rows = await self._sql("extend claims", self._events_q.claim_extend, params, retry=True)
            kept = {(int(g), int(e)) for g, e in rows}
        self._forget(groups, [h for h in held if h[:2] not in kept])
        alive = await self._sql(
            "extend groups",
            self._events_q.group_alive,
            {"ids": [g.gid for g in groups], "alive": self._alive_for},
            retry=True,
        )
        present = {int(gid) for (gid,) in alive}
        current = {id(g) for g in self._groups()}
        for group in groups:
            if group.gid not in present and id(group) in current:
                await self._rejoin(group)

    def _keeps_pruning(self) -> bool:
        return super()._keeps_pruning() or self._lease_retention > 0

    async def _rejoin(self, group: _Group) -> None:
        logger.warning(
            "consumer group of topic %r was deleted by another instance (this one was "
            "silent for longer than 5 x visibility_timeout); joining again",
            group.topic,
        )
        group.gid = await self._group_id(group.topic, group.name)
        group.held.clear()
        group.wake.set()

    # -- closing ----------------------------------------------------------------------

    async def _close_events(self) -> None:
        """Stop delivery, hand back what was taken and not delivered, write the last outcomes."""
        groups = await self._stop_events()
        try:
            for group in groups:
                await self._leave(group)
            await self._settle_all()
        except BackendUnavailable as exc:
            logger.warning("could not hand back taken events on close: %s", exc)


async def _due(sql: Sql, q: _Queries, ids: list[int]) -> set[int]:
    """Which of the groups ``ids`` have claims to take now."""
    return {int(gid) for (gid,) in await sql("find due events", q.claim_due, {"ids": ids})}


async def _prune(sql: Sql, q: _Queries, opts: EventOptions, lease_retention: float) -> None:
    """Delete dead groups, orphaned claims, events past the retention and old waiters;
    idle named groups and old lease rows when their retention is set."""
    retentions = {
        "event_expire": opts.retention,
        "group_prune_idle": opts.group_retention,
        "lease_prune": lease_retention,
    }
    for op, name in _PRUNE:
        retention = retentions.get(name)
        if retention == 0:
            continue
        params = {} if retention is None else {"retention": retention}
        await sql(op, getattr(q, name), params, retry=True)
