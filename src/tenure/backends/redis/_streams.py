"""The event half of the Redis backend: topics are Redis Streams, groups are
consumer groups.

Reading, acknowledging, reclaiming what a dead member left, and handing back
what a leaving member had not finished (``lua/hand_back.lua``, one atomic
step). Every command goes through the backend's connection, so a failure is a
:class:`BackendUnavailable` and a reader retries with back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from ..._contract import Capability
from ..._errors import BackendUnavailable, InvalidArgument
from ..._pubsub import Callback, Event, PubSub, check_callback, check_group, prepare_event
from ..._validate import check_name
from ._connection import RedisParts, _tag, load_script

__all__ = ["RedisStreams"]

logger = logging.getLogger("tenure.redis")

_HAND_BACK = load_script("hand_back")
# The consumer that holds handed-back entries until a member reclaims them. Real
# members are named "<instance hex>-<n>", so it cannot collide with one.
_RETURNED = b"tenure.returned"
# Idle time given to handed-back entries: far above any sensible claim_idle_ms,
# yet below the server's clock in ms (Redis ignores an IDLE that would place the
# delivery before the epoch).
_RETURNED_IDLE_MS = 10 * 365 * 24 * 3600 * 1000


def _parse_id(stream_id: bytes | str) -> tuple[int, int]:
    text = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _entries(reply: Any) -> list[tuple[bytes, Any]]:
    """Stream entries from an ``XREADGROUP`` reply (RESP2 list or RESP3 map)."""
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else (s[1] for s in reply)
    out: list[tuple[bytes, Any]] = []
    for entries in streams:
        out.extend((entry[0], entry[1]) for entry in entries)
    return out


@dataclass(eq=False)
class _Sub:
    topic: str
    callback: Callback
    stream: bytes
    group: str
    consumer: str
    fanout: bool
    task: asyncio.Task[None] | None = None
    # Set by unsubscribe: from then on the reader hands nothing to the callback.
    stopped: bool = False


class RedisStreams(RedisParts, PubSub):
    """Durable pub/sub on Redis Streams; the guarantees are in the
    :class:`~tenure.backends.redis.RedisStreamsPubSub` docstring."""

    capabilities = Capability.EVENTS | Capability.DURABLE_GROUPS

    # From the lease core, with which the backend combines this half.
    _closed: bool

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...

    def _setup_streams(
        self, *, max_attempts: int, stream_maxlen: int, claim_idle_ms: int, block_ms: int
    ) -> None:
        self._max_attempts = max_attempts
        self._stream_maxlen = stream_maxlen
        self._claim_idle_ms = claim_idle_ms
        self._block_ms = block_ms
        self._subs: dict[str, dict[Callback, _Sub]] = {}
        self._published: dict[str, tuple[int, int]] = {}
        self._consumers = 0

    def _stream_key(self, topic: str) -> bytes:
        return self._p + b"{" + _tag(topic) + b"}:stream"

    async def publish(self, topic: str, event: Event) -> Event:
        check_name(topic, "topic")
        event = prepare_event(event)
        self._check_open()
        payload: dict[Any, Any] = {b"e": event.to_json().encode("utf-8")}
        stream_id = await self._io(
            self._client.xadd,
            self._stream_key(topic),
            payload,
            maxlen=self._stream_maxlen,
            approximate=True,
        )
        parsed = _parse_id(stream_id)
        if parsed > self._published.get(topic, (0, 0)):
            self._published[topic] = parsed
        return event

    async def subscribe(self, topic: str, callback: Callback, *, group: str | None = None) -> None:
        """Deliver ``topic`` to ``callback``: every event (no ``group``) or a share of the group's.

        A new group, and every fan-out subscription, starts at the end of the
        stream: events published after this returns are delivered. An
        existing group continues where it was.
        """
        check_name(topic, "topic")
        check_callback(callback)
        check_group(group)
        self._check_open()
        subs = self._subs.setdefault(topic, {})
        if callback in subs:
            raise InvalidArgument(f"callback is already subscribed to topic {topic!r}")
        self._consumers += 1
        name = f"f:{uuid.uuid4().hex}" if group is None else f"g:{group}"
        sub = _Sub(
            topic=topic,
            callback=callback,
            stream=self._stream_key(topic),
            group=name,
            consumer=f"{self._instance}-{self._consumers}",
            fanout=group is None,
        )
        subs[callback] = sub
        try:
            await self._create_group(sub)
        except BaseException:
            subs.pop(callback, None)
            if not subs:
                self._subs.pop(topic, None)
            raise
        sub.task = asyncio.get_running_loop().create_task(
            self._read_loop(sub), name=f"tenure-redis-{topic}"
        )

    async def _create_group(self, sub: _Sub) -> None:
        try:
            await self._io(self._client.xgroup_create, sub.stream, sub.group, "$", mkstream=True)
        except BackendUnavailable as exc:
            cause = exc.__cause__
            if not (isinstance(cause, ResponseError) and "BUSYGROUP" in str(cause)):
                raise

    async def unsubscribe(self, topic: str, callback: Callback) -> None:
        """Stop ``callback``; a fan-out subscription's private group is destroyed.

        In a named group, the events this member was given but had not
        acknowledged (one being handled at that moment, or read but not yet
        handed to the callback) are handed back to the group before this
        returns: each member reclaims them at its next look (when it
        subscribes, then at least every ``min(block_ms, claim_idle_ms / 2)``),
        without waiting for ``claim_idle_ms``, and with the delivery that was
        not finished not counted in ``attempt``. The member is then removed
        from the group. Raises :class:`BackendUnavailable` if Redis could not
        be reached; the events then stay with this member until another one
        claims them after ``claim_idle_ms``.
        """
        check_name(topic, "topic")
        self._check_open()
        subs = self._subs.get(topic, {})
        sub = subs.pop(callback, None)
        if not subs:
            self._subs.pop(topic, None)
        if sub is None:
            return
        await self._stop(sub)
        await self._retire(sub)

    @staticmethod
    async def _stop(sub: _Sub) -> None:
        """End the reader of ``sub``; when this returns it takes no more entries."""
        sub.stopped = True
        task = sub.task
        if task is None:
            return
        # One cancel is not always enough: redis-py can lose it (see ``_io``), and
        # a callback can swallow it. Cancel again until the reader has ended; it
        # also checks ``stopped`` between steps.
        while not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=0.1)
        await asyncio.gather(task, return_exceptions=True)

    async def _retire(self, sub: _Sub) -> None:
        """Remove a stopped subscription's trace: its private group, or its member.

        A group member's unacknowledged entries are handed back to the group
        first (see ``unsubscribe``), in the same script that deletes the
        member, so none is dropped with it.
        """
        client = self._client
        if sub.fanout:
            await self._io(client.xgroup_destroy, sub.stream, sub.group)
            return
        try:
            moved = await self._eval(
                _HAND_BACK,
                (sub.stream,),
                (sub.group, sub.consumer, _RETURNED, _RETURNED_IDLE_MS),
            )
        except BackendUnavailable as exc:
            cause = exc.__cause__
            if isinstance(cause, ResponseError) and "NOGROUP" in str(cause):
                return  # the group is gone, and with it whatever it held
            raise
        if moved:
            logger.debug(
                "topic %r: handed %d unacknowledged events back to group %r",
                sub.topic,
                moved,
                sub.group,
            )

    async def flush(self) -> None:
        """Wait until local subscribers are done with what this instance published.

        Guarantee: for every topic this instance published to and that has a
        local subscriber, every event published through this instance before
        the call has been delivered by each local subscription's consumer
        group and is no longer pending at that subscription (its callback
        returned, or the event was dropped after ``max_attempts``). An event
        of a named group taken by a member in another process is not waited
        for, nor are events published by other clients. Polls Redis every
        5 ms; returns early if the backend is closed meanwhile.
        """
        self._check_open()
        client = self._client
        targets = dict(self._published)
        while not self._closed:
            busy = False
            for topic, target in targets.items():
                subs = list(self._subs.get(topic, {}).values())
                if not subs:
                    continue
                groups = await self._io(client.xinfo_groups, subs[0].stream)
                delivered = {g["name"]: g["last-delivered-id"] for g in groups}
                end = f"{target[0]}-{target[1]}"
                for sub in subs:
                    last = delivered.get(sub.group.encode("utf-8"))
                    if last is None or _parse_id(last) < target:
                        busy = True
                        break
                    pending = await self._io(
                        client.xpending_range, sub.stream, sub.group, "-", end, 1, sub.consumer
                    )
                    if pending:
                        busy = True
                        break
                if busy:
                    break
            if not busy:
                return
            await asyncio.sleep(0.005)

    async def _read_loop(self, sub: _Sub) -> None:
        loop = asyncio.get_running_loop()
        client = self._client
        backoff = 0.05
        next_claim = loop.time()
        # Entries handed back by a leaving member are claimable at once: look for
        # them at least once per blocking read, not only every claim_idle_ms / 2.
        claim_every = min(self._claim_idle_ms / 2000, self._block_ms / 1000)
        # After a failure, first re-read this consumer's own pending entries: a
        # lost XREADGROUP reply or XACK leaves them there, and ">" never
        # returns them again.
        history = False
        while not sub.stopped:
            try:
                if not sub.fanout and loop.time() >= next_claim:
                    next_claim = loop.time() + claim_every
                    await self._reclaim(sub)
                if history:
                    await self._redeliver_own(sub)
                    history = False
                reply = await self._io(
                    client.xreadgroup,
                    sub.group,
                    sub.consumer,
                    {sub.stream: ">"},
                    count=64,
                    block=self._block_ms,
                    blocking=True,
                )
                backoff = 0.05
                for entry_id, fields in _entries(reply):
                    await self._handle(sub, entry_id, fields, 1)
            except BackendUnavailable as exc:
                history = True
                cause = exc.__cause__
                if isinstance(cause, ResponseError) and "NOGROUP" in str(cause):
                    # The stream or group vanished (deleted, or a restart without
                    # persistence): start again at the end of the stream.
                    logger.warning(
                        "consumer group of topic %r disappeared; recreating it", sub.topic
                    )
                    with contextlib.suppress(BackendUnavailable):
                        await self._create_group(sub)
                    continue
                logger.warning(
                    "reading topic %r from Redis at %s failed (%s); retrying in %.2f s",
                    sub.topic,
                    self._where,
                    exc,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _redeliver_own(self, sub: _Sub) -> None:
        """Handle the entries this consumer was given but never acknowledged."""
        client = self._client
        while True:
            pending = await self._io(
                client.xpending_range, sub.stream, sub.group, "-", "+", 64, sub.consumer
            )
            if not pending:
                return
            counts = {p["message_id"]: int(p["times_delivered"]) for p in pending}
            # XCLAIM to ourselves bumps the delivery count and returns the entries.
            claimed = await self._io(
                client.xclaim, sub.stream, sub.group, sub.consumer, 0, list(counts)
            )
            for entry_id, fields in claimed or ():
                await self._handle(sub, entry_id, fields, counts.get(entry_id, 1) + 1)
            if len(pending) < 64:
                return

    async def _reclaim(self, sub: _Sub) -> None:
        """Take over events that other consumers of the group left unacknowledged."""
        client = self._client
        pending = await self._io(
            client.xpending_range, sub.stream, sub.group, "-", "+", 64, idle=self._claim_idle_ms
        )
        counts = {
            p["message_id"]: int(p["times_delivered"])
            for p in pending
            if p["consumer"] != sub.consumer.encode("utf-8")
        }
        if not counts:
            return
        claimed = await self._io(
            client.xclaim, sub.stream, sub.group, sub.consumer, self._claim_idle_ms, list(counts)
        )
        for entry_id, fields in claimed or ():
            await self._handle(sub, entry_id, fields, counts.get(entry_id, 1) + 1)

    async def _handle(self, sub: _Sub, entry_id: bytes, fields: Any, attempt: int) -> None:
        if sub.stopped:
            return  # left pending: unsubscribe hands it back to the group
        client = self._client
        raw = fields.get(b"e") if isinstance(fields, dict) else None
        event: Event | None = None
        if raw is not None:
            try:
                event = Event.from_json(raw, attempt=attempt)
            except (ValueError, KeyError, TypeError):
                logger.error(
                    "topic %r: entry %r is not a tenure event; dropping it", sub.topic, entry_id
                )
        if event is not None and event.attempt > self._max_attempts:
            logger.error(
                "topic %r: event %s was delivered %d times without success; dropping it",
                sub.topic,
                event.id,
                event.attempt - 1,
            )
            event = None
        while event is not None:
            try:
                await sub.callback(event)
            except Exception:
                if event.attempt >= self._max_attempts:
                    logger.error(
                        "callback for topic %r raised on event %s %d times; dropping it",
                        sub.topic,
                        event.id,
                        event.attempt,
                        exc_info=True,
                    )
                    break
                logger.warning(
                    "callback for topic %r raised on event %s (attempt %d of %d); redelivering",
                    sub.topic,
                    event.id,
                    event.attempt,
                    self._max_attempts,
                    exc_info=True,
                )
                event = replace(event, attempt=event.attempt + 1)
                # Record the attempt in the group (and reset the idle time) so a
                # crash now resumes with the right count and nobody steals it.
                with contextlib.suppress(BackendUnavailable):
                    await self._io(
                        client.xclaim,
                        sub.stream,
                        sub.group,
                        sub.consumer,
                        0,
                        [entry_id],
                        retrycount=event.attempt,
                        justid=True,
                    )
            else:
                break
        # CancelledError skips this: the event stays pending, and in a named
        # group another member claims it.
        await self._io(client.xack, sub.stream, sub.group, entry_id)

    # -- closing ---------------------------------------------------------------

    def _take_subs(self) -> list[_Sub]:
        """Every subscription, forgotten (closing): to stop, then retire."""
        subs = [s for topic in self._subs.values() for s in topic.values()]
        self._subs.clear()
        return subs

    async def _retire_all(self, subs: list[_Sub]) -> None:
        """Retire stopped subscriptions at close; best effort, at most 2 s."""
        if not subs or not self._conn.ready:
            return
        # A dead server must not hold up closing.
        try:
            async with asyncio.timeout(2.0):
                for sub in subs:
                    await self._retire(sub)
        except (TimeoutError, BackendUnavailable) as exc:
            logger.warning("could not remove consumer groups at close: %s", exc)
