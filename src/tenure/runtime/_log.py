"""The process-local signal log used when the backend cannot carry signals between processes.

A :class:`MemoryPubSub` drops events published while nobody subscribes, and a
backend without leases cannot elect one consumer per thread anyway, so the
runtime then keeps each thread's signals in this log instead. It has the small
part of the pub/sub interface the runtime uses (``publish``, ``subscribe``,
``unsubscribe``) with the semantics of a durable group of one: events are kept
while no one subscribes, delivered one at a time in publish order, and an event
whose delivery raised or was cancelled stays at the head of the queue and is
delivered again (``attempt`` + 1), up to ``max_attempts`` deliveries that
raised, after which it is dropped and logged at ERROR.

One log is shared by every runtime built on the same backend object, so
runtimes in one process route to each other exactly as processes do on a
durable backend. It reaches no further than the process.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from dataclasses import dataclass, field, replace

from .._errors import InvalidArgument
from .._pubsub import Callback, Event, prepare_event

__all__ = ["LocalLog", "local_log_for"]

logger = logging.getLogger("tenure.runtime")


@dataclass(eq=False)
class _Topic:
    queue: deque[Event] = field(default_factory=deque)
    consumer: Callback | None = None
    task: asyncio.Task[None] | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


class LocalLog:
    def __init__(self, *, max_attempts: int = 5) -> None:
        self._max_attempts = max_attempts
        self._topics: dict[str, _Topic] = {}

    async def publish(self, topic: str, event: Event) -> Event:
        event = prepare_event(event)
        state = self._topics.get(topic)
        if state is None:
            state = self._topics[topic] = _Topic()
        state.queue.append(event)
        state.arrived.set()
        return event

    async def subscribe(self, topic: str, callback: Callback, *, group: str | None = None) -> None:
        state = self._topics.get(topic)
        if state is None:
            state = self._topics[topic] = _Topic()
        if state.consumer is not None:
            raise InvalidArgument(f"topic {topic!r} of the local signal log already has a consumer")
        state.consumer = callback
        state.task = asyncio.get_running_loop().create_task(
            self._deliver(topic, state, callback), name=f"tenure-runtime-log-{topic}"
        )

    async def unsubscribe(self, topic: str, callback: Callback) -> None:
        state = self._topics.get(topic)
        if state is None or state.consumer != callback:
            return
        task, state.task, state.consumer = state.task, None, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if not state.queue and self._topics.get(topic) is state:
            del self._topics[topic]

    async def _deliver(self, topic: str, state: _Topic, callback: Callback) -> None:
        queue = state.queue
        while True:
            while not queue:
                state.arrived.clear()
                await state.arrived.wait()
            event = queue[0]
            # Counted as delivered before the call, so a delivery cut short by
            # cancellation (the consumer lost its lease) shows attempt + 1 next time.
            queue[0] = replace(event, attempt=event.attempt + 1)
            try:
                await callback(event)
            except Exception:
                if event.attempt >= self._max_attempts:
                    queue.popleft()
                    logger.error(
                        "signal %s on %r was refused %d times; dropping it",
                        event.id,
                        topic,
                        event.attempt,
                        exc_info=True,
                    )
                # A refusal usually means the consumer is going away (its lease is
                # lost or its run ended): give it time to unsubscribe rather than
                # burning the attempts in a tight loop.
                await asyncio.sleep(0.05)
                continue
            queue.popleft()


_shared: weakref.WeakKeyDictionary[object, LocalLog] = weakref.WeakKeyDictionary()


def local_log_for(backend: object) -> LocalLog:
    """The log shared by every runtime of this process built on ``backend``."""
    try:
        log = _shared.get(backend)
        if log is None:
            log = _shared[backend] = LocalLog()
    except TypeError:  # not weak-referenceable or not hashable: one log per runtime
        return LocalLog()
    return log
