"""The runtime's value types: what handlers read, what senders get back, what observers see."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .._errors import InvalidArgument

__all__ = [
    "Debounce",
    "EventKind",
    "OnEvent",
    "Outcome",
    "Policy",
    "RuntimeEvent",
    "SendResult",
    "Signal",
]

Outcome = Literal["wake", "deliver", "rejected", "persisted"]

#: What a new signal does to a thread whose run is active (double-texting).
#: ``"debounce"`` is the name of a :class:`Debounce` (it needs a window);
#: ``"persist"`` stores the signal without waking an idle thread.
Policy = Literal[
    "enqueue", "interrupt", "reject", "coalesce", "rollback", "discard", "debounce", "persist"
]

# The longest debounce window accepted, in seconds.
MAX_WINDOW = 3600.0


@dataclass(frozen=True, slots=True)
class Debounce:
    """The ``debounce`` policy: a run takes the thread's signals only once none
    came for ``window`` seconds, all of them together.

    Accepted wherever a policy name is (``send_signal(..., policy=Debounce(0.5))``,
    ``ThreadRuntime(..., policy=Debounce(0.5))``). The window is counted by the
    thread's owner, from when it learns of each signal (its request or the
    signal itself, whichever comes first), on its own monotonic clock: a
    sender's clock never enters. The run gets the newest signal with the older
    ones in ``Signal.coalesced``. Raises :class:`~tenure.InvalidArgument` unless
    ``window`` is a number of seconds in (0, 3600].
    """

    window: float

    def __post_init__(self) -> None:
        window = self.window
        if isinstance(window, bool) or not isinstance(window, int | float):
            raise InvalidArgument(
                f"debounce window must be a number of seconds, got {type(window).__name__}"
            )
        if not (math.isfinite(window) and 0 < window <= MAX_WINDOW):
            raise InvalidArgument(
                f"debounce window must be in (0, {MAX_WINDOW:g}] seconds, got {window!r}"
            )
        object.__setattr__(self, "window", float(window))

    @property
    def name(self) -> Policy:
        return "debounce"


EventKind = Literal[
    "wake",
    "deliver",
    "rejected",
    "signal",
    "handover",
    "release",
    "takeover",
    "lost",
    "interrupted",
    "coalescing",
    "coalesced",
    "discarded",
    "rollback",
    "run_end",
    "refused",
]


@dataclass(frozen=True, slots=True)
class Signal:
    """One signal addressed to a thread, as a handler reads it.

    ``id`` is unique per ``send_signal`` call and stays the same when the signal
    is delivered again after a crash or a lost lease, so a handler can
    de-duplicate (delivery is at-least-once). ``sent_at`` is the sender's wall
    clock (seconds since the epoch); ``attempt`` is 1 on first delivery.

    ``coalesced``: the signals this one replaced while they waited (sent under
    the ``coalesce`` policy), oldest first; each of them was settled as
    coalesced into this one and is not delivered on its own.
    """

    id: str
    thread_key: str
    payload: Any
    sent_at: float
    attempt: int = 1
    coalesced: tuple[Signal, ...] = ()


@dataclass(frozen=True, slots=True)
class SendResult:
    """What ``send_signal`` did.

    ``outcome`` is ``"wake"`` when this process won the thread's lease and
    started the run that will read the signal (``run_id``), ``"deliver"`` when a
    run was already active (here or in another process): the signal was left
    in the thread's log for that run, whose id (as read from the lease owner)
    is ``run_id``. The signal is durable (on a durable backend) either way.
    ``"rejected"`` (only with the ``reject`` policy): a run was active, and the
    signal was not stored. ``"persisted"`` (only with the ``persist`` policy):
    the signal was stored and this send started no run (``run_id`` is
    ``None``); a session of the thread that is awake takes it in order, as it
    would an ``enqueue`` one (so does the next owner, should a run hold the
    thread when it is stored and its owner die), otherwise it waits, stored,
    for the thread's next waking send, whose run takes it first. ``policy`` is the policy the signal was sent under
    (the send's own, or the runtime's default); it travels with the signal, so
    the thread's owner applies it whatever its own default.

    ``output_after`` (a runtime that keeps output): the thread's last output
    position before the signal was sent; its reply comes after it
    (:meth:`ThreadRuntime.reply`).
    """

    outcome: Outcome
    run_id: str | None
    signal_id: str
    thread_key: str
    output_after: int | None = None
    policy: Policy = "enqueue"


@dataclass(frozen=True, slots=True)
class RuntimeEvent:
    """An observable step of the runtime, passed to ``on_event``.

    ``at`` is ``time.monotonic()`` in the process that emitted the event.
    ``detail`` carries a short human-readable note (the reason of a loss, the
    previous run's id on a hand-over, ...). On a ``"takeover"`` it is the run id
    of the previous owner when this process saw it: the holder named when this
    process's previous sweep (one ``sweep_interval`` earlier) was refused the
    thread's lease, which has since expired or been let go. It is ``None`` when
    that sweep saw no holder: the lease was already free when this process first
    looked (it started after the owner died, or the owner released it normally
    and a signal came after its close marker).

    On a ``"run_end"``, ``detail`` says how the run ended: ``"ok"`` (the handler
    returned), ``"failed"`` (it raised), ``"lost"`` (the lease was lost),
    ``"interrupted"`` (a newer signal, under the ``interrupt`` policy) or
    ``"cancelled"`` (the runtime's ``aclose()`` cancelled it); the run's
    ``tenure run`` span records the same as ``tenure.run.end``.

    A ``"coalescing"`` event says the owner learnt, while a run was active, of
    a signal (``signal_id``) sent under the ``coalesce`` policy: the signals
    waiting before it will be carried into it. A ``"coalesced"`` event names a
    signal (``signal_id``) settled as replaced under the ``coalesce`` policy;
    ``detail`` is ``"into <id>"``, the signal whose run receives it in
    ``Signal.coalesced`` (it comes when that signal is read, in log order). A ``"rollback"`` event says
    ``on_rollback`` was called for the interrupted run ``run_id`` (``detail``:
    ``"ok"`` or the error it raised).

    An ``"interrupted"`` event names the signal (``signal_id``) of an
    ``interrupt`` or ``rollback`` request the owner applied (``detail``: ``"<n>
    waiting signal(s) skipped"``). Each signal the request settled unhandled has
    an ``"interrupted"`` event of its own, emitted before it is acknowledged:
    ``"skipped"`` for one that waited (buffered, carried into a coalescing
    signal, held by a debounce, or arriving after the request) and ``"cancelled
    with its run"`` for the one the cancelled run was handling.

    A ``"discarded"`` event names a signal (``signal_id``) sent under the
    ``discard`` policy that the owner settled unrun, because a run was
    handling a signal when it heard of it.

    A ``"refused"`` event says the backend refuses the thread's lease to
    everyone for a while (``detail``: ``"quarantine: retry in <ms> ms"``, a
    Redis that may have lost leases); sends and the sweep wait it out. It comes
    at most once a second per thread.
    """

    kind: EventKind
    thread_key: str
    process_id: str
    at: float
    run_id: str | None = None
    token: int | None = None
    signal_id: str | None = None
    detail: str | None = None


OnEvent = Callable[[RuntimeEvent], Any]
