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
- **Double-texting policy**, per runtime and per send (the owner applies the
  sender's). ``enqueue`` (default): a new signal waits for the
  active run. ``interrupt``: the active run is cancelled (``run.interrupted``)
  and the next run starts with the new signal; signals waiting before it are
  skipped. ``rollback``: ``interrupt``, and ``on_rollback(thread_key, run_id)``
  for the cancelled run before the next one. ``coalesce``: of the signals
  waiting behind the run only the newest runs, with the others in
  ``Signal.coalesced``. ``reject``: ``send_signal`` answers ``"rejected"`` and
  stores nothing while a run of the thread is active anywhere. Exact
  semantics, also when the owner dies: ``docs/policies.md``.

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
their senders' clocks when they arrive after the request). A request only ever
affects signals sent before its own: one whose signal a run took already
changes nothing, however late the owner reads it.

*Rooms.* ``docs/runtime.md`` says which module owns what: sending and the
policies' rules, the sessions and a session's life behind its context, the
lease, the inbox, the run.

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
raises on a signal gets it again at most the backend's ``max_attempts`` times
(a ``CancelledError`` that tenure did not ask for counts as raising).
"""

from __future__ import annotations

import asyncio
from typing import Any, Self

from .._contract import Backend, LeaseProvider
from .._errors import BackendClosed, InvalidArgument
from .._lifecycle import AsyncCloseable
from .._pubsub import check_data
from .._validate import check_name
from ._context import OnRollback, Settings
from ._locks import KeyLocks
from ._log import CLOSE_MARKER, GROUP, SIGNAL_TYPE, EventSource, log_for, provider_for
from ._names import ThreadNames
from ._observe import Observer
from ._policies import rule_for
from ._run import Handler, ThreadRun
from ._sending import Sender
from ._sessions import Sessions
from ._status import ThreadStatus, thread_statuses, with_sessions
from ._sweep import Sweeper
from ._types import OnEvent, Policy, SendResult

__all__ = ["CLOSE_MARKER", "GROUP", "SIGNAL_TYPE", "Handler", "ThreadRun", "ThreadRuntime"]


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
    ``"interrupt"``, ``"rollback"``, ``"coalesce"`` or ``"reject"``: what a new
    signal does to an active run, unless its send chooses), ``namespace``
    (keeps applications apart; default ``"tenure.thread"``), ``on_rollback``
    (called as ``on_rollback(thread_key, run_id)``, sync or async, for a run a
    ``rollback`` signal cancelled, before the thread's next run).

    ``on_event`` is called synchronously with a :class:`RuntimeEvent` at each
    step; an exception it raises is logged and ignored.

    See the module docstring for the guarantees and how they are obtained.
    """

    def __init__(
        self,
        backend: Backend | EventSource,
        handler: Handler,
        *,
        lease_provider: LeaseProvider | None = None,
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
        on_rollback: OnRollback | None = None,
    ) -> None:
        if not callable(handler):
            raise InvalidArgument(f"handler must be callable, got {type(handler).__name__}")
        settings = Settings.check(
            ttl_ms=ttl_ms,
            renew_every_ms=renew_every_ms,
            renew_deadline_ms=renew_deadline_ms,
            idle_timeout=idle_timeout,
            sweep_interval=sweep_interval,
            marker_timeout=marker_timeout,
            unsubscribe_timeout=unsubscribe_timeout,
            cancel_on_loss=cancel_on_loss,
            process_id=process_id,
            on_rollback=on_rollback,
        )
        if on_event is not None and not callable(on_event):
            raise InvalidArgument(f"on_event must be callable, got {type(on_event).__name__}")
        rule = rule_for(policy)
        self.names = ThreadNames(namespace)
        provider = provider_for(backend, lease_provider)
        self.settings, self.policy, self.backend = settings, rule.name, backend
        self._rule = rule
        self.process_id, self.namespace = settings.process_id, self.names.namespace
        self.provider = provider
        self.log, self._owns_log = log_for(backend, provider, self)
        observer = Observer(settings.process_id, on_event)
        self._locks = KeyLocks()
        self._sessions = Sessions(
            settings, self.names, self.log, provider, handler, rule, observer.emit, self.poke
        )
        self._sender = Sender(self.names, self.log, self._sessions, self._locks.hold, observer.emit)
        self._sweeper = Sweeper(
            self.log, self.names, self._sessions, self._locks.hold, settings.sweep_interval
        )
        self._sweep_task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._sessions)} threads owned"
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
        if self.closed:
            raise BackendClosed("ThreadRuntime is closed")
        if self._sweep_task is None:
            self._sweep_task = asyncio.get_running_loop().create_task(
                self._sweeper.loop(), name=f"tenure-sweep-{self.process_id}"
            )

    async def aclose(self) -> None:
        """Stop sweeping and every session: running handlers are cancelled, their
        unacknowledged signals stay in the log, the leases are released."""
        if self.closed:
            return
        self._sessions.closed = True
        if self._sweep_task is not None:
            self._sweep_task.cancel()
            await asyncio.gather(self._sweep_task, return_exceptions=True)
        await self._sessions.close()
        if self._owns_log:
            await self.log.aclose()

    @property
    def closed(self) -> bool:
        return self._sessions.closed

    def poke(self) -> None:
        """Sweep now rather than at the next interval."""
        self._sweeper.poke()

    # -- what operators see -------------------------------------------------------

    def owned_threads(self) -> list[str]:
        """Threads this process holds a session for right now."""
        return list(self._sessions)

    async def threads(self) -> list[ThreadStatus]:
        """The namespace's threads that have a run (in any process) or unfinished
        signals, read from the backend, by key; see :class:`ThreadStatus`."""
        found = await thread_statuses(self.provider, self.log, self.names)
        return with_sessions(found, self._sessions.items(), self.process_id)

    async def thread_status(self, thread_key: str) -> ThreadStatus:
        """One thread's :class:`ThreadStatus` (no owner and nothing pending if idle)."""
        found = await thread_statuses(self.provider, self.log, self.names, thread_key)
        session = self._sessions.get(thread_key)
        mine = {thread_key: session} if session is not None else {}
        found = with_sessions(found, mine, self.process_id)
        return found[0] if found else ThreadStatus(thread_key, None, None, None, None, None, False)

    # -- sending --------------------------------------------------------------

    async def send_signal(
        self,
        thread_key: str,
        payload: Any,
        *,
        signal_id: str | None = None,
        policy: Policy | None = None,
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
        a plain ``publish`` does.

        ``policy`` (default: the runtime's ``policy``) is what this signal does
        to the thread's active run; it travels with the signal, so the owner
        applies it whatever its own default (see ``docs/policies.md``).

        Raises :class:`~tenure.InvalidArgument` for a bad key, id, policy or a
        payload that is not JSON-serialisable, and
        :class:`~tenure.BackendClosed` after ``aclose()``.
        """
        rule = self._rule if policy is None else rule_for(policy)
        self.names.name(thread_key)
        if signal_id is not None:
            check_name(signal_id, "signal_id")
        check_data(payload, "payload")
        if self._sweep_task is None or self.closed:
            await self.start()  # raises BackendClosed after aclose()
        return await self._sender.send(thread_key, payload, signal_id, rule)
