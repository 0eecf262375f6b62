"""Checkers of a thread run's evidence: pure functions, any history size (O(n log n)).

Violations (each must be 0 for the real runtime):

- **lost**: a signal whose ``send_signal`` returned (it is in the stored log)
  has no sink write at all.
- **overlap**: per thread (namespace, thread key of the handling run), a write
  whose token is lower than a token already written for that thread: a run
  acted after a newer run of the same thread had acted. Also a token written by
  two different runs (decided by :func:`tenure._history.token_clashes`).
- **order**: per (sender, namespace, thread), the first write of each signal
  comes in the sender's sequence order.
- **misrouted**: a signal written by a run of another namespace or thread than
  the one it was sent to (names that collide).
- **interleaved**: per thread, a run that writes again after another run wrote
  (a run's writes are contiguous once a later run has written).

The LangGraph workload's checkpoint histories are judged by the same functions
(:func:`checkpoint_writes` makes each checkpoint a write, in LangGraph's
history order): **overlap** and **interleaved** on the history (a token that
goes backwards, two runs' checkpoints interleaved), **order** (signals first
checkpointed in send order); **overlap** again in the order the saver committed
the checkpoints, where it keeps one (SQLite's rowid: a stale checkpoint stored
after a newer owner's, which the history, ordered by checkpoint id, can place
before it); and **answers** on the final states: every signal
whose send returned was applied and answered exactly once, and no signal more
than once.

The policies workload (each signal sent under a policy of its own) owes a write
only to the signals no rule settled: :func:`settlements` sorts every stored
signal without a write by the rule that may have settled it, and counts it
**lost** when none can: a ``discarded`` event for a ``discard`` signal; an
interrupt or rollback to its thread whose send returned after this one's began
and an ``interrupted`` event naming the signal (skipped, or the one its
cancelled run was handling); a ``coalesced`` event, when the signal it was
coalesced into was settled so too, or a fault began between that event and
that signal's first write (its run, holding both, ended); a ``persist`` signal no waking signal was
sent after; and the one documented gap, a signal carried into a ``coalesce`` or
``Debounce`` one and acknowledged, whose owner a fault ended before that run
(docs/policies.md). An ``interrupted`` event for a signal sent after every
interrupt of its thread returned is a **late interrupt**, and a ``discarded``
event for a signal not sent under ``discard`` is a **wrong settlement**: both
violations. A signal settled unrun (skipped or discarded: its event says so)
that a run wrote all the same, with a fault between (under way at the
settlement, or begun before that write), was settled by an owner whose
acknowledgement was lost with it or the server: the next owner ran it, after
newer signals. It is counted, and left out of the **order** check; without
such a fault it is a **wrong settlement** (settled and run).

Reported, never failed: **duplicates** (a signal written more than once:
delivery is at least once), the **takeover delays** after owner kills, and
**forks** (a checkpoint whose parent is not the one before it in the history).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tenure._history import Sighting, token_clashes

from .evidence import Checkpoint, Fault, FinalState, OutputSeen, Settled, Stored, Write

__all__ = [
    "LOOP_BOUND",
    "Interleaved",
    "Overlap",
    "Reordered",
    "ThreadReport",
    "answers",
    "check",
    "checkpoint_writes",
    "duplicates",
    "forks",
    "interleaved",
    "looped",
    "lost_signals",
    "misrouted",
    "order_violations",
    "overlaps",
    "percentile",
    "settlements",
    "takeover_delays",
]

# The policies whose signal skips what was sent before it, and those whose signal
# carries what waits before it into its own run.
_INTERRUPTING = ("interrupt", "rollback")
_CARRYING = ("coalesce", "debounce")
_SKIPPED = ("skipped", "cancelled with its run")

# A poison signal fails on every delivery; the backends drop it after
# max_attempts (5 by default). Faults add deliveries that spend no attempt (a
# killed or paused owner hands it back), a few, never without end: three times
# the attempts is a loop.
LOOP_BOUND = 15


@dataclass(frozen=True, slots=True)
class Overlap:
    """``stale`` was written after ``newer``, from an older run of the same thread.

    ``shared``: both runs wrote the same token (two runs, one token).
    """

    newer: Write
    stale: Write
    shared: bool = False

    def describe(self) -> str:
        n, s = self.newer, self.stale
        what = "shares token" if self.shared else "wrote after"
        return (
            f"overlap on {s.namespace}/{s.thread}: run {s.run_id} (token {s.token}, {s.worker}, "
            f"write #{s.order}) {what} run {n.run_id} (token {n.token}, {n.worker}, write #{n.order})"
        )


@dataclass(frozen=True, slots=True)
class Reordered:
    """``later`` (a higher sequence number of one sender and thread) was first written before ``earlier``."""

    earlier: Stored
    later: Stored
    earlier_write: int
    later_write: int

    def describe(self) -> str:
        e, x = self.earlier, self.later
        return (
            f"order on {e.namespace}/{e.thread} from {e.sender}: seq {x.seq} ({x.signal_id}) first "
            f"written at #{self.later_write}, before seq {e.seq} ({e.signal_id}) at #{self.earlier_write}"
        )


@dataclass(frozen=True, slots=True)
class Interleaved:
    """Run ``again.run_id`` wrote ``again`` after ``other`` of another run, having written before."""

    other: Write
    again: Write

    def describe(self) -> str:
        def run(w: Write) -> str:
            return f"run {w.run_id} (token {w.token}, {w.worker})"

        a = self.again
        where = f"{a.namespace}/{a.thread}"
        return f"interleaved on {where}: {run(a)} wrote #{a.order} ({a.signal_id}) after " + (
            f"{run(self.other)} wrote #{self.other.order}, having written before it"
        )


def lost_signals(stored: Iterable[Stored], writes: Iterable[Write]) -> list[Stored]:
    """Stored signals without any write."""
    written = {w.signal_id for w in writes}
    return [s for s in stored if s.signal_id not in written]


@dataclass
class Settlements:
    """How the stored signals without a write were settled (see :func:`settlements`)."""

    counts: Counter[str] = field(default_factory=Counter)
    lost: list[Stored] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    # Settled unrun (skipped or discarded: its event said so) and yet written, a
    # fault between: the settlement's acknowledgement was lost with its owner (or
    # the server), and the next owner ran it, after newer signals. Left out of
    # the order check, counted.
    revived: set[str] = field(default_factory=set)


def settlements(
    stored: Iterable[Stored],
    writes: Iterable[Write],
    settled: Iterable[Settled],
    faults: Iterable[Fault] = (),
) -> Settlements:
    """Sort each owed stored signal without a write by the rule that settled it.

    A rule settles a signal only with its evidence: the owner's event, or a newer
    signal of the thread whose policy allows it (sent after this one began, so
    the log may hold it after this one). Unsettled ones are ``lost``; events
    that settle against the rules are ``wrong``.
    """
    stored = [s for s in stored if s.owed]
    out = Settlements()
    written = {w.signal_id for w in writes}
    first = _first_writes(writes)
    events: dict[str, set[str]] = defaultdict(set)
    into: dict[str, tuple[str, int]] = {}  # coalesced signal -> (its carrier, when)
    unrun_at: dict[str, int] = {}  # signal settled unrun -> when it first was
    for e in settled:
        # An "interrupted" event names a settled signal by these details; the
        # request's own (the interrupting signal, "<n> waiting ...") settles nothing.
        if e.kind != "interrupted" or e.detail in _SKIPPED:
            events[e.signal_id].add(e.kind)
            if e.kind != "coalesced":
                unrun_at[e.signal_id] = min(e.t_ns, unrun_at.get(e.signal_id, e.t_ns))
        if e.kind == "coalesced" and e.detail is not None:
            into[e.signal_id] = (e.detail.removeprefix("into "), e.t_ns)
    # Per thread, what the rules ask of the signals sent after another, each
    # answered in O(log n): the latest return of an interrupting send; the
    # latest start of a send that wakes; the carrying sends by return time, with
    # the latest first write (inf: none) of those returning at or after each.
    interrupts: dict[tuple[str, str], list[int]] = defaultdict(list)
    last_waking: dict[tuple[str, str], int] = defaultdict(lambda: -1)
    carriers: dict[tuple[str, str], list[Stored]] = defaultdict(list)
    for s in stored:
        thread = (s.namespace, s.thread)
        if s.policy in _INTERRUPTING:
            interrupts[thread].append(s.t_ns)
        if s.policy != "persist":
            last_waking[thread] = max(last_waking[thread], s.t0_ns)
        if s.policy in _CARRYING:
            carriers[thread].append(s)
    for returns in interrupts.values():
        returns.sort()
    carried_by: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
    for thread, cs in carriers.items():
        cs.sort(key=lambda c: c.t_ns)
        ends = [first[c.signal_id].t_ns if c.signal_id in first else math.inf for c in cs]
        for i in range(len(ends) - 2, -1, -1):
            ends[i] = max(ends[i], ends[i + 1])
        carried_by[thread] = ([c.t_ns for c in cs], ends)
    spans = list(faults)
    starts = sorted(f.start_ns for f in spans)

    def interrupted_after(s: Stored) -> bool:
        """Another interrupt or rollback to ``s``'s thread returned after ``s``'s send began."""
        returns = interrupts[(s.namespace, s.thread)]
        later = len(returns) - bisect.bisect_right(returns, s.t0_ns)
        return later - (s.policy in _INTERRUPTING and s.t_ns > s.t0_ns) > 0

    def carried_then_faulted(s: Stored) -> bool:
        """Another carrying signal of ``s``'s thread returned after ``s``'s send began,
        and a fault began after that and before the carrier's first write."""
        j = bisect.bisect_left(starts, s.t0_ns)
        if j == len(starts):
            return False
        if s.policy in _CARRYING:  # rare (unwritten, no event): look at each other one
            return any(
                c is not s and c.t_ns > s.t0_ns and fault_between(s.t0_ns, c.signal_id)
                for c in carriers[(s.namespace, s.thread)]
            )
        times, ends = carried_by.get((s.namespace, s.thread), ([], []))
        i = bisect.bisect_right(times, s.t0_ns)
        return i < len(times) and starts[j] <= ends[i]

    def fault_between(since: int, signal_id: str, *, settled_first: bool = False) -> bool:
        """A fault began after ``since`` and before ``signal_id``'s first write (if
        any); with ``settled_first``, or was under way at ``since`` (a pause or a
        black hole that began before the settlement can still keep its ack)."""
        end = first[signal_id].t_ns if signal_id in first else math.inf
        if settled_first and any(f.start_ns <= since <= f.end_ns for f in spans):
            return True
        i = bisect.bisect_left(starts, since)
        return i < len(starts) and starts[i] <= end

    for s in stored:
        kinds = events.get(s.signal_id, set())
        if "discarded" in kinds and s.policy != "discard":
            out.wrong.append(
                f"wrong settlement: {s.signal_id} ({s.policy}) to {s.namespace}/{s.thread} "
                "was discarded"
            )
        if "interrupted" in kinds and not interrupted_after(s):
            out.wrong.append(
                f"late interrupt: {s.signal_id} ({s.policy}) to {s.namespace}/{s.thread} was "
                "skipped, sent after every interrupt of its thread returned"
            )
        if s.signal_id in written:
            # Settled before its first write (a settlement after it is of a copy
            # delivered again, the one that ran being unacknowledged).
            if s.signal_id in unrun_at and unrun_at[s.signal_id] < first[s.signal_id].t_ns:
                if fault_between(unrun_at[s.signal_id], s.signal_id, settled_first=True):
                    out.revived.add(s.signal_id)
                    out.counts["settled unrun, then run by the next owner (its ack lost)"] += 1
                else:
                    out.wrong.append(
                        f"settled and run: {s.signal_id} ({s.policy}) to {s.namespace}/"
                        f"{s.thread} was {'/'.join(sorted(kinds))} and later written, "
                        "with no fault between to lose the settlement"
                    )
            continue
        carrier, carried_at = into.get(s.signal_id, ("", 0))
        if "discarded" in kinds and s.policy == "discard":
            out.counts["discarded"] += 1
        elif "interrupted" in kinds:
            out.counts["skipped by an interrupt"] += 1
        elif carrier and "interrupted" in events.get(carrier, set()):
            out.counts["coalesced into a signal an interrupt settled"] += 1
        elif carrier and fault_between(carried_at, carrier):
            out.counts["coalesced into a run a fault ended"] += 1
        elif s.policy == "persist" and last_waking[(s.namespace, s.thread)] <= s.t_ns:
            out.counts["persisted, never woken"] += 1
        elif not carrier and carried_then_faulted(s):
            out.counts["carried, its owner ended by a fault before the run"] += 1
        else:
            out.lost.append(s)
    return out


def overlaps(writes: Iterable[Write]) -> list[Overlap]:
    """Per thread, each write with a token lower than one already written, and shared tokens.

    ``writes`` in any order; they are judged in commit order (``Write.order``).
    Writes without a token (a backend without tokens) are not judged here.
    """
    out: list[Overlap] = []
    by_thread: dict[tuple[str, str], list[Write]] = defaultdict(list)
    for w in sorted(writes, key=lambda w: w.order):
        if w.token is not None:
            by_thread[(w.namespace, w.thread)].append(w)
    for thread_writes in by_thread.values():
        top: Write | None = None
        top_token = 0
        for w in thread_writes:
            token = w.token if w.token is not None else 0
            if top is not None and token < top_token:
                out.append(Overlap(top, w))
            elif top is None or token > top_token:
                top, top_token = w, token
        # One token, two runs: the shared-token check of every lease history.
        sightings = [
            Sighting(w.order, w.order, w.run_id, w.token, w)
            for w in thread_writes
            if w.token is not None
        ]
        out.extend(
            Overlap(c.earlier.item, c.later.item, shared=True)
            for c in token_clashes(sightings)
            if c.shared
        )
    return out


def interleaved(writes: Iterable[Write]) -> list[Interleaved]:
    """Per thread, in commit order: each write of a run that wrote before another
    run's write that came after it (the run's writes are not contiguous)."""
    out: list[Interleaved] = []
    last: dict[tuple[str, str], Write] = {}
    done: dict[tuple[str, str], set[str]] = defaultdict(set)
    for w in sorted(writes, key=lambda w: w.order):
        thread = (w.namespace, w.thread)
        before = last.get(thread)
        if before is not None and before.run_id != w.run_id:
            done[thread].add(before.run_id)
            if w.run_id in done[thread]:
                out.append(Interleaved(before, w))
        last[thread] = w
    return out


def checkpoint_writes(checkpoints: Iterable[Checkpoint], *, stored: bool = False) -> list[Write]:
    """Each checkpoint as a write of its run, ``order`` its place in the history; with
    ``stored``, its place in the saver's commit order (only the checkpoints that have one)."""
    if stored:
        return [
            Write(c.stored, c.namespace, c.thread, c.token, c.run_id, c.signal_id, c.worker, 0)
            for c in checkpoints
            if c.stored is not None
        ]
    return [
        Write(i, c.namespace, c.thread, c.token, c.run_id, c.signal_id, c.worker, 0)
        for i, c in enumerate(checkpoints, 1)
    ]


def forks(checkpoints: Iterable[Checkpoint]) -> int:
    """Checkpoints whose parent is not the checkpoint before them in their thread's history."""
    n = 0
    previous: dict[tuple[str, str], str] = {}
    for c in checkpoints:
        thread = (c.namespace, c.thread)
        if thread in previous and c.parent_id != previous[thread]:
            n += 1
        previous[thread] = c.checkpoint_id
    return n


def answers(stored: Iterable[Stored], states: Iterable[FinalState]) -> list[str]:
    """Final states where a stored signal was not applied and answered exactly once,
    or any signal (stored or of an unknown outcome) more than once."""
    by_thread = {(f.namespace, f.thread): f for f in states}
    out: list[str] = []
    owed: dict[tuple[str, str], set[str]] = defaultdict(set)
    for s in stored:
        owed[(s.namespace, s.thread)].add(s.signal_id)
    for thread in sorted(set(owed) | set(by_thread)):
        final = by_thread.get(thread, FinalState(*thread, {}, {}))
        for sid in sorted(owed[thread] | set(final.asked) | set(final.answered)):
            asked, answered = final.asked.get(sid, 0), final.answered.get(sid, 0)
            if asked > 1 or answered > 1 or (sid in owed[thread] and (asked, answered) != (1, 1)):
                out.append(
                    f"answers on {thread[0]}/{thread[1]}: {sid} applied {asked} and answered "
                    f"{answered} times in the final state"
                    + ("" if sid in owed[thread] else " (its send did not return)")
                )
    return out


def _first_writes(writes: Iterable[Write]) -> dict[str, Write]:
    first: dict[str, Write] = {}
    for w in writes:
        if w.signal_id not in first or w.order < first[w.signal_id].order:
            first[w.signal_id] = w
    return first


def order_violations(stored: Iterable[Stored], writes: Iterable[Write]) -> list[Reordered]:
    """Per (sender, namespace, thread): each signal first written before an earlier-sent one.

    Lost signals are left out (they are counted as lost).
    """
    first = _first_writes(writes)
    streams: dict[tuple[str, str, str], list[Stored]] = defaultdict(list)
    for s in stored:
        if s.signal_id in first:
            streams[(s.sender, s.namespace, s.thread)].append(s)
    out: list[Reordered] = []
    for signals in streams.values():
        signals.sort(key=lambda s: s.seq)
        latest: Stored | None = None  # the signal with the latest first write so far
        for s in signals:
            at = first[s.signal_id].order
            if latest is not None and at < first[latest.signal_id].order:
                out.append(Reordered(latest, s, first[latest.signal_id].order, at))
            else:
                latest = s
    return out


def misrouted(stored: Iterable[Stored], writes: Iterable[Write]) -> list[tuple[Stored, Write]]:
    """Writes by a run of another namespace or thread than the signal was sent to."""
    sent = {s.signal_id: s for s in stored}
    out = []
    for w in writes:
        s = sent.get(w.signal_id)
        if s is not None and (s.namespace, s.thread) != (w.namespace, w.thread):
            out.append((s, w))
    return out


def duplicates(writes: Iterable[Write]) -> dict[str, int]:
    """Signal id → number of writes, for signals written more than once."""
    counts = Counter(w.signal_id for w in writes)
    return {sid: n for sid, n in counts.items() if n > 1}


def takeover_delays(
    stored: Iterable[Stored],
    writes: Sequence[Write],
    kills: Iterable[Fault],
    others: Sequence[Fault] | None = None,
) -> list[float]:
    """For each owner kill: ms from the kill to the next write on each thread it left stranded.

    A thread counts for a kill of worker W at ``t`` when W made the thread's
    last write before ``t`` (W ran it) and a signal of the thread was stored
    before ``t`` but first written after it (it was waiting). The delay is to
    the thread's first write after ``t``: the stranded-signal bound, measured.

    With ``others``, a delay is left out when another fault of ``others`` was
    active at any time during it (the successor was killed or paused too, or
    every worker was gone): the bound holds while a runtime process is alive
    and unhindered, and such a delay measures the faults stacked on the kill.
    """
    by_thread: dict[tuple[str, str], list[Write]] = defaultdict(list)
    for w in sorted(writes, key=lambda w: w.t_ns):
        by_thread[(w.namespace, w.thread)].append(w)
    times = {thread: [w.t_ns for w in tw] for thread, tw in by_thread.items()}
    first = _first_writes(writes)
    # Per thread, (stored at, first written at) of each written signal, by stored time.
    pending: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for s in stored:
        if s.signal_id in first:
            pending[(s.namespace, s.thread)].append((s.t_ns, first[s.signal_id].t_ns))
    # Per thread: stored times in order, and the latest first write among signals stored so far.
    stored_at: dict[tuple[str, str], list[int]] = {}
    latest: dict[tuple[str, str], list[int]] = {}
    for thread, spans in pending.items():
        spans.sort()
        stored_at[thread] = [a for a, _ in spans]
        latest[thread] = list(itertools.accumulate((b for _, b in spans), max))
    out: list[float] = []
    for kill in kills:
        t = kill.start_ns
        for thread, tw in by_thread.items():
            i = bisect.bisect_left(times[thread], t)
            if i == 0 or i == len(tw) or tw[i - 1].worker != kill.target:
                continue
            j = bisect.bisect_left(stored_at.get(thread, []), t)
            if not j or latest[thread][j - 1] <= t:
                continue
            end = tw[i].t_ns
            if others is not None and any(
                f is not kill and f.start_ns <= end and f.end_ns >= t for f in others
            ):
                continue
            out.append((end - t) / 1e6)
    return out


def percentile(xs: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank); NaN for no values."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


@dataclass
class ThreadReport:
    signals: int
    writes: int
    lost: list[Stored] = field(default_factory=list)
    overlaps: list[Overlap] = field(default_factory=list)
    reordered: list[Reordered] = field(default_factory=list)
    misrouted: list[tuple[Stored, Write]] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    untokened: int = 0
    takeover_ms: list[float] = field(default_factory=list)
    # The same, without the delays another fault overlapped (see takeover_delays()).
    takeover_isolated_ms: list[float] = field(default_factory=list)
    # Poison signals sent, and those handed more than LOOP_BOUND times: how many times.
    poisoned: int = 0
    looped: dict[str, int] = field(default_factory=dict)
    # Output items read in a wrong place: a gap or a repeat in positions, or a
    # stale owner's item after its successor's first (a lower token after a higher).
    stale_output: list[str] = field(default_factory=list)
    outputs: int = 0
    interleaved: list[Interleaved] = field(default_factory=list)
    # The LangGraph workload: its checkpoint histories, judged as writes, and its final states.
    checkpoints: int = 0
    history_overlaps: list[Overlap] = field(default_factory=list)
    history_reordered: list[Reordered] = field(default_factory=list)
    # Tokens going backwards in the saver's commit order (see checkpoint_writes).
    stored_overlaps: list[Overlap] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    forks: int = 0
    # The policies workload: how signals without a write were settled, and
    # settlements against the rules (late interrupts, wrong discards).
    settled: Counter[str] | None = None
    wrong_settlements: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return (
            len(self.lost)
            + len(self.overlaps)
            + len(self.reordered)
            + len(self.misrouted)
            + len(self.looped)
            + len(self.stale_output)
            + len(self.interleaved)
            + len(self.history_overlaps)
            + len(self.history_reordered)
            + len(self.stored_overlaps)
            + len(self.answers)
            + len(self.wrong_settlements)
        )

    def counts(self) -> dict[str, int]:
        counts = {
            "lost": len(self.lost),
            "overlaps": len(self.overlaps),
            "order": len(self.reordered),
            "misrouted": len(self.misrouted),
            "looped": len(self.looped),
            "interleaved": len(self.interleaved),
        }
        if self.outputs:
            counts["stale output"] = len(self.stale_output)
        if self.settled is not None:
            counts["wrong settlements"] = len(self.wrong_settlements)
        if self.checkpoints or self.answers:
            counts["checkpoint overlaps"] = len(self.history_overlaps)
            counts["checkpoint order"] = len(self.history_reordered)
            counts["checkpoints stored backwards"] = len(self.stored_overlaps)
            counts["not answered once"] = len(self.answers)
        return counts

    def settled_line(self) -> str:
        """How signals without a write were settled (the policies workload), or ``""``."""
        if self.settled is None:
            return ""
        how = ", ".join(f"{n} {k}" for k, n in sorted(self.settled.items())) or "none"
        return f"settlements: {how}; "

    def describe(self, limit: int = 5) -> list[str]:
        """One line per violation (at most ``limit`` of each kind)."""
        lines = [
            f"lost: {s.signal_id} to {s.namespace}/{s.thread} from {s.sender} (seq {s.seq})"
            for s in self.lost[:limit]
        ]
        lines += [o.describe() for o in self.overlaps[:limit]]
        lines += [r.describe() for r in self.reordered[:limit]]
        lines += [
            f"misrouted: {s.signal_id} sent to {s.namespace}/{s.thread}, written by run "
            f"{w.run_id} of {w.namespace}/{w.thread} ({w.worker})"
            for s, w in self.misrouted[:limit]
        ]
        lines += [
            f"looped: poison signal {sid} handed {n} times"
            for sid, n in list(self.looped.items())[:limit]
        ]
        lines += self.stale_output[:limit]
        lines += [i.describe() for i in self.interleaved[:limit]]
        lines += [f"checkpoint {o.describe()}" for o in self.history_overlaps[:limit]]
        lines += [f"checkpoint {r.describe()}" for r in self.history_reordered[:limit]]
        lines += [f"checkpoint stored {o.describe()}" for o in self.stored_overlaps[:limit]]
        lines += self.answers[:limit]
        lines += self.wrong_settlements[:limit]
        return lines


def looped(handed: Mapping[str, int], bound: int = LOOP_BOUND) -> dict[str, int]:
    """The poison signals handed to a handler more than ``bound`` times."""
    return {sid: n for sid, n in handed.items() if n > bound}


def stale_outputs(items: Iterable[OutputSeen]) -> list[str]:
    """Per thread, in position order: positions without gaps or repeats, and tokens that
    never go down (a stale owner's item read after its successor's first would)."""
    found: list[str] = []
    by_thread: dict[tuple[str, str], list[OutputSeen]] = defaultdict(list)
    for item in items:
        by_thread[item.namespace, item.thread].append(item)
    for (namespace, thread), seen in by_thread.items():
        for a, b in itertools.pairwise(seen):
            if b.position != a.position + 1:
                found.append(
                    f"output of {namespace}/{thread}: position {b.position} read after {a.position}"
                )
            if a.token is not None and b.token is not None and b.token < a.token:
                found.append(
                    f"stale output of {namespace}/{thread}: item {b.position} of run {b.run_id} "
                    f"(token {b.token}) after item {a.position} of run {a.run_id} "
                    f"(token {a.token})"
                )
    return found


def check(
    stored: Sequence[Stored],
    writes: Sequence[Write],
    faults: Sequence[Fault] = (),
    handed: Mapping[str, int] | None = None,
    outputs: Sequence[OutputSeen] = (),
    checkpoints: Sequence[Checkpoint] = (),
    states: Sequence[FinalState] = (),
    settled: Sequence[Settled] | None = None,
) -> ThreadReport:
    """Every check on one run's evidence; takeover delays after the ``owner-kill`` faults.

    Poison signals are never written: they are judged only by how many times they
    were ``handed`` to a handler (see :func:`looped`); the signals after one must
    still be written, in order (a loop on it would stall them). ``checkpoints``
    and ``states`` (the LangGraph workload, which sends no poison) are judged
    when given; with ``settled`` (the policies workload), a signal without a
    write is lost only when no rule settled it (:func:`settlements`).
    """
    kills = [f for f in faults if f.kind == "owner-kill"]
    history = checkpoint_writes(checkpoints)
    poisoned = len({s.signal_id for s in stored if s.poison})
    stored = [s for s in stored if s.owed]
    sorted_out = None if settled is None else settlements(stored, writes, settled, faults)
    return ThreadReport(
        signals=len({s.signal_id for s in stored}),
        writes=len(writes),
        lost=lost_signals(stored, writes) if sorted_out is None else sorted_out.lost,
        settled=None if sorted_out is None else sorted_out.counts,
        wrong_settlements=[] if sorted_out is None else sorted_out.wrong,
        overlaps=overlaps(writes),
        reordered=order_violations(
            [s for s in stored if sorted_out is None or s.signal_id not in sorted_out.revived],
            writes,
        ),
        misrouted=misrouted(stored, writes),
        duplicates=duplicates(writes),
        untokened=sum(1 for w in writes if w.token is None),
        takeover_ms=takeover_delays(stored, writes, kills),
        takeover_isolated_ms=takeover_delays(stored, writes, kills, faults),
        poisoned=poisoned,
        looped=looped(handed or {}),
        stale_output=stale_outputs(outputs),
        outputs=len(outputs),
        interleaved=interleaved(writes) + interleaved(history),
        checkpoints=len(checkpoints),
        history_overlaps=overlaps(history),
        history_reordered=order_violations(stored, history),
        stored_overlaps=overlaps(checkpoint_writes(checkpoints, stored=True)),
        answers=answers(stored, states) if states else [],
        forks=forks(checkpoints),
    )
