"""The event half of the SQLite backend: a durable log, group cursors and claims.

:class:`EventLog` holds the jobs (SQL only, on the worker thread);
:class:`SqliteEvents` the event-loop side, on the client side both SQL backends
share (:mod:`tenure.backends._claimed`: delivery, the outcome queue,
subscriptions): fetch loops that claim events for local groups, batched
acknowledgements, heartbeats and pruning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..._errors import BackendUnavailable
from ..._pubsub import Event
from .._claimed import ClaimedEvents, ClaimGroup, Outcome
from ._connection import Connected, Options, execute_chunked, load_sql, write
from ._wake import PUBLISHED

__all__ = ["EventLog", "SqliteEvents"]

logger = logging.getLogger("tenure.sqlite")

_PUBLISH = load_sql("event_publish")
_FIRST_EVENT = load_sql("event_first")
_TOPIC_TOP = load_sql("event_top")
_LAST_EVENT = load_sql("event_last")
_FRESH_EVENTS = load_sql("event_fresh")
_PRUNE_EVENTS = load_sql("event_prune")
_JOIN_GROUP = load_sql("group_join")
_FIND_GROUP = load_sql("group_find")
_GROUP_CURSOR = load_sql("group_cursor")
_ADVANCE_GROUP = load_sql("group_advance")
_GROUP_ALIVE = load_sql("group_alive")
_DELETE_GROUP = load_sql("group_delete")
_PRUNE_DEAD_GROUPS = load_sql("group_prune_dead")
_PRUNE_IDLE_GROUPS = load_sql("group_prune_idle")
_SKIP_PRUNED = load_sql("group_skip_pruned")
_BACKLOG = load_sql("group_backlog")
_ANY_DUE_CLAIM = load_sql("claim_any_due")
_IDLE_GROUPS = load_sql("group_idle_many")
_DUE_CLAIMS = load_sql("claim_due")
_TAKE_CLAIM = load_sql("claim_take")
_SELECT_LEASE = load_sql("lease_select")
_NEW_CLAIM = load_sql("claim_new")
_DELETE_CLAIM = load_sql("claim_delete")
_ACK_CLAIM = load_sql("claim_ack")
_RETRY_CLAIM = load_sql("claim_retry")
_RECLAIM = load_sql("claim_reclaim")
_EXTEND_CLAIM = load_sql("claim_extend")
_HAND_BACK_CLAIM = load_sql("claim_hand_back")
_DELETE_GROUP_CLAIMS = load_sql("claim_delete_group")
_PRUNE_DEAD_CLAIMS = load_sql("claim_prune_dead")
_PRUNE_ORPHAN_CLAIMS = load_sql("claim_prune_orphans")

_BATCH = 100  # events claimed per fetch
# Each claim taken counts a delivery, and a member that dies leaves the claims it
# never reached counted all the same: behind one event that kills its reader (or
# readers killed in a row), innocent events would reach max_attempts and be
# dropped. So a fetch takes at most one redelivery (and then nothing new: the
# redelivery is older), just before its callback gets it. A death then costs a
# delivery only to the event being handled and, once, to the new events of the
# fetch under way.
_FENCED_RETRY = 0.1  # seconds before a fetch that the fence held off looks again


class _Gone(Exception):
    """The consumer group row disappeared (deleted as stale by another process)."""


@dataclass(eq=False)
class _Group(ClaimGroup):
    # The newest event id of the topic this group has claims for (or skipped).
    cursor: int = 0
    # The last fetch was fenced off (flush does not wait for such a subscriber).
    fenced: bool = False

    def behind(self, mark: int) -> bool:
        return self.cursor < mark and not self.fenced


class EventLog:
    """The event log's jobs, each one transaction; only the worker thread runs them.

    Claims belong to ``consumer`` (this backend instance); a private group's
    heartbeat keeps it for ``alive_for`` seconds. Times are ``time.time()``.
    """

    def __init__(
        self,
        opts: Options,
        consumer: str,
        alive_for: float,
        ring: Callable[[int, bytes], None],
        lease_clock: Callable[[], float],
    ) -> None:
        self.opts = opts
        self.consumer = consumer
        self.alive_for = alive_for
        self.ring = ring  # wakes the other instances of the file after a publish
        self.lease_clock = lease_clock  # the lease half's clock, for fences
        self.next_prune = 0.0

    def publish(
        self, conn: sqlite3.Connection, topic: bytes, body: str, source: str | None
    ) -> str | None:
        """Append an event; with a publisher-given id ``source`` already kept, the first's body."""
        first = None
        # Retention and the dedupe window count from when the log stored the
        # event, never from its created_at: a replayed old event is delivered.
        now = time.time()
        with write(conn):
            stored = conn.execute(_PUBLISH, (topic, body, now, source)).rowcount
            if not stored and source is not None:
                row = conn.execute(_FIRST_EVENT, (topic, source)).fetchone()
                first = None if row is None else row[0]
            if now >= self.next_prune:
                self.prune(conn, now)
        if stored:
            self.ring(PUBLISHED, topic)
        return first

    def prune(self, conn: sqlite3.Connection, now: float) -> None:
        self.next_prune = now + self.opts.prune_interval
        conn.execute(_PRUNE_DEAD_CLAIMS, (now,))
        conn.execute(_PRUNE_DEAD_GROUPS, (now,))
        if self.opts.group_retention > 0:
            conn.execute(_PRUNE_IDLE_GROUPS, (now - self.opts.group_retention,))
        oldest = (now - self.opts.retention, now - self.opts.dedupe_window)
        if conn.execute(_PRUNE_EVENTS, oldest).rowcount:
            conn.execute(_PRUNE_ORPHAN_CLAIMS)
            conn.execute(_SKIP_PRUNED)

    def join(self, conn: sqlite3.Connection, topic: bytes, name: bytes | None) -> tuple[int, int]:
        """Join (creating it at the log's end if needed) a group; its id and cursor."""
        private = name is None
        if name is None:
            name = b"\0fan-out\0" + uuid.uuid4().bytes
        with write(conn):
            conn.execute(_JOIN_GROUP, (topic, name, int(private), time.time() + self.alive_for))
            gid, cursor = conn.execute(_FIND_GROUP, (topic, name)).fetchone()
        return gid, cursor

    def fetch(
        self,
        conn: sqlite3.Connection,
        gid: int,
        topic: bytes,
        fence: tuple[list[bytes], list[bytes]],
        acks: deque[Outcome],
    ) -> tuple[list[tuple[int, int, str]], int, list[tuple[int, int]]] | None:
        """Claim due redeliveries and new events for group ``gid``.

        Returns (claimed (id, attempt, body), the group's cursor, dropped (id, attempts)),
        or ``None`` when ``fence`` (lease keys and owner prefixes, see
        :meth:`ClaimGroup.fence_arrays`) names leases none of which is held,
        judged in the transaction that would take the claims.
        A read-only look comes first so that spurious wake-ups cost no write.
        Outcomes still queued (``acks``, of any group) are written in the same
        transaction: one write-lock turn instead of two, which matters when other
        processes publish to the file at the same time (each turn is a chance to
        collide, and a collision costs SQLite's busy handler a 1 ms sleep or more).
        Raises :class:`_Gone` if the group was deleted.
        """
        now = time.time()
        row = conn.execute(_GROUP_CURSOR, (gid,)).fetchone()
        if row is None:
            raise _Gone
        top = conn.execute(_TOPIC_TOP, (topic,)).fetchone()[0]
        due = conn.execute(_ANY_DUE_CLAIM, (gid, now)).fetchone()
        if top <= row[0] and due is None:
            return [], max(row[0], top), []
        claimed: list[tuple[int, int, str]] = []
        dropped: list[tuple[int, int]] = []
        visible = now + self.opts.visibility_timeout
        with write(conn):
            fenced = bool(fence[0]) and not self._fence_holds(conn, fence)
            row = None if fenced else conn.execute(_GROUP_CURSOR, (gid,)).fetchone()
            if row is None and not fenced:
                raise _Gone  # before the outcomes are taken: rolled back, they would be lost
            self._write_acks(conn, acks, 1000)
            if row is None:
                return None
            cursor: int = row[0]
            # Redeliveries one at a time (see _BATCH), spent ones dropped on the way.
            for event_id, attempt, body in conn.execute(_DUE_CLAIMS, (gid, now, _BATCH)):
                if body is None or attempt >= self.opts.max_attempts:
                    conn.execute(_DELETE_CLAIM, (gid, event_id))
                    if body is not None:
                        dropped.append((event_id, attempt))
                    continue
                conn.execute(_TAKE_CLAIM, (attempt + 1, visible, self.consumer, gid, event_id))
                claimed.append((event_id, attempt + 1, body))
                break
            if not claimed:
                cursor = self._claim_fresh(conn, gid, topic, cursor, visible, claimed, _BATCH)
        return claimed, cursor, dropped

    def _claim_fresh(
        self,
        conn: sqlite3.Connection,
        gid: int,
        topic: bytes,
        cursor: int,
        visible: float,
        claimed: list[tuple[int, int, str]],
        batch: int,
    ) -> int:
        """Claim up to ``batch`` events after ``cursor`` (added to ``claimed``); the new cursor."""
        fresh = conn.execute(_FRESH_EVENTS, (topic, cursor, batch)).fetchall()
        if not fresh:
            return cursor
        conn.executemany(
            _NEW_CLAIM, [(gid, event_id, visible, self.consumer) for event_id, _ in fresh]
        )
        cursor = fresh[-1][0]
        conn.execute(_ADVANCE_GROUP, (cursor, gid))
        claimed.extend((event_id, 1, body) for event_id, body in fresh)
        return cursor

    def _fence_holds(
        self, conn: sqlite3.Connection, fence: tuple[list[bytes], list[bytes]]
    ) -> bool:
        """Inside the fetch's write transaction: one fence lease is live and its owner's."""
        now = self.lease_clock()
        for key, prefix in zip(*fence, strict=True):
            row = conn.execute(_SELECT_LEASE, (key,)).fetchone()
            if row is not None and row[2] > now and bytes(row[0]).startswith(prefix):
                return True
        return False

    def settle(self, conn: sqlite3.Connection, acks: deque[Outcome]) -> None:
        """Write queued acknowledgements and failed attempts, up to 1000 at once."""
        if acks:
            with write(conn):
                self._write_acks(conn, acks, 1000)

    def _write_acks(self, conn: sqlite3.Connection, acks: deque[Outcome], most: int) -> None:
        """Inside a write transaction: up to ``most`` queued outcomes, oldest first.

        Each names the delivery it settles (consumer and attempt), so one that a
        reclaim or another member's take has replaced changes nothing.
        """
        visible = time.time() + self.opts.visibility_timeout
        for _ in range(most):
            if not acks:
                return
            gid, event_id, attempt, failed = acks.popleft()
            if failed:
                conn.execute(_RETRY_CLAIM, (visible, gid, event_id, self.consumer, attempt))
            else:
                conn.execute(_ACK_CLAIM, (gid, event_id, self.consumer, attempt))

    def heartbeat(
        self,
        conn: sqlite3.Connection,
        held: list[tuple[int, int, int]],
        gids: list[int],
        prune: bool,
        acks: deque[Outcome],
    ) -> list[tuple[int, int, int]]:
        """Keep this consumer's claims (group, event, attempt) and groups alive; prune if asked.

        Outcomes still queued are written first, so the attempts compared are
        current. Returns the claims this consumer no longer holds (reclaimed, or
        taken by another member after they timed out).
        """
        now = time.time()
        lost: list[tuple[int, int, int]] = []
        with write(conn):
            self._write_acks(conn, acks, len(acks))
            visible = now + self.opts.visibility_timeout
            rows = execute_chunked(conn, _EXTEND_CLAIM, held, visible, self.consumer, width=3)
            extended = {(g, e, a) for g, e, a in rows}
            lost = [claim for claim in held if claim not in extended]
            execute_chunked(conn, _GROUP_ALIVE, gids, now + self.alive_for)
            if prune:
                self.prune(conn, now)
        return lost

    def reclaim(
        self, conn: sqlite3.Connection, topic: bytes, name: bytes, acks: deque[Outcome]
    ) -> list[tuple[int, int, str]]:
        """Make every taken claim of a named group visible now; the claims as they were.

        This consumer's queued outcomes are written first, so an event it
        finished just before is not delivered again.
        """
        with write(conn):
            self._write_acks(conn, acks, len(acks))
            rows: list[tuple[int, int, str]] = conn.execute(_RECLAIM, (topic, name)).fetchall()
        return rows

    def backlog(
        self, conn: sqlite3.Connection, name: bytes, low: bytes, high: bytes
    ) -> list[bytes]:
        """Topics in [low, high) whose group ``name`` has unread or unacknowledged events."""
        return [topic for (topic,) in conn.execute(_BACKLOG, (name, low, high))]

    def leave(
        self, conn: sqlite3.Connection, gid: int, private: bool, unfinished: list[tuple[int, int]]
    ) -> None:
        """Give up group ``gid``: forget a private group, hand back a named group's claims.

        ``unfinished``: (event id, attempt it was claimed for) never delivered.
        """
        with write(conn):
            if private:
                conn.execute(_DELETE_GROUP_CLAIMS, (gid,))
                conn.execute(_DELETE_GROUP, (gid,))
            else:
                conn.executemany(
                    _HAND_BACK_CLAIM,
                    [(gid, e, self.consumer, attempt) for e, attempt in unfinished],
                )

    def topic_tops(self, conn: sqlite3.Connection, topics: list[bytes]) -> dict[bytes, int]:
        """The newest event id of each topic, in one snapshot."""
        conn.execute("BEGIN")
        tops = {t: conn.execute(_TOPIC_TOP, (t,)).fetchone()[0] for t in topics}
        conn.execute("COMMIT")
        return tops

    def idle_groups(self, conn: sqlite3.Connection, gids: list[int]) -> set[int]:
        """The groups among ``gids`` with nothing to fetch (see ``group_idle_many.sql``),
        in one snapshot: one statement per ``CHUNK`` groups, however many there are."""
        now = time.time()
        conn.execute("BEGIN")
        try:
            rows = execute_chunked(conn, _IDLE_GROUPS, gids, now)
        finally:
            conn.execute("COMMIT")
        return {gid for (gid,) in rows}

    def last_event(self, conn: sqlite3.Connection) -> int:
        value: int = conn.execute(_LAST_EVENT).fetchone()[0]
        return value


class SqliteEvents(ClaimedEvents[_Group], Connected):
    """Pub/sub on the event log: the event-loop side.

    Each local group has a fetch loop that claims events in batches (woken by
    local publishes, change detection and the maintenance tick) and a queue
    drained by one delivery worker per callback. Outcomes are written back in
    batches, each naming the delivery (consumer, attempt) it settles; a
    maintenance task extends this instance's claims, drops from its queues the
    ones it no longer holds (reclaimed, or taken by another member), and prunes.
    ``reclaim``, ``backlog`` and deduplicating ``publish`` are one job each (see
    :class:`SqlitePubSub` for their guarantees).
    """

    _task_prefix = "tenure-sqlite"
    _logger = logger
    _clock: Callable[[], float]  # the lease half's

    def _init_events(self, consumer: str, alive_for: float) -> None:
        self._init_claimed(self._opts, consumer)
        # The clock itself, not a method of self: the worker thread holds the log,
        # and must not keep this object alive.
        self._log = EventLog(self._opts, consumer, alive_for, self._worker.wake.ring, self._clock)
        # The newest event id seen; change detection looks for events after it.
        self._last_event_id: int | None = None
        self._acks_running = False
        self._acks_idle = asyncio.Event()
        self._acks_idle.set()

    def _new_events(self, topics: list[tuple[bytes, int]]) -> None:
        """Change detection found events (topic, newest id) committed elsewhere."""
        for topic_b, max_id in topics:
            self._wake(topic_b.decode())
            if self._last_event_id is None or max_id > self._last_event_id:
                self._last_event_id = max_id

    def _subscriptions_changed(self) -> None:
        self._update_polling()

    # -- the contract -----------------------------------------------------------------

    async def _append(self, topic: str, event: Event, given: bool) -> str | None:
        source = event.id if given else None
        return await self._run(self._log.publish, topic.encode(), event.to_json(), source)

    async def _join(self, topic: str, group: str | None) -> _Group:
        # Listening first: a publish committed after the reads below rings this instance.
        self._worker.listen()
        # Change detection looks for events after the newest one at the first subscribe.
        if self._last_event_id is None:
            self._last_event_id = await self._run(self._log.last_event)
        gid, cursor = await self._run(
            self._log.join, topic.encode(), None if group is None else group.encode()
        )
        return _Group(topic, group, gid, cursor=cursor)

    async def _drop(self, target: _Group) -> None:
        await self._run(self._log.leave, target.gid, True, [])

    async def _reclaim(self, topic: bytes, name: bytes) -> Sequence[tuple[int, int, object]]:
        return await self._run(self._log.reclaim, topic, name, self._outcomes)

    async def _backlog(self, name: bytes, low: bytes, high: bytes) -> list[str]:
        topics = await self._run(self._log.backlog, name, low, high)
        return [t.decode() for t in topics]

    async def flush(self) -> None:
        """Wait until this instance's subscribers have handled what was published so far.

        Exactly: for every topic with a local subscriber, the newest event of
        that topic committed before the call (by any process) is looked up;
        the call returns once each local group's cursor has reached it (its
        events are claimed, by this instance or by another process's member of
        the same group) and every event this instance claimed and queued by
        then has been handled (its callback returned, or raised its last
        allowed time). Events another process claimed, and redeliveries not yet
        due (``visibility_timeout``), are not waited for. Acknowledgements are
        written shortly after, in batches.
        """
        self._check_open()
        groups = self._groups()
        if not groups:
            return
        tops = await self._run(self._log.topic_tops, [t.encode() for t in self._topics])
        for group in groups:
            await group.catch_up(tops.get(group.topic.encode(), 0))

    # -- claiming ---------------------------------------------------------------------

    async def _leave(self, target: _Group) -> None:
        await target.stop_fetching()
        await self._run(self._log.leave, target.gid, target.private, target.unfinished())

    async def _fetch_loop(self, group: _Group) -> None:
        topic = group.topic.encode()
        while True:
            await group.wake.wait()
            group.wake.clear()
            job = self._run(self._log.fetch, group.gid, topic, group.fence_arrays(), self._outcomes)
            try:
                fetched = await asyncio.shield(job)
            except asyncio.CancelledError:
                # Leaving: the job runs to its end on the worker thread anyway.
                # Queue what it claimed, so that leaving hands it back instead of
                # stranding it until visibility_timeout.
                with contextlib.suppress(Exception):
                    done = await job
                    group.queue_claimed(done[0] if done is not None else [])
                raise
            except _Gone:
                logger.warning(
                    "consumer group of topic %r was deleted by another process (this one was "
                    "silent for longer than 5 x visibility_timeout); joining again at the log's end",
                    group.topic,
                )
                try:
                    group.gid, group.cursor = await self._run(
                        self._log.join, topic, None if group.name is None else group.name.encode()
                    )
                except BackendUnavailable:
                    await asyncio.sleep(0.5)
                group.wake.set()
                continue
            except BackendUnavailable as exc:
                logger.warning("cannot fetch events of topic %r: %s", group.topic, exc)
                group.progress.set()
                await asyncio.sleep(0.5)
                group.wake.set()
                continue
            group.fenced = fetched is None
            if fetched is None:
                # Fenced off: this subscriber's lease is not held. Its holder
                # unsubscribes soon; look again meanwhile, slowly.
                group.progress.set()
                await asyncio.sleep(_FENCED_RETRY)
                group.wake.set()
                continue
            claimed, cursor, dropped = fetched
            group.cursor = max(group.cursor, cursor)
            for event_id, attempts in dropped:
                self._dropped(group, event_id, attempts)
            group.queue_claimed(claimed)
            group.progress.set()
            if len(claimed) >= _BATCH or any(attempt > 1 for _, attempt, _ in claimed):
                # More may wait (a redelivery is taken alone, see _BATCH): take
                # again once these are handled, so no claim counts a delivery
                # before its callback can get it.
                # At most a poll interval: a delivery that never completes here (a
                # stale subscriber's callback blocked until it leaves) must not stop
                # this group's takes.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(group.queue.join(), self._event_opts.poll_interval)
                group.wake.set()

    # -- outcomes, in batches, and upkeep ---------------------------------------------

    def _write_outcomes(self) -> None:
        if not self._acks_running:
            self._acks_running = True
            self._acks_idle.clear()
            self._run(self._log.settle, self._outcomes).add_done_callback(self._settled)

    def _settled(self, fut: asyncio.Future[None]) -> None:
        self._acks_running = False
        if not fut.cancelled() and fut.exception() is not None:
            # The claims stay pending and are redelivered after visibility_timeout.
            logger.warning("cannot write acknowledgements to %s: %s", self._file, fut.exception())
            self._outcomes.clear()
        thread = self._worker.thread
        if self._outcomes and thread is not None and thread.is_alive():
            self._write_outcomes()
        else:
            self._acks_idle.set()

    async def _maintain(self) -> None:
        """While there are subscribers: look for due redeliveries, keep claims alive, prune."""
        vt = self._opts.visibility_timeout
        tick = min(0.5, vt / 4)
        next_heartbeat = time.monotonic() + vt / 3
        next_prune = time.monotonic() + self._opts.prune_interval
        while self._topics or self._keeps_pruning():
            await asyncio.sleep(tick)
            groups = self._groups()
            # One look for every group, not one per group: an idle subscriber
            # costs nothing of its own between changes.
            if groups:
                try:
                    idle = await self._run(self._log.idle_groups, [g.gid for g in groups])
                except BackendUnavailable:
                    idle = set()  # every group looks, and reports what fails
                for group in groups:
                    if group.gid not in idle:
                        group.wake.set()
            now = time.monotonic()
            if (groups and now >= next_heartbeat) or now >= next_prune:
                next_heartbeat = now + vt / 3
                prune = now >= next_prune
                if prune:
                    next_prune = now + self._opts.prune_interval
                try:
                    lost = await self._run(
                        self._log.heartbeat,
                        [(g.gid, e, a) for g in groups for e, a in g.held.items()],
                        [g.gid for g in groups],
                        prune,
                        self._outcomes,
                    )
                except BackendUnavailable as exc:
                    logger.warning("cannot extend claims in %s: %s", self._file, exc)
                    continue
                self._forget(groups, lost)

    # -- closing ----------------------------------------------------------------------

    async def _hand_back(self, groups: list[_Group]) -> None:
        """Leave ``groups`` (handing back their claims) and write the last acknowledgements."""
        for group in groups:
            await self._leave(group)
        await self._acks_idle.wait()
