"""What a new signal does to its thread's active run (double-texting), as declared rules.

A :class:`SendRule` says what a signal sent under a policy may do; the sender
(:mod:`._sending`) and the owner (:func:`overtake`) apply every rule by the
same few steps, deciding from whether a run is active and what waits. A new
policy is a new rule in :data:`RULES`.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, replace
from typing import Any, get_args

from .._errors import InvalidArgument
from ._inbox import Inbox
from ._run import RunEnd, ThreadRun, current_signal, stop
from ._types import MAX_WINDOW, Debounce, Policy

__all__ = [
    "RULES",
    "STORED_AWAKE",
    "SendRule",
    "overtake",
    "rule_for",
    "rule_on_wire",
    "wakes_on_wire",
]


@dataclass(frozen=True, slots=True)
class SendRule:
    """What a signal sent under the policy ``name`` does to its thread.

    ``admitted_while_active``: stored while a run of the thread is active
    (otherwise the send answers ``"rejected"`` and stores nothing; the sender
    then looks for the run before storing). ``cancels_run``: the active run is
    cancelled (``run.interrupted`` is set) and the next one starts with the new
    signal. ``drops_older``: the signals waiting before it are acknowledged
    unhandled. ``carries_older``: the signals waiting before it are settled as
    coalesced into it and handed to its run with it (``Signal.coalesced``).
    ``drops_itself``: when the owner hears of it while a run handles a
    signal, it is settled unrun, as discarded. ``rolls_back``: the run it cancels is rolled back (the runtime's
    ``on_rollback``) before the next run starts. ``window`` (seconds): the
    signal is held, run or no run, until the owner has heard of no newer
    signal of the thread for ``window``, then handed over with the held ones
    before it (:meth:`~._inbox.Inbox.debounce`). ``wakes``: the send may
    start a run of an idle thread; without it the signal is stored and waits
    (a session of the thread that is awake takes it in order) until a send
    that wakes the thread, whose run takes the waiting ones first, in log order.
    """

    name: Policy
    admitted_while_active: bool = True
    cancels_run: bool = False
    drops_older: bool = False
    carries_older: bool = False
    drops_itself: bool = False
    rolls_back: bool = False
    window: float | None = None
    wakes: bool = True

    @property
    def tells_owner(self) -> bool:
        """Whether the owner must hear of the signal at once, ahead of the log's order."""
        return (
            self.cancels_run
            or self.drops_older
            or self.carries_older
            or self.drops_itself
            or self.holds
        )

    @property
    def holds(self) -> bool:
        """Whether the signal waits for a quiet window before a run takes it."""
        return self.window is not None

    def on_wire(self) -> dict[str, Any]:
        """What a signal and its request carry of the rule (read by :func:`rule_on_wire`)."""
        if self.window is None:
            return {"policy": self.name}
        return {"policy": self.name, "window": self.window}


RULES: dict[str, SendRule] = {
    rule.name: rule
    for rule in (
        SendRule("enqueue"),
        SendRule("interrupt", cancels_run=True, drops_older=True),
        SendRule("reject", admitted_while_active=False),
        SendRule("coalesce", carries_older=True),
        SendRule("discard", drops_itself=True),
        SendRule("rollback", cancels_run=True, drops_older=True, rolls_back=True),
        SendRule("persist", wakes=False),
    )
}

# The rule of Debounce(window), with its window.
_DEBOUNCE = SendRule("debounce", window=1.0)


def rule_for(policy: object) -> SendRule:
    """The rule of ``policy`` (a name, or a :class:`Debounce`); ``InvalidArgument`` otherwise."""
    if isinstance(policy, Debounce):
        return replace(_DEBOUNCE, window=policy.window)
    rule = RULES.get(policy) if isinstance(policy, str) else None
    if rule is None:
        names = ", ".join(repr(n) for n in get_args(Policy) if n in RULES)
        hint = (
            " (debounce needs a window: tenure.Debounce(seconds))" if policy == "debounce" else ""
        )
        raise InvalidArgument(f"policy must be one of {names} or a Debounce, got {policy!r}{hint}")
    return rule


def rule_on_wire(data: dict[str, Any], default: SendRule | None) -> SendRule | None:
    """The rule a stored signal or a request names (:meth:`SendRule.on_wire`), else ``default``."""
    policy = data.get("policy")
    if policy == _DEBOUNCE.name:
        window = data.get("window")
        if isinstance(window, int | float) and math.isfinite(window) and 0 < window <= MAX_WINDOW:
            return replace(_DEBOUNCE, window=float(window))
        return default
    return RULES.get(policy, default) if isinstance(policy, str) else default


# The mark of a signal that does not wake its thread (``persist``) stored while a
# run held the thread: the thread was awake, so whoever reads it runs it in order,
# as an awake session would (see :func:`wakes_on_wire`).
STORED_AWAKE = "awake"


def wakes_on_wire(data: dict[str, Any], default: SendRule) -> bool:
    """Whether a stored signal's rule (``default`` when it names none) wakes its thread.

    A ``persist`` signal stored while a run held the thread (:data:`STORED_AWAKE`)
    does: should that run's owner die before reading it, the next owner reads it
    first, and would otherwise end at it and strand the signals behind it, sent
    to a thread whose run was active.
    """
    if data.get(STORED_AWAKE) is True:
        return True
    rule = rule_on_wire(data, default)
    return rule is None or rule.wakes


def overtake(
    rule: SendRule,
    run: ThreadRun | None,
    task: asyncio.Task[RunEnd] | None,
    inbox: Inbox,
    signal_id: str,
    sent_at: float,
) -> bool:
    """At the owner: apply ``rule`` for the newer signal ``signal_id`` (sent at ``sent_at``).

    Only an active run is overtaken, once, and only for signals sent before
    ``signal_id``, whatever order the owner reads the signal and the request in:
    a request whose signal a run of this session took already comes too late and
    changes nothing, and a run handling a signal sent after ``signal_id`` (by the
    senders' clocks) goes on. Returns whether the run was cancelled.

    A coalescing signal cancels nothing: the signals waiting before it are
    carried into it (:meth:`~._inbox.Inbox.carry_through`). A discarding one
    is settled unrun if the run handles a signal (:meth:`~._inbox.Inbox.discard`).
    A debouncing one
    (``rule.holds``) restarts the thread's quiet window, whether a run is
    active or not, and cancels nothing.
    """
    if rule.holds:
        inbox.heard(signal_id, rule.window or 0.0)
        return False
    if not rule.tells_owner or run is None or task is None or task.done() or run.interrupted:
        return False
    if inbox.was_taken(signal_id):
        return False  # handled, or being handled: nothing sent before it waits any more
    if rule.carries_older:
        run.emit("coalescing", signal_id, "waits behind the run")
        inbox.carry_through(signal_id, sent_at)
        return False
    if rule.drops_itself:
        if current_signal(run) is not None:
            inbox.discard(signal_id)
        return False
    current = current_signal(run)
    newer_runs = current is not None and current.sent_at > sent_at
    skipped = inbox.skip_through(signal_id, sent_at) if rule.drops_older else []
    if newer_runs and not skipped:
        return False
    cancel = rule.cancels_run and not newer_runs
    if cancel:
        run.interrupted = True
    run.emit("interrupted", signal_id, f"{len(skipped)} waiting signal(s) skipped")
    if cancel:
        stop(run, task, "interrupted", f"interrupted by signal {signal_id}")
    return cancel
