"""The sessions of this process: opening one under a thread's lease, and their ends."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import cast

from .._contract import Capability, LeaseProvider, RefusalReason, capabilities_of
from .._errors import BackendClosed, TenureError
from .._pubsub import Callback
from .._renewer import Renewals
from ._context import SessionContext, Settings
from ._identity import Holder, run_of
from ._log import RuntimeLog, forgets_idle_groups
from ._names import ThreadNames
from ._observe import Emit
from ._policies import SendRule
from ._run import Handler
from ._session import Session
from ._types import EventKind

__all__ = ["KNOWN_TOPICS", "Sessions"]

logger = logging.getLogger("tenure.runtime")

#: How many topics (and refusals) a runtime remembers, least recently used first out.
KNOWN_TOPICS = 100_000


class Sessions:
    """This process's open sessions, one per thread at most, and what they left behind.

    Every session is handed the same context: the runtime's ``settings``, its
    backends and its observer, and this registry's callbacks. ``poke()`` asks
    for a sweep now.
    """

    def __init__(
        self,
        settings: Settings,
        names: ThreadNames,
        log: RuntimeLog,
        provider: LeaseProvider,
        handler: Handler,
        rule: SendRule,
        emit: Emit,
        poke: Callable[[], None],
    ) -> None:
        capabilities = capabilities_of(provider)
        self.ctx = SessionContext(
            settings=settings,
            names=names,
            log=log,
            provider=provider,
            handler=handler,
            rule=rule,
            fenced=cast(object, log) is provider
            and Capability.FENCED_TAKES in capabilities_of(log),
            records=Capability.RECORD in capabilities,
            renewals=Renewals(provider, settings.ttl_ms),
            emit=emit,
            unsubscribe=self._unsubscribe,
            ended=self._ended,
        )
        self._poke = poke
        self._by_key: dict[str, Session] = {}
        # Topics whose consumer group is known to exist (LRU); none on a log that
        # forgets a group once its last session left (the next one makes it anew).
        self._known: OrderedDict[str, None] = OrderedDict()
        self._remembers = not forgets_idle_groups(log)
        self._tasks: set[asyncio.Task[None]] = set()
        # When each thread's quarantine refusal was last announced (once a second).
        self._refused: dict[str, float] = {}
        # Threads a send of this process woke after their session's close marker:
        # the sweep's session of each starts awake.
        self._to_wake: set[str] = set()
        self.closed = False

    def _announce_refusal(self, thread_key: str, retry_after_ms: int | None) -> None:
        now = time.monotonic()
        if now - self._refused.get(thread_key, -1.0) < 1.0:
            return
        self._refused[thread_key] = now
        detail = f"quarantine: retry in {retry_after_ms} ms"
        self.ctx.emit("refused", thread_key, detail=detail)

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._by_key))

    def topics(self) -> set[str]:
        """The topics of the threads with a session here."""
        return {session.topic for session in self._by_key.values()}

    def get(self, thread_key: str) -> Session | None:
        return self._by_key.get(thread_key)

    def items(self) -> dict[str, Session]:
        return dict(self._by_key)

    def knows(self, topic: str) -> bool:
        """Whether ``topic``'s consumer group is known to exist (a session of it was open)."""
        return topic in self._known

    def remember(self, topic: str) -> None:
        """Note that ``topic``'s consumer group exists."""
        if not self._remembers:
            return
        known = self._known
        known[topic] = None
        known.move_to_end(topic)
        if len(known) > KNOWN_TOPICS:
            known.popitem(last=False)

    async def try_start(
        self,
        thread_key: str,
        kind: EventKind = "wake",
        previous: str | None = None,
        *,
        wakes: bool = True,
    ) -> tuple[Session | None, str | None]:
        """Acquire the thread's lease and open a session; the session, or the holder's name.

        A ``"wake"`` (a send) gets its session open but not started: the sender
        starts it once its signal is stored (:meth:`start_woken`). A
        ``"takeover"`` (the sweep) gets it started, to announce itself when it
        has something to run; ``previous`` is the owner the thread's lease was
        last seen held by.

        The session is awake (it runs what it reads, persisted signals too) when
        a send that ``wakes`` the thread opens it, or the sweep opens it for a
        thread a send of this process woke after its previous session's close
        marker. Otherwise it wakes only when such a signal arrives, and holds
        the lease "opening" until then (see :class:`~._session.Session`).

        A session whose topic may have no consumer group yet takes the lease
        "opening" (phase 0) and moves it to its first run once subscribed, so
        senders elsewhere wait before publishing. Raises what the backend
        raised, or ``BackendClosed`` when the runtime closed while the session
        opened; then no session exists.
        """
        ctx = self.ctx
        name = ctx.names.name(thread_key)
        awake = wakes if kind == "wake" else thread_key in self._to_wake
        holder = Holder(
            ctx.settings.process_id,
            uuid.uuid4().hex[:12],
            1 if awake and self.knows(name) else 0,
        )
        sent = time.monotonic()
        result = await ctx.provider.acquire_lease(name, holder.owner, ctx.settings.ttl_ms)
        if not result.acquired:
            if result.reason == RefusalReason.QUARANTINE:
                self._announce_refusal(thread_key, result.retry_after_ms)
            return None, result.owner
        self._refused.pop(thread_key, None)
        self._to_wake.discard(thread_key)
        session = Session(ctx, thread_key, holder, result.token, sent, awake)
        self._by_key[thread_key] = session
        await session.open()
        if session.stopping or self.closed:
            # aclose came while it opened: end it without a run and without
            # announcing anything; what it read goes back to the group.
            await session.end_unstarted(kind)
            raise BackendClosed("ThreadRuntime is closed")
        self.remember(name)
        if kind != "wake":
            session.start(kind, run_of(previous))
        return session, session.owner

    async def start_woken(self, session: Session, announce: bool = False) -> None:
        """Start a session a send opened (``announce``: its wake-up was not announced)."""
        if session.stopping or self.closed:
            # aclose came while the signal was stored: what the session read goes
            # back to the group as it ends.
            await session.end_unstarted("wake")
            raise BackendClosed("ThreadRuntime is closed")
        session.start("wake" if announce else None)

    async def _unsubscribe(self, topic: str, callback: Callback) -> None:
        """Unsubscribe, waiting at most ``unsubscribe_timeout`` seconds.

        A session must not keep its thread's lease hostage to a backend whose
        unsubscribe hangs: after the timeout the unsubscribe goes on in the
        background and the session carries on (its callback takes nothing more).
        The signals the backend hands back when it finishes are found by the
        next sweep, which this process starts at once.
        """
        task = self._spawn(self._unsubscribe_now(topic, callback), f"tenure-unsubscribe-{topic!r}")
        timeout = self.ctx.settings.unsubscribe_timeout
        await asyncio.wait([task], timeout=timeout)
        if not task.done():
            logger.warning(
                "unsubscribing from %r takes longer than %.1f s; going on without waiting",
                topic,
                timeout,
            )
            task.add_done_callback(lambda _: self._poke())

    async def _unsubscribe_now(self, topic: str, callback: Callback) -> None:
        try:
            await self.ctx.log.unsubscribe(topic, callback)
        except TenureError as exc:
            logger.warning("unsubscribing from %r failed: %s", topic, exc)

    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _ended(self, thread_key: str, sid: str, look_again: bool, wake: bool) -> None:
        session = self._by_key.get(thread_key)
        if session is not None and session.sid == sid:
            del self._by_key[thread_key]
        if wake and len(self._to_wake) < KNOWN_TOPICS:
            self._to_wake.add(thread_key)
        if not self.closed and look_again:
            self._poke()

    async def close(self) -> None:
        """Stop every session; what is left are unsubscribes that outlived their timeout."""
        self.closed = True
        await asyncio.gather(*(s.stop() for s in list(self._by_key.values())))
        rest = list(self._tasks)
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.wait(rest, timeout=self.ctx.settings.unsubscribe_timeout)
        await self.ctx.renewals.aclose()
