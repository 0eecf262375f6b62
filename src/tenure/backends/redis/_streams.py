"""The event half of the Redis backend: topics are Redis Streams, groups are
consumer groups.

Publishing (``lua/publish.lua``: the entry, the dedupe guard and the backlog
index in one atomic step), subscribing, handing back what a leaving member had
not finished (``lua/hand_back.lua``), giving a group's unfinished entries back
on request (``lua/reclaim.lua``), listing topics with a backlog
(``lua/backlog.lua``) and flushing; the reader of a subscription is in
``_reading``. Every command goes through the backend's connection, so a
failure is a :class:`BackendUnavailable`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Collection
from typing import TYPE_CHECKING, cast

from redis.exceptions import ResponseError

from ..._contract import Capability
from ..._errors import BackendUnavailable, ConfigurationError, InvalidArgument
from ..._output import OutputStore
from ..._pubsub import (
    Callback,
    Event,
    LeaseFence,
    PubSub,
    check_backlog,
    check_publish,
    check_subscribe,
)
from ..._validate import check_name
from ._keys import _tag
from ._reading import _RETURNED, _RETURNED_IDLE_MS, StreamReader, _Sub, stop_reader
from ._scripts import load_script

if TYPE_CHECKING:
    from ._backend import RedisStreamsPubSub

__all__ = ["RedisStreams"]

logger = logging.getLogger("tenure.redis")

_HAND_BACK = load_script("hand_back")
_FANOUT_END = load_script("fanout_end")
_PUBLISH = load_script("publish")
_RECLAIM = load_script("reclaim")
_BACKLOG = load_script("backlog")
# Topics without a local subscriber whose last publish flush still knows.
_PUBLISHED_MAX = 1024
# Topics checked by one run of backlog.lua: bounds how long one script blocks Redis.
_BACKLOG_BATCH = 256


def _parse_id(stream_id: bytes | str) -> tuple[int, int]:
    text = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class RedisStreams(StreamReader, PubSub):
    """Durable pub/sub on Redis Streams; the guarantees are in the
    :class:`~tenure.backends.redis.RedisStreamsPubSub` docstring."""

    capabilities = Capability.RUNTIME_LOG | Capability.FENCED_TAKES

    # From the lease core, with which the backend combines this half.
    _closed: bool

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...

        def _lease_key(self, key: str) -> tuple[bytes, bytes]: ...

    def output_store(self) -> OutputStore:
        """A store of thread output streams on this backend (``ThreadRuntime(output=...)``):
        its appends are fenced by the leases of the backend this half is part of."""
        from ._output import RedisOutput

        return RedisOutput(cast("RedisStreamsPubSub", self))

    def _setup_streams(
        self,
        *,
        max_attempts: int,
        stream_maxlen: int,
        claim_idle_ms: int,
        block_ms: int,
        dedupe_window_ms: int,
        retention_ms: int = 0,
        long_block_ms: int | None = None,
    ) -> None:
        self._retention_ms = retention_ms
        self._max_attempts = max_attempts
        self._stream_maxlen = stream_maxlen
        self._dedupe_window_ms = dedupe_window_ms
        self._claim_idle_ms = claim_idle_ms
        self._block_ms = block_ms
        self._long_block_ms = block_ms if long_block_ms is None else long_block_ms
        self._subs: dict[str, dict[Callback, _Sub]] = {}
        # Per topic, the newest entry this instance published (what flush waits
        # for): every topic with a local subscriber, and the last
        # _PUBLISHED_MAX others, so that a topic per conversation does not leak.
        self._published: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._consumers = 0

    @property
    def forgets_idle_groups(self) -> bool:
        """Whether a topic's groups can be forgotten (``retention_ms`` set): a
        stream every group has drained and no member reads expires with its
        groups, and a group subscribed to after that starts at the end, after
        whatever was published meanwhile."""
        return self._retention_ms > 0

    def _stream_key(self, topic: str) -> bytes:
        return self._p + b"{" + _tag(topic) + b"}:stream"

    def _index_key(self, group: str) -> bytes:
        """The backlog index of the named group ``group``: a set of topics.

        Not in any stream's hash slot (see the class docstring).
        """
        return self._p + b"backlog:g:" + group.encode("utf-8")

    async def publish(self, topic: str, event: Event) -> Event:
        """Store ``event`` on ``topic``; with a caller-given ``id``, at most once
        per ``dedupe_window_ms`` (a retry returns the first event, stores nothing)."""
        event, given = check_publish(topic, event)
        self._check_open()
        assert event.id is not None
        stream = self._stream_key(topic)
        keys = [stream]
        if given:
            # Next to the stream (same hash slot); the id as written, any text.
            keys.append(stream[: -len(b"stream")] + b"id:" + event.id.encode("utf-8"))
        stored, value = await self._eval(
            _PUBLISH,
            keys,
            (
                event.to_json().encode("utf-8"),
                self._stream_maxlen,
                topic.encode("utf-8"),
                # No index on a cluster: it lives in another slot (no BACKLOG there).
                b"" if self._conn.cluster else self._p + b"backlog:",
                self._dedupe_window_ms,
                self._retention_ms,
            ),
        )
        if not stored:
            return Event.from_json(value)
        self._note_published(topic, _parse_id(value))
        return event

    def _note_published(self, topic: str, entry: tuple[int, int]) -> None:
        published = self._published
        if entry > published.get(topic, (0, 0)):
            published[topic] = entry
        published.move_to_end(topic)
        subscribed = self._subs
        # At most len(subscribed) entries are kept for a subscriber: the loop
        # ends once one without is dropped.
        while len(published) > _PUBLISHED_MAX + len(subscribed):
            oldest, mark = published.popitem(last=False)
            if oldest in subscribed:
                published[oldest] = mark
            else:
                break

    async def reclaim(self, topic: str, group: str) -> int:
        """Give every event of ``group`` on ``topic`` that a member (alive or
        dead) was delivered and did not acknowledge back to the group now.

        One script (``lua/reclaim.lua``), one round trip; returns how many came
        back, 0 if the topic or the group does not exist. See the class
        docstring for the order and for what a late ack or raise does.
        """
        check_name(topic, "topic")
        check_name(group, "group")
        self._check_open()
        try:
            moved: int = await self._eval(
                _RECLAIM,
                (self._stream_key(topic),),
                (f"g:{group}", _RETURNED, _RETURNED_IDLE_MS),
            )
        except BackendUnavailable as exc:
            cause = exc.__cause__
            if isinstance(cause, ResponseError) and "NOGROUP" in str(cause):
                return 0
            raise
        return moved

    async def backlog(self, prefix: str, group: str, *, skip: Collection[str] = ()) -> list[str]:
        """The topics starting with ``prefix`` whose ``group`` has events not yet
        acknowledged (unread, or delivered and not acknowledged).

        Reads the group's backlog index (``SMEMBERS``), then checks the topics
        that match, at most 256 per run of ``lua/backlog.lua``, which drops the
        drained ones from the index. Cost: 1 + ceil(m / 256) round trips and
        O(n + m * groups per topic) work in Redis, n being the index's size (the
        group's topics, of any prefix, with events published since a call with a
        matching prefix last found them drained) and m the matching ones: idle
        topics cost nothing once a call has seen them drained. The topics in
        ``skip`` (a runtime's own threads) are neither checked nor listed.
        """
        check_backlog(prefix, group)
        self._check_open()
        index = self._index_key(group)
        members = await self._io(self._client.smembers, index)
        topics = sorted(
            topic
            for topic in (m.decode("utf-8") for m in members)
            if topic.startswith(prefix) and topic not in skip
        )
        out: list[str] = []
        for start in range(0, len(topics), _BACKLOG_BATCH):
            batch = topics[start : start + _BACKLOG_BATCH]
            busy = await self._eval(
                _BACKLOG,
                (index, *(self._stream_key(t) for t in batch)),
                (f"g:{group}", *(t.encode("utf-8") for t in batch)),
            )
            out.extend(b.decode("utf-8") for b in busy)
        return out

    async def subscribe(
        self,
        topic: str,
        callback: Callback,
        *,
        group: str | None = None,
        fence: LeaseFence | None = None,
    ) -> None:
        """Deliver ``topic`` to ``callback``: every event (no ``group``) or a share of the group's.

        A new group, and every fan-out subscription, starts at the end of the
        stream: events published after this returns are delivered. An
        existing group continues where it was. With ``fence``
        (``Capability.FENCED_TAKES``), entries are taken for this subscription
        only while that lease is held (see :class:`~tenure.LeaseFence`): each
        take is a script that checks the lease first, and the subscriber waits
        for new entries with a plain ``XREAD BLOCK``, which takes nothing.
        """
        check_subscribe(topic, callback, group, fence)
        self._check_open()
        if fence is not None and Capability.FENCED_TAKES not in self.capabilities:
            raise ConfigurationError(
                f"{type(self).__name__} cannot fence takes (the lease and the stream "
                "are in different slots): it does not declare Capability.FENCED_TAKES"
            )
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
            fence=fence,
            fence_key=b"" if fence is None else self._lease_key(fence.key)[0],
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

    async def unsubscribe(self, topic: str, callback: Callback) -> None:
        """Stop ``callback``; a fan-out subscription's private group is destroyed.

        In a named group, the events this member was given but had not
        acknowledged (one being handled at that moment, or read but not yet
        handed to the callback) are handed back to the group before this
        returns: each member takes them at its next look (when it subscribes,
        after each read that returned newer entries, and at least every
        ``min(block_ms, claim_idle_ms / 2)``),
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
        await stop_reader(sub)
        await self._retire(sub)

    async def _retire(self, sub: _Sub) -> None:
        """Remove a stopped subscription's trace: its private group, or its member.

        A group member's unacknowledged entries are handed back to the group
        first (see ``unsubscribe``), in the same script that deletes the
        member, so none is dropped with it.
        """
        if sub.fanout:
            await self._eval(_FANOUT_END, (sub.stream,), (sub.group, self._retention_ms))
            return
        try:
            # What its callback finished is acknowledged, not handed back.
            await self.write_acks(sub)
            moved = await self._eval(
                _HAND_BACK,
                (sub.stream,),
                (sub.group, sub.consumer, _RETURNED, _RETURNED_IDLE_MS, self._retention_ms),
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
        local subscriber (published while it had one, or among the last 1,024
        other topics it published to), every event published through this instance before
        the call has been delivered by each local subscription's consumer
        group and is no longer pending at that subscription (its callback
        returned, or the event was dropped after ``max_attempts``). An event
        of a named group taken by a member in another process is not waited
        for, nor are events published by other clients, nor a fenced
        subscription whose last take was fenced off. Polls Redis every
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
                    if sub.fenced:
                        continue  # takes nothing until its lease is held again
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
