"""How a member of a Redis consumer group reads: the reader task of one
subscription, taking over what others left (in id order, before new entries),
handing entries to the callback, retrying and acknowledging them.

Acknowledging and retrying are one script (``lua/settle.lua``) that acts only
on the entries this consumer still holds: once a reclaim (or a hand-back, or
another member after ``claim_idle_ms``) has taken one away, the old delivery
settles nothing. Acknowledgements are written in batches: the entries whose
callback returned are acknowledged together before the reader's next read
(and before a leaving member hands the rest back), so a burst costs one round
trip per read rather than one per entry; and, by a writer beside the reader,
once the oldest of them has waited ``_ACK_AFTER``, so that a slow callback
(an agent's step, seconds long) does not hold back the acknowledgements of the
entries finished before it. A process that dies in between gets them
delivered again, as at-least-once delivery allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from ..._errors import BackendUnavailable
from ..._pubsub import Callback, Event, LeaseFence, call_back
from ._connection import RedisParts
from ._scripts import load_script

__all__ = ["LONG_BLOCK_MS", "StreamReader", "stop_reader"]

logger = logging.getLogger("tenure.redis")

_SETTLE = load_script("settle")
_FENCED = load_script("fenced")
_JOIN = load_script("join")
_FENCED_RETRY = 0.1  # seconds before a read that the fence held off looks again
# How long the wait for new entries of a subscriber that need not look for what
# other members left lasts at most (ms): a fan-out subscriber (its group is its
# own), and a fenced one (the sole reader of its group, elected by the lease; it
# takes what its predecessor left as it subscribes). Nothing but a new entry
# needs it sooner: an idle live thread of the runtime (its reader and its
# control topic's) costs a wait each per LONG_BLOCK_MS, not per block_ms.
LONG_BLOCK_MS = 10_000
_NOSCRIPT: Any = object()  # a pipelined take found lua/fenced.lua not loaded
# Acknowledgements written by one run of the script at most.
_ACK_BATCH = 256
# How long an acknowledgement waits for the reader's next batch before a writer
# beside the reader writes it (seconds): a dead member's successor runs again
# only what was finished in the last _ACK_AFTER, not a whole read's worth.
_ACK_AFTER = 0.05
# Every entry a take hands a consumer counts one delivery, and a consumer that
# dies leaves the ones it never reached counted all the same: behind one event
# that kills its reader (or readers killed in a row), innocent entries would
# reach max_attempts and be dropped. Entries are therefore claimed back (from a
# dead member, or one's own after a failure) one at a time, each just before its
# callback gets it: a death costs a delivery only to the entry being handled and,
# once, to the new entries of the read under way.
_CLAIM_BATCH = 1
# The consumer that holds handed-back and reclaimed entries until a member takes
# them. Real members are named "<instance hex>-<n>", so it cannot collide with one.
_RETURNED = b"tenure.returned"
# Idle time given to handed-back entries: far above any sensible claim_idle_ms,
# yet below the server's clock in ms (Redis ignores an IDLE that would place the
# delivery before the epoch).
_RETURNED_IDLE_MS = 10 * 365 * 24 * 3600 * 1000


def _fields(raw: Any) -> Any:
    """An entry's fields as a dict (a script's reply has them as a flat list)."""
    return dict(zip(raw[::2], raw[1::2], strict=True)) if isinstance(raw, list) else raw


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
    # Take entries only while this lease is held (see lua/fenced.lua); its key.
    fence: LeaseFence | None = None
    fence_key: bytes = b""
    # The last take was fenced off (flush does not wait for such a subscriber).
    fenced: bool = False
    # The stream's newest entry when the last take left nothing to take: the
    # next one waits for an entry after it before taking.
    newest: bytes | None = None
    task: asyncio.Task[None] | None = None
    # Set by unsubscribe: from then on the reader hands nothing to the callback.
    stopped: bool = False
    # Entries whose callback returned, not yet acknowledged (see write_acks), and
    # what writes them once they waited _ACK_AFTER (see _ack_later).
    acks: list[bytes] = field(default_factory=list)
    ack_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ack_timer: asyncio.TimerHandle | None = None
    ack_writer: asyncio.Task[None] | None = None


async def stop_reader(sub: _Sub) -> None:
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
    if sub.ack_timer is not None:
        sub.ack_timer.cancel()
        sub.ack_timer = None
    if sub.ack_writer is not None:
        await asyncio.gather(sub.ack_writer, return_exceptions=True)


class StreamReader(RedisParts):
    """The reading half of :class:`~tenure.backends.redis._streams.RedisStreams`."""

    _max_attempts: int
    _claim_idle_ms: int
    _block_ms: int
    _long_block_ms: int

    _retention_ms: int

    async def _create_group(self, sub: _Sub) -> None:
        if self._retention_ms:
            # With the PERSIST in the same step: a stream someone reads never expires.
            await self._eval(_JOIN, (sub.stream,), (sub.group,))
            return
        try:
            await self._io(self._client.xgroup_create, sub.stream, sub.group, "$", mkstream=True)
        except BackendUnavailable as exc:
            cause = exc.__cause__
            if not (isinstance(cause, ResponseError) and "BUSYGROUP" in str(cause)):
                raise

    async def _read_loop(self, sub: _Sub) -> None:
        loop = asyncio.get_running_loop()
        backoff = 0.05
        next_claim = loop.time()
        # Entries handed back by a leaving member are claimable at once: look for
        # them at least once per blocking read, not only every claim_idle_ms / 2
        # (and after every read that returned entries, see below).
        claim_every = min(self._claim_idle_ms / 2000, self._wait_ms(sub) / 1000)
        # After a failure, first re-read this consumer's own pending entries: a
        # lost XREADGROUP reply or XACK leaves them there, and ">" never
        # returns them again.
        history = False
        while not sub.stopped:
            try:
                # First, so that a retry after a failure does not deliver again
                # what was handled and not yet acknowledged.
                await self.write_acks(sub)
                if history or (not sub.fanout and loop.time() >= next_claim):
                    if not sub.fanout:
                        next_claim = loop.time() + claim_every
                    # After a failure, this consumer's own entries are taken in
                    # the same walk as those others left, in id order: a read
                    # whose reply was lost holds entries newer than ones handed
                    # back before it, and those go first.
                    await self._take(sub, own=history)
                    history = False
                entries = await (
                    self._read_new(sub) if sub.fence is None else self._read_fenced(sub)
                )
                backoff = 0.05
                if entries and not sub.fanout:
                    # Entries given back while this read was blocked are older
                    # than the new ones: they go first.
                    await self._take(sub, _RETURNED)
                for entry_id, fields in entries:
                    await self._handle(sub, entry_id, fields, 1)
            except BackendUnavailable as exc:
                history = True
                backoff = await self._read_failed(sub, exc, backoff)

    async def _read_failed(self, sub: _Sub, exc: BackendUnavailable, backoff: float) -> float:
        """Recover from a failed read; the backoff for the next failure."""
        cause = exc.__cause__
        if isinstance(cause, ResponseError) and "NOGROUP" in str(cause):
            # The stream or group vanished (deleted, or a restart without
            # persistence): start again at the end of the stream.
            logger.warning("consumer group of topic %r disappeared; recreating it", sub.topic)
            with contextlib.suppress(BackendUnavailable):
                await self._create_group(sub)
            return backoff
        logger.warning(
            "reading topic %r from Redis at %s failed (%s); retrying in %.2f s",
            sub.topic,
            self._where,
            exc,
            backoff,
        )
        await asyncio.sleep(backoff)
        return min(backoff * 2, 2.0)

    def _wait_ms(self, sub: _Sub) -> int:
        """How long ``sub``'s reads wait for a new entry: ``block_ms`` for a member of
        a shared group, which must look for what others left that often, else
        :data:`LONG_BLOCK_MS` (both within half the client's socket timeout)."""
        shared = sub.fence is None and not sub.fanout
        return self._block_ms if shared else self._long_block_ms

    async def _read_new(self, sub: _Sub) -> list[tuple[bytes, Any]]:
        """Up to 64 new entries, waiting up to :meth:`_wait_ms` for one."""
        reply = await self._io(
            self._client.xreadgroup,
            sub.group,
            sub.consumer,
            {sub.stream: ">"},
            count=64,
            block=self._wait_ms(sub),
            blocking=True,
        )
        return _entries(reply)

    async def _read_fenced(self, sub: _Sub) -> list[tuple[bytes, Any]]:
        """:meth:`_read_new` under the subscription's fence: new entries are taken in a
        script that checks the lease first, never by a blocking read that could
        take them after the lease is gone; the wait is a plain ``XREAD BLOCK``
        (which takes nothing) with the take pipelined after it."""
        take = (
            b"XREADGROUP", b"GROUP", sub.group, sub.consumer, b"COUNT", 64,
            b"STREAMS", sub.stream, b">",
        )  # fmt: skip
        if sub.newest is None:
            done = await self._fenced(sub, *take)
        else:
            # Every entry up to it was delivered when the last take looked.
            done = await self._io(self._wait_then_take, sub, take, blocking=True)
            if done is _NOSCRIPT:
                done = await self._fenced(sub, *take)
        if done is None:
            # Fenced off: this subscriber's lease is not held. Its holder
            # unsubscribes soon; look again meanwhile, slowly.
            sub.newest = None
            await asyncio.sleep(_FENCED_RETRY)
            return []
        reply, newest = done
        entries = [(entry_id, _fields(raw)) for entry_id, raw in _entries(reply)]
        # Fewer than asked for: nothing newer was left to take.
        sub.newest = newest if len(entries) < 64 else None
        return entries

    async def _wait_then_take(self, sub: _Sub, take: tuple[Any, ...]) -> Any:
        """``XREAD BLOCK`` after ``sub.newest``, then the fenced take, pipelined:
        Redis runs the take as soon as the wait ends (an entry, or :meth:`_wait_ms`),
        without a round trip in between. The take's outcome as :meth:`_fenced`
        gives it, or ``_NOSCRIPT`` when the script is not loaded yet."""
        assert sub.fence is not None and sub.newest is not None
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.xread({sub.stream: sub.newest}, count=1, block=self._wait_ms(sub))
            pipe.evalsha(
                _FENCED.sha, 2, sub.fence_key, sub.stream, sub.fence.owner_prefix.encode(), *take
            )
            woke, reply = await pipe.execute(raise_on_error=False)
        for outcome in (woke, reply):
            if isinstance(outcome, BaseException) and not isinstance(outcome, NoScriptError):
                raise outcome
        if isinstance(reply, NoScriptError):
            return _NOSCRIPT
        return self._fenced_reply(sub, reply)

    def _fenced_reply(self, sub: _Sub, reply: Any) -> tuple[Any, bytes] | None:
        sub.fenced = not reply[0]
        return (reply[1], reply[2]) if reply[0] else None

    async def _fenced(self, sub: _Sub, *command: Any) -> tuple[Any, bytes] | None:
        """``command`` on the stream, run only while the fence holds (``lua/fenced.lua``):
        its reply and the stream's newest id, or ``None`` when fenced off."""
        assert sub.fence is not None
        reply = await self._eval(
            _FENCED, (sub.fence_key, sub.stream), (sub.fence.owner_prefix.encode(), *command)
        )
        return self._fenced_reply(sub, reply)

    async def _claim(
        self, sub: _Sub, min_idle_ms: int, ids: list[bytes]
    ) -> list[tuple[bytes, Any]] | None:
        """``XCLAIM`` the entries ``ids`` for this consumer (under the fence, if
        any): the entries claimed, or ``None`` when fenced off."""
        if sub.fence is None:
            claimed = await self._io(
                self._client.xclaim, sub.stream, sub.group, sub.consumer, min_idle_ms, ids
            )
            return list(claimed or ())
        done = await self._fenced(
            sub, b"XCLAIM", sub.stream, sub.group, sub.consumer, min_idle_ms, *ids
        )
        if done is None:
            return None
        return [(entry[0], _fields(entry[1])) for entry in done[0] or () if entry]

    async def _claim_and_handle(
        self, sub: _Sub, min_idle_ms: int, counts: dict[bytes, int]
    ) -> bool:
        """Claim the entries of ``counts`` (id: deliveries so far), handle each one as
        its next attempt and write the acknowledgements; ``False`` when fenced off."""
        claimed = await self._claim(sub, min_idle_ms, list(counts))
        if claimed is None:
            return False
        for entry_id, fields in claimed:
            await self._handle(sub, entry_id, fields, counts.get(entry_id, 1) + 1)
        await self.write_acks(sub)
        return True

    async def _take(self, sub: _Sub, holder: bytes | None = None, *, own: bool = False) -> None:
        """Take over, in id order, the entries other consumers of the group (or
        only ``holder``) left unacknowledged for ``claim_idle_ms``; handed-back and
        reclaimed entries qualify at once. With ``own`` (after a failure), this
        consumer's own unacknowledged entries too, in the same order: a lost
        ``XREADGROUP`` reply or ``XACK`` leaves them pending, and ``">"`` never
        returns them again. Handles every one before returning."""
        client = self._client
        me = sub.consumer.encode("utf-8")
        start: bytes | str = "-"
        while not sub.stopped:
            pending = await self._io(
                client.xpending_range,
                sub.stream,
                sub.group,
                start,
                "+",
                _CLAIM_BATCH,
                consumername=holder,
                idle=None if own else self._claim_idle_ms,
            )
            # (id, deliveries so far, min idle of its claim): one's own entries
            # are claimed back whatever their idle time; another member's only
            # once idle, so a race with that member's own claim is harmless (the
            # first claim resets the idle time, so the second takes nothing).
            due = []
            for p in pending:
                mine = p["consumer"] == me
                if own if mine else int(p["time_since_delivered"]) >= self._claim_idle_ms:
                    min_idle_ms = 0 if mine else self._claim_idle_ms
                    due.append((p["message_id"], int(p["times_delivered"]), min_idle_ms))
            for min_idle_ms, run in itertools.groupby(due, key=lambda d: d[2]):
                counts = {entry_id: count for entry_id, count, _ in run}
                if not await self._claim_and_handle(sub, min_idle_ms, counts):
                    return  # fenced off
            if len(pending) < _CLAIM_BATCH:
                return
            start = b"(" + pending[-1]["message_id"]

    def _event(self, sub: _Sub, entry_id: bytes, fields: Any, attempt: int) -> Event | None:
        """The entry's event, or ``None`` (logged) if it is not one or is spent."""
        raw = fields.get(b"e") if isinstance(fields, dict) else None
        if raw is None:
            return None  # trimmed from the stream while pending
        try:
            event = Event.from_json(raw, attempt=attempt)
        except (ValueError, KeyError, TypeError):
            logger.error(
                "topic %r: entry %r is not a tenure event; dropping it", sub.topic, entry_id
            )
            return None
        if event.attempt > self._max_attempts:
            logger.error(
                "topic %r: event %s was delivered %d times without success; dropping it",
                sub.topic,
                event.id,
                event.attempt - 1,
            )
            return None
        return event

    async def _handle(self, sub: _Sub, entry_id: bytes, fields: Any, attempt: int) -> None:
        if sub.stopped:
            return  # left pending: unsubscribe hands it back to the group
        event = self._event(sub, entry_id, fields, attempt)
        while event is not None:
            # A CancelledError out of here (the reader is stopped) skips the
            # acknowledgement: the event stays pending, and in a named group
            # another member claims it.
            failure = await call_back(sub.callback, event)
            if failure is None:
                break
            if event.attempt >= self._max_attempts:
                logger.error(
                    "callback for topic %r raised on event %s %d times; dropping it",
                    sub.topic,
                    event.id,
                    event.attempt,
                    exc_info=failure,
                )
                break
            logger.warning(
                "callback for topic %r raised on event %s (attempt %d of %d); redelivering",
                sub.topic,
                event.id,
                event.attempt,
                self._max_attempts,
                exc_info=failure,
            )
            event = replace(event, attempt=event.attempt + 1)
            if not await self._record_attempt(sub, entry_id, event):
                return
        # An event taken away meanwhile (by a reclaim) is not acknowledged when
        # the batch is: it is its new holder's.
        sub.acks.append(entry_id)
        if len(sub.acks) >= _ACK_BATCH:
            await self.write_acks(sub)
        elif sub.ack_timer is None:
            loop = asyncio.get_running_loop()
            sub.ack_timer = loop.call_later(_ACK_AFTER, self._ack_later, sub)

    def _ack_later(self, sub: _Sub) -> None:
        """Write what waited ``_ACK_AFTER``, beside the reader (busy in a callback)."""
        sub.ack_timer = None
        if sub.acks and not sub.stopped and (sub.ack_writer is None or sub.ack_writer.done()):
            sub.ack_writer = asyncio.get_running_loop().create_task(self._write_acks_quietly(sub))

    async def _write_acks_quietly(self, sub: _Sub) -> None:
        # A failure leaves them queued: the reader writes them before its next read.
        with contextlib.suppress(BackendUnavailable):
            await self.write_acks(sub)

    async def _record_attempt(self, sub: _Sub, entry_id: bytes, event: Event) -> bool:
        """Record the attempt about to be made in the group (and reset the idle
        time), so a crash now resumes with the right count and nobody steals it.
        ``False`` if the entry was taken away meanwhile: its holder delivers it."""
        mine = 1
        with contextlib.suppress(BackendUnavailable):
            mine = await self._eval(
                _SETTLE, (sub.stream,), (sub.group, sub.consumer, event.attempt, entry_id)
            )
        if not mine:
            logger.info(
                "topic %r: event %s was given back to the group; not retrying it here",
                sub.topic,
                event.id,
            )
        return bool(mine)

    async def write_acks(self, sub: _Sub) -> None:
        """Acknowledge the entries whose callback returned, those this consumer
        still holds, in one script; they stay queued if Redis cannot be reached."""
        async with sub.ack_lock:  # the reader and the writer beside it
            acks = sub.acks
            while acks:
                batch = acks[:_ACK_BATCH]
                await self._eval(_SETTLE, (sub.stream,), (sub.group, sub.consumer, "ack", *batch))
                del acks[: len(batch)]
