"""Sending: store a signal durably and see that a run of its thread reads it.

A sender never forwards a payload. It publishes to the thread's topic and
tries to acquire the thread's lease: if it wins, it opens the thread's session
here (``"wake"``); otherwise the owner reads the signal from the log
(``"deliver"``). The policy's :class:`~._policies.SendRule` decides whether the
signal is admitted while a run is active and whether the owner must hear of
it at once (on the thread's control topic, since the owner reads signals one
at a time), and whether the send may wake an idle thread: a ``persist`` one
only stores its signal, once the thread's group is known to exist (a session
opened and ended at once makes it), and never starts a run.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from .._errors import BackendUnavailable, TenureError
from .._pubsub import Event
from ._identity import is_opening, run_of
from ._log import INTERRUPT, SIGNAL_TYPE, RuntimeLog
from ._names import ThreadNames
from ._observe import Emit
from ._policies import STORED_AWAKE, SendRule
from ._session import Session
from ._sessions import KNOWN_TOPICS, Sessions
from ._types import SendResult

__all__ = ["Sender"]

logger = logging.getLogger("tenure.runtime")

# How long a sender trusts a refusal of a thread's lease (a live run elsewhere)
# and sends the thread's next signals without trying the lease again.
HELD_ELSEWHERE_FOR = 0.05
# How long a sender waits while a new thread's lease is refused with no holder
# (Redis's quarantine after a start lasts max_ttl_ms, 60 s by default, + 1 s + 1%).
NO_HOLDER_WAIT = 65.0


def _mark_if_awake(event: Event, rule: SendRule, owner: str | None) -> None:
    """Mark a signal that wakes nothing as stored while a run held its thread
    (``owner``, read before it is stored; see :data:`~._policies.STORED_AWAKE`)."""
    if not rule.wakes and owner is not None and not is_opening(owner):
        event.data[STORED_AWAKE] = True


class Sender:
    """The sends of one runtime; each send under the rule its caller chose."""

    def __init__(
        self,
        names: ThreadNames,
        log: RuntimeLog,
        sessions: Sessions,
        thread_lock: Callable[[str], AbstractAsyncContextManager[None]],
        emit: Emit,
    ) -> None:
        self._names = names
        self._log = log
        self._sessions = sessions
        self._thread_lock = thread_lock
        self._emit = emit
        # Threads whose lease was refused moments ago: their owner, and until when
        # (time.monotonic()) a send skips the lease attempt.
        self._held_elsewhere: dict[str, tuple[str, float]] = {}

    async def send(
        self, thread_key: str, payload: Any, signal_id: str | None, rule: SendRule
    ) -> SendResult:
        """``ThreadRuntime.send_signal`` once its arguments are checked, under ``rule``."""
        name = self._names.name(thread_key)
        data = {"thread": thread_key, "payload": payload, **rule.on_wire()}
        event = Event(SIGNAL_TYPE, data, None, signal_id)
        async with self._thread_lock(thread_key):
            session = self._sessions.get(thread_key)
            if session is not None and not session.done:
                return await self._to_session_here(session, name, event, rule)
            held = self._held_elsewhere.get(thread_key)
            if held is not None and time.monotonic() < held[1] and rule.admitted_while_active:
                # A run elsewhere held the thread a moment ago: it reads the signal
                # from the log. Should that run have closed since, the signal is
                # started by the sweep (within sweep_interval), as one sent just
                # after its close marker always is.
                _mark_if_awake(event, rule, held[0])
                outcome: SendResult | tuple[Event, str | None] = (
                    await self._log.publish(name, event),
                    held[0],
                )
            elif not rule.wakes and self._sessions.knows(name):
                # Stored, waking nothing: an awake session reads it, or the next wake's.
                owner = await self._sessions.ctx.provider.get_lease_owner(name)
                _mark_if_awake(event, rule, owner)
                outcome = await self._log.publish(name, event), None
            elif rule.admitted_while_active and self._sessions.knows(name):
                outcome = await self._publish_and_try(thread_key, name, event, rule)
            else:
                outcome = await self._lease_first(thread_key, name, event, rule)
            if isinstance(outcome, SendResult):
                return outcome
            stored, owner = outcome
            if rule.tells_owner:
                # The owner reads signals one at a time: tell it at once, out of band.
                request = {"signal": stored.id, "sent_at": stored.created_at, **rule.on_wire()}
                await self._log.publish(self._names.control(thread_key), Event(INTERRUPT, request))
            return self._delivered(thread_key, run_of(owner), stored, rule)

    def _delivered(
        self, thread_key: str, run_id: str | None, stored: Event, rule: SendRule
    ) -> SendResult:
        if not rule.wakes:
            return SendResult("persisted", None, stored.id or "", thread_key, policy=rule.name)
        self._emit("deliver", thread_key, run_id=run_id, signal_id=stored.id)
        return SendResult("deliver", run_id, stored.id or "", thread_key, policy=rule.name)

    async def _to_session_here(
        self, session: Session, name: str, event: Event, rule: SendRule
    ) -> SendResult:
        """The thread's session is open in this process: store the signal for it."""
        if not rule.admitted_while_active and session.run is not None:
            return self._rejected(session.thread_key, session.run_id, event.id, rule)
        if rule.wakes:
            session.waking()
        elif session.inbox.awake:
            _mark_if_awake(event, rule, session.owner)
        stored = await self._log.publish(name, event)
        session.sent_here(rule, stored.id or "", stored.created_at or time.time())
        return self._delivered(session.thread_key, session.run_id, stored, rule)

    async def _publish_and_try(
        self, thread_key: str, name: str, event: Event, rule: SendRule
    ) -> SendResult | tuple[Event, str | None]:
        """The thread's group exists: store the signal and try the lease at once, so
        a send costs one round trip's wait, not two (a pipelined connection carries
        both together). A session started here reads the signal from the group
        whichever of the two lands first."""
        publishing = asyncio.ensure_future(self._log.publish(name, event))
        tried = time.monotonic()
        try:
            started, owner = await self._sessions.try_start(thread_key, wakes=rule.wakes)
        except TenureError as exc:
            # Stored (unless the publish fails too), but we could not look for its
            # run: the sweep will.
            logger.warning("could not acquire the lease of %r: %s", thread_key, exc)
            started, owner = None, None
        except BaseException:
            publishing.cancel()
            await asyncio.gather(publishing, return_exceptions=True)
            raise
        if started is not None:
            return await self._woke(started, publishing, rule)
        stored = await publishing
        self._held_by(thread_key, owner, tried)
        if rule.wakes and is_opening(owner):
            return await self._after_opening(thread_key, stored, rule)
        return stored, owner

    async def _after_opening(
        self, thread_key: str, stored: Event, rule: SendRule
    ) -> SendResult | tuple[Event, str | None]:
        """``stored`` waits behind a session elsewhere that is opening, or not
        awake: one that reads a persisted signal first ends without reading this
        one. Try the lease until a run holds it (it reads ``stored``) or it is ours."""
        pause = 0.002
        give_up = time.monotonic() + NO_HOLDER_WAIT

        async def done() -> Event:
            return stored

        while True:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)
            started, owner = await self._sessions.try_start(thread_key)
            if started is not None:
                return await self._woke(started, done(), rule)
            if owner is not None and not is_opening(owner):
                return stored, owner
            if time.monotonic() >= give_up:
                # Stored: the sweep starts it once the lease is free again.
                return stored, owner

    async def _lease_first(
        self, thread_key: str, name: str, event: Event, rule: SendRule
    ) -> SendResult | tuple[Event, str | None]:
        """The group may not exist yet (a signal published before it would be
        skipped), or the rule must see the run before storing: take the lease
        first, or publish once its owner is open."""
        pause = 0.002
        give_up = time.monotonic() + NO_HOLDER_WAIT
        while True:
            started, owner = await self._sessions.try_start(thread_key, wakes=rule.wakes)
            if started is not None and not rule.wakes:
                # Opened only so that the thread's group exists: it ends before the
                # signal is stored, so no reader of this process ever takes it.
                await started.end_unstarted("wake")
                return await self._log.publish(name, event), None
            if started is not None:
                return await self._woke(started, self._log.publish(name, event), rule)
            if not rule.admitted_while_active and owner is not None:
                return self._rejected(thread_key, run_of(owner), event.id, rule)
            if owner is None and time.monotonic() >= give_up:
                raise BackendUnavailable(
                    f"the lease of thread {thread_key!r} was refused without a holder "
                    f"for {NO_HOLDER_WAIT:g} s (a Redis restart quarantine?); "
                    "the signal was not stored"
                )
            if owner is None or is_opening(owner):
                # Opening elsewhere, or refused with no holder (a Redis backend in
                # quarantine after a start): the thread's group may not exist yet,
                # and a signal published now could be skipped. Wait.
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.05)
                continue
            _mark_if_awake(event, rule, owner)
            stored = await self._log.publish(name, event)
            self._sessions.remember(name)
            return stored, owner

    async def _woke(
        self, session: Session, publishing: Awaitable[Event], rule: SendRule
    ) -> SendResult:
        """Finish a send that opened the thread's session here: wait for the
        signal to be stored, then announce the wake-up and start the session.

        The session starts even if the publish failed or was cancelled, so
        that it ends (and releases the lease) like any idle one; it then shows
        up only if something else gives it a run. If the runtime closed
        meanwhile, the session ends without a run.
        """
        try:
            stored = await publishing
        except BaseException:
            await self._sessions.start_woken(session, announce=True)
            raise
        self._emit(
            "wake",
            session.thread_key,
            run_id=session.run_id,
            token=session.token,
            signal_id=stored.id,
        )
        await self._sessions.start_woken(session)
        return SendResult(
            "wake", session.run_id, stored.id or "", session.thread_key, policy=rule.name
        )

    def _rejected(
        self, thread_key: str, run_id: str | None, signal_id: str | None, rule: SendRule
    ) -> SendResult:
        # A signal without an id of the caller's gets the one it would have had.
        signal_id = signal_id or uuid.uuid4().hex
        self._emit("rejected", thread_key, run_id=run_id, signal_id=signal_id)
        return SendResult("rejected", run_id, signal_id, thread_key, policy=rule.name)

    def _held_by(self, thread_key: str, owner: str | None, tried: float) -> None:
        """The lease of ``thread_key``, tried at ``tried``, was refused to us: held by ``owner``."""
        held = self._held_elsewhere
        if owner is None or is_opening(owner):
            held.pop(thread_key, None)  # no holder, or one still opening: try again next time
            return
        if len(held) >= KNOWN_TOPICS:
            held.clear()
        held[thread_key] = (owner, tried + HELD_ELSEWHERE_FOR)
