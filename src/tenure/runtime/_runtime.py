"""The thread runtime: one run per conversation thread across processes (CONTRACT section 8).

Guarantees
----------
With the default settings, on a backend that carries signals between processes
(SQLite, Redis Streams, PostgreSQL) or inside one process (memory).

- **One run per thread.** A run holds the thread's lease, renewed by the same
  :class:`~tenure._renewer.Renewer` as :func:`tenure.hold`. It learns of a loss
  at its renew deadline (two thirds of the TTL) at the latest, whether a renew
  call fails, hangs or the process was paused: ``run.ensure_held()`` then
  raises and, by default, the handler is cancelled. Another process can be
  granted the lease only after the TTL, later than that deadline. Hand the
  run's ``token`` to the stores you write to, so a run that was paused past its
  TTL (and so could not learn in time) is fenced off.
- **No signal stranded.** Every signal whose ``send_signal`` returned is run,
  even if its owner and its sender are killed and nobody sends to the thread
  again: within TTL + ``sweep_interval`` (+ one backend round trip) after the
  owner's last renewal, as long as one runtime process of the namespace is alive.
- **Order.** Per thread, signals are handled in send order; a signal that a dead
  or lost owner had not finished comes back before any newer signal.
- **At least once.** A signal can be run again after a crash or a lost lease
  (``attempt`` > 1); ``Signal.id`` is stable, and ``send_signal(...,
  signal_id=...)`` makes a retried send store nothing new.
- **Injective names.** ``(namespace, thread_key)`` pairs never share a lease key
  or topic (see :mod:`tenure.runtime._names`).
- **Double-texting policy.** ``enqueue`` (default): a new signal waits for the
  active run. ``interrupt``: the active run is cancelled (``run.interrupted``)
  and the next run starts with the new signal; signals waiting before it are
  skipped. ``reject``: ``send_signal`` answers ``"rejected"`` and stores nothing
  while a run of the thread is active anywhere.

Design
------
*Every signal is durable before* :meth:`ThreadRuntime.send_signal` *returns*: it
is published to the thread's own topic and read only through the consumer group
``tenure.runtime`` of that topic, by the process that holds the thread's lease
(lease key and topic are the thread's name). One consumer at a time reads the
log in order, so per-thread order is the log's order.

*A sender never forwards a payload.* It publishes and tries to acquire the
lease: if it wins it opens a *session* (lease + subscription) and answers
``"wake"``; otherwise ``"deliver"``: the owner reads the signal from the log.
A refusal is trusted for 50 ms: the thread's next signals from this sender are
published without a lease attempt (a burst costs one publish per signal). If
the owner's run closed meanwhile, the sweep starts them.

*The first signal of a thread.* A consumer group is created at the log's end, so
a signal published before the group exists would be skipped. A session of a
thread whose group this process has not seen takes the lease as
``"<process>/<session>.0"`` (*opening*), subscribes, and only then moves the
lease to ``".1"``. A sender that has not seen the group acquires first and
publishes once its own session is open, or waits while another owner is
opening. Once the group is known, senders publish and acquire together.

*Taking over.* A session that acquires a thread's lease first *reclaims* the
group's unacknowledged signals (``Capability.RECLAIM``): whatever a previous
owner read and never finished goes back to the group at once and is delivered
before newer signals. Holding the lease is what makes this safe: the previous
owner either released it (and handed everything back) or lost it.

*Fenced reads.* Where the log keeps the leases too and declares
``Capability.FENCED_TAKES`` (SQLite, PostgreSQL), a session subscribes with a
:class:`~tenure.LeaseFence` on its own owner prefix: the backend takes signals
for it only while it holds the thread's lease, checked in the statement that
takes them. A session that lost its lease while its reads went on (paused,
cut off, slow to learn of the loss) then cannot take what the next owner
reclaimed, however late its request reaches the server.

*Sweeping.* Every runtime process asks the backend every ``sweep_interval``
(default: the renew interval, at most 1 s) which threads of its namespace have
signals not yet acknowledged (``Capability.BACKLOG``), and tries to acquire
each one it does not own: a thread whose owner died is taken over as soon as
its lease expires; one whose sender died before anyone read its signal is
started. This replaces any per-sender bookkeeping that would die with the sender.

*Runs and hand-over.* A session starts a run when a signal arrives. A signal is
acknowledged once handled (the handler asks for the next one, or returns).
When a run returns with signals waiting, the lease moves to the next run with
``transfer_lease``: the key is never free and the token increases.

*Interrupts.* Under the ``interrupt`` policy a sender that does not own the
thread also publishes an interrupt request on the thread's *control* topic
(``<namespace>#i:<thread key>``, fan-out), to which the owner's session
subscribes: the owner reads signals one at a time, so it would otherwise see
the new signal only after the run it should interrupt. Signals sent before the
interrupting one that have not run yet are acknowledged unhandled (as judged by
their senders' clocks when they arrive after the request).

*Closing.* An idle session publishes a *close marker* and reads up to it, so
every signal sent before it starts a run here. Then it unsubscribes (the backend
hands back what it had not acknowledged) while still renewing, and releases. A
signal sent after the marker stays in the log, and the sweep finds it.

*Backends.* The runtime needs ``EVENTS``; across processes also
``DURABLE_GROUPS``, ``RECLAIM`` and ``BACKLOG`` (SQLite, Redis and PostgreSQL declare them);
a backend that declares durable groups without the other two is refused with
:class:`~tenure.ConfigurationError`, since it could strand a signal. A backend
whose events do not outlive a process, or one without leases
(:class:`~tenure.NoopLeaseProvider`, announced with a WARNING), gets a
process-local log (a :class:`~tenure.MemoryPubSub`) and the runtime is correct
within one process only.

Limits: on Redis, per-thread order can break for a signal sent while a paused
owner's blocking read was outstanding: the backend hands it to that stale
reader, which gives it back only once it finds its lease lost, after newer
signals ran (seen once by the thread harness, under SIGSTOP; crashes do not
cause it; the fenced reads of SQLite and PostgreSQL close it); a backend
that loses acknowledged state (a Redis restart without
persistence) can lose signals published before the restart; a handler that
raises on a signal gets it again at most the backend's ``max_attempts`` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Self, cast, get_args

from .. import telemetry
from .._contract import Backend, Capability, LeaseProvider, capabilities_of
from .._detect import NoopLeaseProvider, is_lease_provider, lease_provider_for
from .._errors import (
    BackendClosed,
    BackendUnavailable,
    ConfigurationError,
    InvalidArgument,
    TenureError,
)
from .._lifecycle import AsyncCloseable
from .._pubsub import Event, check_data
from .._renewer import renew_timing
from .._validate import check_name, check_timeout, check_ttl
from ._locks import KeyLocks
from ._names import ThreadNames
from ._session import CLOSE_MARKER, GROUP, INTERRUPT, SIGNAL_TYPE, Session, ThreadRun, run_of
from ._status import ThreadStatus, thread_statuses, with_sessions
from ._types import EventKind, OnEvent, Policy, RuntimeEvent, SendResult

__all__ = ["CLOSE_MARKER", "GROUP", "SIGNAL_TYPE", "ThreadRun", "ThreadRuntime"]

logger = logging.getLogger("tenure.runtime")

_KNOWN_TOPICS = 100_000
# How long a sender trusts a refusal of a thread's lease (a live run elsewhere)
# and sends the thread's next signals without trying the lease again.
_HELD_ELSEWHERE_FOR = 0.05
# How long a sender waits while a new thread's lease is refused with no holder
# (Redis's quarantine after a start lasts max_ttl_ms, 60 s by default, + 1 s + 1%).
_NO_HOLDER_WAIT = 65.0
_NEEDED = Capability.EVENTS | Capability.RECLAIM | Capability.BACKLOG | Capability.DEDUPE

Handler = Callable[[ThreadRun], Awaitable[None]]

# One process-local log per backend object whose events cannot hold signals, so
# runtimes of one process built on it route to each other.
_local_logs: weakref.WeakKeyDictionary[object, Any] = weakref.WeakKeyDictionary()


def _local_log(backend: object) -> Any:
    from ..backends.memory import MemoryPubSub

    try:
        log = _local_logs.get(backend)
        if log is None:
            log = _local_logs[backend] = MemoryPubSub()
    except TypeError:  # not weak-referenceable: one log per runtime
        return MemoryPubSub()
    return log


class ThreadRuntime(AsyncCloseable):
    """Runs ``handler`` for each thread in exactly one process at a time.

    ``backend`` is what :func:`tenure.from_url` returns (it must declare
    ``Capability.EVENTS``); its lease provider is found with
    :func:`tenure.lease_provider_for` unless ``lease_provider`` is given.
    ``handler(run)`` is called for each run; it reads ``run.signals()``.

    Settings: ``ttl_ms`` (lease TTL, default 15 s), ``renew_every_ms`` (default a
    third of the TTL), ``renew_deadline_ms`` (when a run counts its lease lost
    without a successful renewal; default two thirds of the TTL),
    ``idle_timeout`` (seconds without a signal after which a run's iteration
    ends, default 1 s), ``sweep_interval`` (seconds between looks for threads
    with unfinished signals, default the renew interval capped at 1 s),
    ``marker_timeout`` (seconds a closing session waits to publish its close
    marker, and again to read it back; default 10 s),
    ``unsubscribe_timeout`` (seconds a closing session waits for the backend's
    ``unsubscribe``, default 5 s), ``cancel_on_loss`` (cancel the handler when
    the lease is lost, default true), ``policy`` (``"enqueue"``,
    ``"interrupt"`` or ``"reject"``: what a new signal does to an active run),
    ``namespace`` (keeps applications apart; default ``"tenure.thread"``).

    ``on_event`` is called synchronously with a :class:`RuntimeEvent` at each
    step; an exception it raises is logged and ignored.

    See the module docstring for the guarantees and how they are obtained.
    """

    def __init__(
        self,
        backend: Any,
        handler: Handler,
        *,
        lease_provider: Any = None,
        ttl_ms: int = 15_000,
        renew_every_ms: float | None = None,
        renew_deadline_ms: float | None = None,
        idle_timeout: float = 1.0,
        process_id: str | None = None,
        on_event: OnEvent | None = None,
        sweep_interval: float | None = None,
        marker_timeout: float = 10.0,
        unsubscribe_timeout: float = 5.0,
        cancel_on_loss: bool = True,
        policy: Policy = "enqueue",
        namespace: str = "tenure.thread",
    ) -> None:
        if not callable(handler):
            raise InvalidArgument(f"handler must be callable, got {type(handler).__name__}")
        self.ttl_ms = check_ttl(ttl_ms)
        every, deadline = renew_timing(self.ttl_ms, renew_every_ms, renew_deadline_ms)
        self.renew_every_ms, self.renew_deadline_ms = every * 1000, deadline * 1000
        self.idle_timeout = check_timeout(idle_timeout, "idle_timeout")
        if self.idle_timeout <= 0:
            raise InvalidArgument("idle_timeout must be greater than 0")
        if sweep_interval is None:
            sweep_interval = min(self.renew_every_ms / 1000, 1.0)
        self.sweep_interval = check_timeout(sweep_interval, "sweep_interval")
        if self.sweep_interval <= 0:
            raise InvalidArgument("sweep_interval must be greater than 0")
        self.marker_timeout = check_timeout(marker_timeout, "marker_timeout")
        self.unsubscribe_timeout = check_timeout(unsubscribe_timeout, "unsubscribe_timeout")
        self.process_id = check_name(
            process_id if process_id is not None else uuid.uuid4().hex[:12], "process_id"
        )
        if on_event is not None and not callable(on_event):
            raise InvalidArgument(f"on_event must be callable, got {type(on_event).__name__}")
        if policy not in get_args(Policy):
            raise InvalidArgument(
                f"policy must be one of {', '.join(get_args(Policy))}, got {policy!r}"
            )
        self.policy: Policy = policy
        self.names = ThreadNames(namespace)
        self.namespace = self.names.namespace
        capabilities = capabilities_of(backend)
        if Capability.EVENTS not in capabilities:
            raise ConfigurationError(
                f"{type(backend).__name__} cannot carry signals: the runtime needs a backend "
                "that declares Capability.EVENTS (a PubSub)"
            )
        if lease_provider is None:
            provider = lease_provider_for(backend)
        elif is_lease_provider(lease_provider):
            provider = lease_provider
        else:
            raise InvalidArgument(
                f"lease_provider must have the five lease methods, got {type(lease_provider).__name__}"
            )
        self.handler = handler
        self.provider: LeaseProvider = provider
        self.cancel_on_loss = bool(cancel_on_loss)
        self._on_event = on_event
        self.backend = backend
        self.single_process = isinstance(provider, NoopLeaseProvider)
        self._owns_log = False
        self.log: Any
        if self.single_process:
            logger.warning(
                "%s provides no leases: the thread runtime runs single-process "
                "(threads are coordinated within this process only)",
                type(backend).__name__,
            )
            self.log = _local_log(self)
            self._owns_log = True
        elif Capability.DURABLE_GROUPS in capabilities:
            missing = _NEEDED & ~capabilities
            if missing:
                names = ", ".join(f"Capability.{c.name}" for c in Capability if c in missing)
                raise ConfigurationError(
                    f"{type(backend).__name__} has durable groups but does not declare {names}: "
                    "the runtime could strand a signal of a dead owner or sender on it"
                )
            self.log = backend
        elif _NEEDED in capabilities:
            self.log = backend  # events within one process (memory://)
        else:
            self.log = _local_log(backend)
        self._sessions: dict[str, Session] = {}
        # Topics whose consumer group is known to exist (LRU).
        self._known: OrderedDict[str, None] = OrderedDict()
        # Threads whose lease was refused moments ago: their owner, and until when
        # (time.monotonic()) a send skips the lease attempt.
        self._held_elsewhere: dict[str, tuple[str, float]] = {}
        # Threads whose lease the last sweep was refused: the holder it named.
        self._swept_holders: dict[str, str] = {}
        self._thread_lock = KeyLocks().hold
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._sweep_now = asyncio.Event()
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._sessions)} threads owned"
        return f"ThreadRuntime(process_id={self.process_id!r}, {state})"

    def lease_key(self, thread_key: str) -> str:
        """The lease key of ``thread_key`` (to observe the raw lease)."""
        return self.names.name(thread_key)

    def topic(self, thread_key: str) -> str:
        """The topic carrying ``thread_key``'s signals."""
        return self.names.name(thread_key)

    # -- lifecycle --------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def start(self) -> None:
        """Start sweeping for threads with unfinished signals (``send_signal`` starts it too)."""
        if self._closed:
            raise BackendClosed("ThreadRuntime is closed")
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep_loop(), name=f"tenure-sweep-{self.process_id}"
            )

    async def aclose(self) -> None:
        """Stop sweeping and every session: running handlers are cancelled, their
        unacknowledged signals stay in the log, the leases are released."""
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await asyncio.gather(*(s.stop() for s in list(self._sessions.values())))
        # What is left are unsubscribes that outlived their timeout.
        rest = list(self._tasks)
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.wait(rest, timeout=self.unsubscribe_timeout)
        if self._owns_log:
            await self.log.aclose()

    @property
    def closed(self) -> bool:
        return self._closed

    def owned_threads(self) -> list[str]:
        """Threads this process holds a session for right now."""
        return list(self._sessions)

    async def threads(self) -> list[ThreadStatus]:
        """The namespace's threads that have a run (in any process) or unfinished
        signals, read from the backend, by key; see :class:`ThreadStatus`."""
        found = await thread_statuses(self.provider, self.log, self.names)
        return with_sessions(found, self._sessions, self.process_id)

    async def thread_status(self, thread_key: str) -> ThreadStatus:
        """One thread's :class:`ThreadStatus` (no owner and nothing pending if idle)."""
        found = await thread_statuses(self.provider, self.log, self.names, thread_key)
        mine = {thread_key: self._sessions[thread_key]} if thread_key in self._sessions else {}
        found = with_sessions(found, mine, self.process_id)
        return found[0] if found else ThreadStatus(thread_key, None, None, None, None, None, False)

    # -- observability -----------------------------------------------------------

    def emit(
        self,
        kind: EventKind,
        thread_key: str,
        *,
        run_id: str | None = None,
        token: int | None = None,
        signal_id: str | None = None,
        detail: str | None = None,
    ) -> None:
        telemetry.count("tenure.runtime.events", {"tenure.runtime.event": kind})
        if self._on_event is None:
            return
        event = RuntimeEvent(
            kind=kind,
            thread_key=thread_key,
            process_id=self.process_id,
            at=time.monotonic(),
            run_id=run_id,
            token=token,
            signal_id=signal_id,
            detail=detail,
        )
        try:
            self._on_event(event)
        except Exception:
            logger.exception("on_event callback raised on %s", kind)

    # -- sending --------------------------------------------------------------

    async def send_signal(
        self, thread_key: str, payload: Any, *, signal_id: str | None = None
    ) -> SendResult:
        """Make ``payload`` a durable signal of ``thread_key`` and see that a run reads it.

        Returns ``"wake"`` when this call started the thread's run here,
        ``"deliver"`` when a run was already active (in this process or
        another) and will read it from the log, ``"rejected"`` under the
        ``reject`` policy while a run is active (nothing was stored).

        ``signal_id`` names the signal: a retried send with the same id stores
        nothing new, so a caller that got :class:`~tenure.BackendUnavailable`
        (the outcome is then unknown) can simply send again. Without it the
        backend gives the signal a new random id, and keeps no record to
        deduplicate it by (nobody could send it again): such a send costs what
        a plain ``publish`` does. Raises :class:`~tenure.InvalidArgument` for a
        bad key, id or a payload that is not JSON-serialisable, and
        :class:`~tenure.BackendClosed` after ``aclose()``.
        """
        name = self.names.name(thread_key)
        if signal_id is not None:
            check_name(signal_id, "signal_id")
        check_data(payload, "payload")
        if self._sweeper is None or self._closed:
            await self.start()  # raises BackendClosed after aclose()
        event = Event(SIGNAL_TYPE, {"thread": thread_key, "payload": payload}, None, signal_id)
        async with self._thread_lock(thread_key):
            session = self._sessions.get(thread_key)
            if session is not None and not session.done:
                if self.policy == "reject" and session.run is not None:
                    return self._rejected(thread_key, session.run_id, signal_id)
                stored = await self.log.publish(name, event)
                if self.policy == "interrupt":
                    session.interrupt(stored.id or "", stored.created_at or time.time())
                if session.closing:
                    session.late_send = True
                self.emit("deliver", thread_key, run_id=session.run_id, signal_id=stored.id)
                return SendResult("deliver", session.run_id, stored.id or "", thread_key)
            held = self._held_elsewhere.get(thread_key)
            if held is not None and time.monotonic() < held[1] and self.policy != "reject":
                # A run elsewhere held the thread a moment ago: it reads the signal
                # from the log. Should that run have closed since, the signal is
                # started by the sweep (within sweep_interval), as one sent just
                # after its close marker always is.
                stored = await self.log.publish(name, event)
                owner: str | None = held[0]
            elif self.policy != "reject" and name in self._known:
                # The thread's group exists: store the signal and try the lease at
                # once, so a send costs one round trip's wait, not two (a pipelined
                # connection carries both together). A session started here reads
                # the signal from the group whichever of the two lands first.
                publishing = asyncio.ensure_future(self.log.publish(name, event))
                tried = time.monotonic()
                try:
                    started, owner = await self._try_start(thread_key)
                except TenureError as exc:
                    # Stored (unless the publish fails too), but we could not look
                    # for its run: the sweep will.
                    logger.warning("could not acquire the lease of %r: %s", thread_key, exc)
                    started, owner = None, None
                except BaseException:
                    publishing.cancel()
                    await asyncio.gather(publishing, return_exceptions=True)
                    raise
                if started is not None:
                    return await self._woke(started, publishing)
                stored = await publishing
                self._held_by(thread_key, owner, tried)
            else:
                # The group may not exist yet (a signal published before it would be
                # skipped), or the policy must see the run before storing: take the
                # lease first, or publish once its owner is open.
                pause = 0.002
                give_up = time.monotonic() + _NO_HOLDER_WAIT
                while True:
                    started, owner = await self._try_start(thread_key)
                    if started is not None:
                        return await self._woke(started, self.log.publish(name, event))
                    if self.policy == "reject" and owner is not None:
                        return self._rejected(thread_key, run_of(owner), signal_id)
                    if owner is None and time.monotonic() >= give_up:
                        raise BackendUnavailable(
                            f"the lease of thread {thread_key!r} was refused without a holder "
                            f"for {_NO_HOLDER_WAIT:g} s (a Redis restart quarantine?); "
                            "the signal was not stored"
                        )
                    if owner is None or owner.endswith(".0"):
                        # Opening elsewhere, or refused with no holder (a Redis backend
                        # in quarantine after a start): the thread's group may not exist
                        # yet, and a signal published now could be skipped. Wait.
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, 0.05)
                        continue
                    break
                stored = await self.log.publish(name, event)
                self._remember(name)
            if self.policy == "interrupt":
                # The owner reads signals one at a time: tell it at once, out of band.
                await self.log.publish(
                    self.names.control(thread_key),
                    Event(
                        type=INTERRUPT,
                        data={"signal": stored.id, "sent_at": stored.created_at},
                    ),
                )
            run_id = run_of(owner)
            self.emit("deliver", thread_key, run_id=run_id, signal_id=stored.id)
            return SendResult("deliver", run_id, stored.id or "", thread_key)

    async def _woke(self, session: Session, publishing: Awaitable[Event]) -> SendResult:
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
            session.announce = "wake"
            await self._start_woken(session)
            raise
        self.emit(
            "wake",
            session.thread_key,
            run_id=session.run_id,
            token=session.token,
            signal_id=stored.id,
        )
        await self._start_woken(session)
        return SendResult("wake", session.run_id, stored.id or "", session.thread_key)

    async def _start_woken(self, session: Session) -> None:
        if session.stopping or self._closed:
            # aclose came while the signal was stored: what the session read goes
            # back to the group as it ends.
            session.announce = session.announce or "wake"
            await session.cleanup()
            raise BackendClosed("ThreadRuntime is closed")
        session.start()

    def _rejected(self, thread_key: str, run_id: str | None, signal_id: str | None) -> SendResult:
        # A signal without an id of the caller's gets the one it would have had.
        signal_id = signal_id or uuid.uuid4().hex
        self.emit("rejected", thread_key, run_id=run_id, signal_id=signal_id)
        return SendResult("rejected", run_id, signal_id, thread_key)

    def _held_by(self, thread_key: str, owner: str | None, tried: float) -> None:
        """The lease of ``thread_key``, tried at ``tried``, was refused to us: held by ``owner``."""
        held = self._held_elsewhere
        if owner is None or owner.endswith(".0"):
            held.pop(thread_key, None)  # no holder, or one still opening: try again next time
            return
        if len(held) >= _KNOWN_TOPICS:
            held.clear()
        held[thread_key] = (owner, tried + _HELD_ELSEWHERE_FOR)

    def _remember(self, topic: str) -> None:
        """Note that ``topic``'s consumer group exists (a session of it was open)."""
        known = self._known
        known[topic] = None
        known.move_to_end(topic)
        if len(known) > _KNOWN_TOPICS:
            known.popitem(last=False)

    async def _try_start(
        self,
        thread_key: str,
        kind: EventKind = "wake",
        previous: str | None = None,
    ) -> tuple[Session | None, str | None]:
        """Acquire the thread's lease and open a session; the session, or the holder's name.

        A ``"wake"`` (a send) gets its session open but not started: the sender
        starts it once its signal is stored (``_woke``). A ``"takeover"`` (the
        sweep) gets it started, to announce itself when it has something to run.

        A session whose topic may have no consumer group yet takes the lease
        as ``"<process>/<session>.0"`` (opening) and moves it to ``.1`` once
        subscribed, so senders elsewhere wait before publishing (see
        ``send_signal``). Raises what the backend raised, or ``BackendClosed`` when the
        runtime closed while the session opened; then no session exists.
        ``previous`` (a takeover) is the owner the thread's lease was last seen held by.
        """
        sid = uuid.uuid4().hex[:12]
        name = self.names.name(thread_key)
        phase = 1 if name in self._known else 0
        owner = f"{self.process_id}/{sid}.{phase}"
        sent = time.monotonic()
        result = await self.provider.acquire_lease(name, owner, self.ttl_ms)
        if not result.acquired:
            return None, result.owner
        session = Session(self, thread_key, sid, owner, result.token, sent)
        self._sessions[thread_key] = session
        await session.open()
        if session.stopping or self._closed:
            # aclose came while it opened: end it without a run and without
            # announcing anything; what it read goes back to the group.
            session.announce = kind
            await session.cleanup()
            raise BackendClosed("ThreadRuntime is closed")
        self._remember(name)
        session.renewer.start()
        if kind != "wake":
            session.announce, session.previous = kind, run_of(previous)
            session.start()
        return session, session.owner

    # -- sweeping -----------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sweep_now.wait(), self.sweep_interval)
            self._sweep_now.clear()
            try:
                await self._sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("sweeping for unfinished threads failed: %r", exc)

    async def _sweep(self) -> None:
        """Start a session for every thread of the namespace with unfinished signals and no owner."""
        names: list[str] = await self.log.backlog(self.names.prefix, GROUP)
        # Only the holders seen by the previous sweep are kept: the one that refused
        # it then is the owner a takeover now replaces (it expired or let go since).
        holders, self._swept_holders = self._swept_holders, {}
        for name in names:
            thread_key = self.names.thread_of(name)
            if thread_key is None or thread_key in self._sessions or self._closed:
                continue
            async with self._thread_lock(thread_key):
                if thread_key in self._sessions or self._closed:
                    continue
                try:
                    started, holder = await self._try_start(
                        thread_key, "takeover", previous=holders.get(thread_key)
                    )
                except TenureError as exc:
                    logger.warning("taking over %r: %s", thread_key, exc)
                    continue
                if started is None and holder is not None:
                    self._swept_holders[thread_key] = holder

    def poke(self) -> None:
        """Sweep now rather than at the next interval."""
        self._sweep_now.set()

    # -- what sessions call ---------------------------------------------------------

    async def unsubscribe(self, topic: str, callback: Any, thread_key: str) -> None:
        """Unsubscribe, waiting at most ``unsubscribe_timeout`` seconds.

        A session must not keep its thread's lease hostage to a backend whose
        unsubscribe hangs: after the timeout the unsubscribe goes on in the
        background and the session carries on (its callback takes nothing more).
        The signals the backend hands back when it finishes are found by the
        next sweep, which this process starts at once.
        """
        task = self._spawn(self._unsubscribe(topic, callback), f"tenure-unsubscribe-{topic!r}")
        await asyncio.wait([task], timeout=self.unsubscribe_timeout)
        if not task.done():
            logger.warning(
                "unsubscribing from %r takes longer than %.1f s; going on without waiting",
                topic,
                self.unsubscribe_timeout,
            )
            task.add_done_callback(lambda _: self.poke())

    async def _unsubscribe(self, topic: str, callback: Any) -> None:
        try:
            await self.log.unsubscribe(topic, callback)
        except TenureError as exc:
            logger.warning("unsubscribing from %r failed: %s", topic, exc)

    async def read_token(self, lease_key: str, owner: str) -> int | None:
        """The token of ``owner``'s lease after a transfer (``None`` without ``Capability.RECORD``)."""
        if Capability.RECORD not in capabilities_of(self.provider):
            return None
        try:
            record = await cast(Backend, self.provider).get_lease(lease_key)
        except TenureError:
            return None
        if record is None or record.owner != owner:
            return None
        return record.token

    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def session_ended(self, session: Session) -> None:
        session.ended.set()
        if self._sessions.get(session.thread_key) is session:
            del self._sessions[session.thread_key]
        if not self._closed and (session.lost.is_set() or session.late_send):
            # Signals may have gone back to the log after the next owner looked, or
            # a local send slipped in after the close marker: look for them now.
            self.poke()
