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
  stores nothing while a run of the thread is active anywhere. ``discard``:
  stored, then settled unrun (``"discarded"``) if the owner hears of it while
  its run is busy. ``Debounce(window)``: held until the owner heard of no new
  signal for ``window`` seconds, then handed over together. Exact
  semantics, also when the owner dies: ``docs/policies.md``.

Design
------
*How it works* (the design, module by module) is in ``docs/runtime.md``.

Limits: a backend that loses acknowledged state (a Redis restart without
persistence) can lose signals published before the restart; a handler that
raises on a signal gets it again at most the backend's ``max_attempts`` times
(a ``CancelledError`` that tenure did not ask for counts as raising).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, Self

from .._contract import Backend, LeaseProvider
from .._errors import BackendClosed, ConfigurationError, InvalidArgument
from .._lifecycle import AsyncCloseable
from .._pubsub import check_data
from .._validate import check_name
from ._context import OnRollback, Settings
from ._identity import run_of
from ._locks import KeyLocks
from ._log import CLOSE_MARKER, GROUP, SIGNAL_TYPE, EventSource, log_for, provider_for
from ._names import ThreadNames
from ._observe import Observer
from ._output import OutputItem, Retention, store_for
from ._policies import rule_for
from ._replies import Outputs
from ._run import Handler, ThreadRun
from ._sending import Sender
from ._sessions import Sessions
from ._status import ThreadStatus, thread_statuses, with_sessions
from ._sweep import Sweeper
from ._types import Debounce, OnEvent, Policy, SendResult

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
    ``"interrupt"``, ``"rollback"``, ``"coalesce"``, ``"reject"``,
    ``"discard"`` or a :class:`~tenure.Debounce`: what a new signal does to an
    active run, unless its send chooses), ``namespace``
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
        policy: Policy | Debounce = "enqueue",
        namespace: str = "tenure.thread",
        output: Retention | bool = False,
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
        self._outputs = self._output_for(output, provider)
        if self._outputs is not None:
            handler = self._outputs.wrap(handler)
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

    def _output_for(self, output: Retention | bool, provider: LeaseProvider) -> Outputs | None:
        if output is False:
            return None
        retention = Retention() if output is True else output
        if not isinstance(retention, Retention):
            raise InvalidArgument(f"output must be a bool or a Retention, got {output!r}")
        return Outputs(
            store_for(self.backend, provider),
            self.names.name,
            retention,
            self.settings.process_id,
            self.log,
            self.names.cancel,
        )

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
        if self._outputs is not None:
            await self._outputs.store.aclose()
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
        policy: Policy | Debounce | None = None,
    ) -> SendResult:
        """Make ``payload`` a durable signal of ``thread_key`` and see that a run reads it.

        Returns ``"wake"`` when this call started the thread's run here,
        ``"deliver"`` when a run was already active (in this process or
        another) and will read it from the log, ``"rejected"`` under the
        ``reject`` policy while a run is active (nothing was stored),
        ``"persisted"`` under the ``persist`` policy (stored; no run started:
        the thread's next waking send runs it first).

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
        if self._outputs is None:
            return await self._sender.send(thread_key, payload, signal_id, rule)
        after = await self._outputs.head(thread_key)
        result = await self._sender.send(thread_key, payload, signal_id, rule)
        return dataclasses.replace(result, output_after=after)

    # -- replies ----------------------------------------------------------------

    def _replies(self) -> Outputs:
        if self._outputs is None:
            raise ConfigurationError(
                "this runtime keeps no output: ThreadRuntime(..., output=True)"
            )
        return self._outputs

    def follow(self, thread_key: str, *, after: int = 0) -> AsyncIterator[OutputItem]:
        """Every item of ``thread_key``'s output after position ``after``, in order, as it comes.

        Never ends by itself. Resume with the last position seen: each item is
        read exactly once, also across a takeover. Raises
        :class:`~tenure.OutputTruncated` when retention dropped items after
        ``after``.
        """
        self.names.name(thread_key)
        return self._replies().follow(thread_key, after)

    def reply(self, result: SendResult, *, after: int | None = None) -> AsyncIterator[OutputItem]:
        """The output items answering ``result``'s signal, ending when its reply is complete.

        Complete: the signal was finished (``signal_finished``) or its run was
        interrupted. A run cut off mid-reply shows as a ``run_lost`` item; the
        next run's reply to the same signal follows. ``after`` resumes (the last
        position seen).
        """
        return self._replies().reply(result, after)

    async def last_position(self, thread_key: str) -> int:
        """The position of ``thread_key``'s newest output item (0: none yet)."""
        self.names.name(thread_key)
        return await self._replies().head(thread_key)

    async def cancel(self, thread_key: str, *, run_id: str | None = None) -> str | None:
        """Stop the run of ``thread_key``, wherever it runs; the id of the run asked, or ``None``.

        The run sees it as an interrupt (``run.interrupted``, its handler
        cancelled): the signal it was handling counts as handled, and its output
        says so (``cancel``, then ``run_ended`` with ``end="interrupted"``), which
        completes that signal's reply. A cancel names one run: ``run_id``, or the
        run holding the thread's lease now (``None`` when there is none). It
        never stops another run, so a cancel that arrives late does nothing. It
        is carried by the backend's fan-out events to the owner's run: a run
        that has not subscribed yet (it just started) does not see it.
        """
        self.names.name(thread_key)
        if run_id is None:
            run_id = run_of(await self.provider.get_lease_owner(self.names.name(thread_key)))
            if run_id is None:
                return None
        check_name(run_id, "run_id")
        await self._replies().cancel(thread_key, run_id, self.process_id)
        return run_id

    async def wait_reply(
        self, result: SendResult, *, timeout: float | None = None
    ) -> list[OutputItem]:
        """All of :meth:`reply` at once; ``TimeoutError`` after ``timeout`` seconds."""

        async def collect() -> list[OutputItem]:
            return [item async for item in self.reply(result)]

        return await asyncio.wait_for(collect(), timeout)
