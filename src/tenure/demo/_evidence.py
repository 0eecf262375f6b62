"""What the demo's processes record, and the verdict computed from it.

Every worker appends one JSON document per line to its own file in the demo's
directory and flushes each line at once, so whatever a worker did before it was
killed is on disk. The coordinator appends its own records (the kill) to
``coordinator.jsonl``. All processes run on one host, so their
``time.monotonic_ns()`` readings share one timeline.

Records (``k`` is the kind, ``w`` the writer, ``t`` a monotonic ns timestamp):

- ``hello``: ``pid``, ``process_id`` (the runtime's process id)
- ``sent``: ``sig`` (the demo's signal name), ``signal_id``, ``thread``, ``outcome``, ``run_id``
- ``run_start``: ``thread``, ``run_id``, ``token``
- ``handled``: ``sig``, ``signal_id``, ``thread``, ``run_id``, ``token``, ``start``, ``end``, ``attempt``
- ``run_end``: ``thread``, ``run_id``, ``token``, ``how`` (``ok``, ``lost``, ``cancelled``)
- ``event``: ``ev`` (a runtime event kind), ``thread``, ``run_id``, ``token``, ``signal_id``, ``detail``
- ``sending_done``, ``done``
- coordinator: ``start`` (the settings), ``killed`` (``victim``, ``pid``)

The verdict is plain computation over those records (no I/O), so it can be
checked on hand-made histories: the tests feed it bad ones and expect FAIL.
Exclusivity and token order are decided by :mod:`tenure._history`, the same
checker the repository's safety harness runs on its lease histories.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._history import Sighting, Window, handoffs, token_clashes

__all__ = [
    "COORDINATOR",
    "Check",
    "PlannedSignal",
    "Run",
    "Verdict",
    "count_takeovers",
    "judge",
    "plan",
    "read_dir",
    "read_new_lines",
    "runs_of",
    "worker_name",
]

COORDINATOR = "coordinator"

Record = dict[str, Any]


def worker_name(index: int) -> str:
    return f"w{index + 1}"


@dataclass(frozen=True, slots=True)
class PlannedSignal:
    n: int
    sig: str
    thread: str
    sender: str


def plan(seed: int, workers: int, threads: int, signals: int) -> list[PlannedSignal]:
    """The signal stream for a seed: which worker sends which signal to which thread.

    Random threads, senders in turn, then a tail in which every worker sends to
    every thread, so that after the kill each thread still hears from a
    survivor (a thread only the killed worker ever wrote to would wait in the
    log for a next signal: see the runtime's known limits).
    """
    rng = random.Random(f"plan:{seed}")
    names = [f"thread-{i + 1}" for i in range(threads)]
    tail = [(t, w) for t in range(threads) for w in range(workers)]
    if len(tail) > signals // 2:
        tail = []
    head = signals - len(tail)
    out: list[PlannedSignal] = []
    for n in range(signals):
        if n < head:
            thread, sender = rng.randrange(threads), n % workers
        else:
            thread, sender = tail[n - head]
        out.append(PlannedSignal(n, f"s{n:05d}", names[thread], worker_name(sender)))
    return out


# -- reading --------------------------------------------------------------------


def read_new_lines(path: Path, offset: int) -> tuple[list[Record], int]:
    """Complete lines of ``path`` from byte ``offset``; the records and the new offset.

    A line without its newline yet (being written, or cut by a kill) is left
    for the next call.
    """
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    records: list[Record] = []
    for line in data[: end + 1].splitlines():
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            records.append(doc)
    return records, offset + end + 1


def read_dir(directory: Path) -> list[Record]:
    """Every complete record of every ``*.jsonl`` file in ``directory``."""
    records: list[Record] = []
    for path in sorted(directory.glob("*.jsonl")):
        records.extend(read_new_lines(path, 0)[0])
    return records


# -- the verdict ----------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """One run (one call of the handler) as the evidence shows it."""

    worker: str
    thread: str
    run_id: str
    token: int | None
    start: int
    end: int | None = None
    how: str | None = None  # ok / lost / cancelled / killed / unfinished


@dataclass(slots=True)
class Check:
    name: str
    passed: bool
    summary: str
    problems: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Verdict:
    checks: list[Check]
    figures: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def lines(self, max_problems: int = 5) -> Iterator[str]:
        for c in self.checks:
            yield f"  [{'PASS' if c.passed else 'FAIL'}] {c.name}: {c.summary}"
            for p in c.problems[:max_problems]:
                yield f"         - {p}"
            if len(c.problems) > max_problems:
                yield f"         - ... and {len(c.problems) - max_problems} more"
        yield f"VERDICT: {'PASS' if self.passed else 'FAIL'}"


def runs_of(records: Iterable[Record]) -> list[Run]:
    """The runs in ``records``, each closed by its ``run_end``, its worker's kill or the end.

    A killed worker's open run ends at the time the coordinator saw the
    process gone. A run that never ended otherwise is closed at the last
    timestamp of the evidence (and marked ``unfinished``), the conservative
    choice for the overlap check.
    """
    records = list(records)
    killed = {r["victim"]: int(r["t"]) for r in records if r.get("k") == "killed"}
    last_t = max((int(r["t"]) for r in records if "t" in r), default=0)
    runs: dict[tuple[str, str], Run] = {}
    for r in records:
        if r.get("k") == "run_start":
            key = (r["w"], r["run_id"])
            runs[key] = Run(r["w"], r["thread"], r["run_id"], r.get("token"), int(r["t"]))
    for r in records:
        if r.get("k") == "run_end":
            run = runs.get((r["w"], r["run_id"]))
            if run is not None:
                run.end = int(r["t"])
                run.how = str(r.get("how"))
    for run in runs.values():
        if run.end is None:
            if run.worker in killed:
                run.end, run.how = killed[run.worker], "killed"
            else:
                run.end, run.how = last_t, "unfinished"
    return sorted(runs.values(), key=lambda run: (run.thread, run.start))


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.1f} ms"


def _check_signals(records: list[Record]) -> tuple[Check, dict[str, Any]]:
    sent = {r["sig"]: r for r in records if r.get("k") == "sent"}
    handled = [r for r in records if r.get("k") == "handled"]
    counts = Counter(r["sig"] for r in handled)
    missing = sorted(s for s in sent if s not in counts)
    duplicates = sum(c - 1 for c in counts.values())
    unconfirmed = sorted(s for s in counts if s not in sent)
    problems = [
        f"signal {s} to {sent[s]['thread']} (sent by {sent[s]['w']}) was never handled"
        for s in missing
    ]
    for r in handled:
        origin = sent.get(r["sig"])
        if origin is not None and origin["thread"] != r["thread"]:
            problems.append(
                f"signal {r['sig']} was sent to {origin['thread']} but handled on {r['thread']}"
            )
    if not sent:
        problems.append("no signal was sent: nothing to judge")
    summary = (
        f"{len(sent)} sent, {len(sent) - len(missing)} handled, {len(missing)} missing, "
        f"{duplicates} handled twice (allowed: at-least-once after a crash)"
    )
    if unconfirmed:
        summary += f", {len(unconfirmed)} handled whose sender died before confirming"
    figures = {
        "sent": len(sent),
        "handled": len(sent) - len(missing),
        "missing": len(missing),
        "duplicates": duplicates,
        "unconfirmed": len(unconfirmed),
    }
    return Check("every signal handled", not problems, summary, problems), figures


def _by_thread(runs: list[Run]) -> dict[str, list[Run]]:
    threads: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        threads[run.thread].append(run)
    return dict(sorted(threads.items()))


def _check_exclusive(records: list[Record], runs: list[Run]) -> tuple[Check, dict[str, Any]]:
    problems: list[str] = []
    threads = _by_thread(runs)
    closest: int | None = None
    for thread, rs in threads.items():
        windows: list[Window[Run]] = []
        for run in rs:
            assert run.end is not None  # runs_of closes every run
            # Every run is an owner of its own: two runs of one worker must not overlap either.
            windows.append(Window(run.start, run.end, (run.worker, run.run_id), run))
        for h in handoffs(windows):
            before, after = h.before.item, h.after.item
            gap = int(h.gap)
            if gap < 0:
                problems.append(
                    f"{thread}: run {after.run_id} of {after.worker} (token {after.token}) "
                    f"started {_ms(-gap)} before run {before.run_id} of {before.worker} "
                    f"(token {before.token}) ended ({before.how})"
                )
            elif before.worker != after.worker and (closest is None or gap < closest):
                closest = gap
    index = {(r.worker, r.run_id): r for r in runs}
    for r in records:
        if r.get("k") != "handled":
            continue
        owner = index.get((r["w"], r["run_id"]))
        if owner is None:
            problems.append(
                f"signal {r['sig']} was handled by unknown run {r['run_id']} of {r['w']}"
            )
            continue
        assert owner.end is not None
        if int(r["start"]) < owner.start or int(r["end"]) > owner.end:
            problems.append(
                f"signal {r['sig']} was handled outside the lifetime of run {owner.run_id} "
                f"of {owner.worker}"
            )
    summary = f"{len(runs)} runs on {len(threads)} threads, {len(problems)} overlaps"
    if closest is not None:
        summary += f"; closest hand-off between processes: {_ms(closest)}"
    return Check("one owner at a time", not problems and bool(runs), summary, problems), {
        "runs": len(runs),
        "closest_handoff_ns": closest,
    }


def _check_tokens(runs: list[Run]) -> Check:
    problems: list[str] = []
    threads = _by_thread(runs)
    for thread, rs in threads.items():
        sightings: list[Sighting[Run]] = []
        for run in rs:
            if not isinstance(run.token, int):
                problems.append(f"{thread}: run {run.run_id} of {run.worker} has no fencing token")
                continue
            # A run learns its token when it starts: a point in time.
            owner = (run.worker, run.run_id)
            sightings.append(Sighting(run.start, run.start, owner, run.token, run))
        for clash in token_clashes(sightings):
            a, b = clash.earlier.item, clash.later.item
            problems.append(
                f"{thread}: token went from {a.token} (run {a.run_id} of {a.worker}) "
                f"to {b.token} (run {b.run_id} of {b.worker})"
            )
    summary = f"checked {len(runs)} runs on {len(threads)} threads, {len(problems)} out of order"
    return Check("tokens increasing", not problems and bool(runs), summary, problems)


def count_takeovers(records: Iterable[Record]) -> int:
    """Sessions that began on a thread whose previous owner never released it.

    That is, the previous owner was killed or lost its lease, and the new owner
    got the lease only once it expired. (The runtime's own ``takeover`` event
    also covers a watcher adopting a thread that was released normally.)
    """
    holder: dict[str, str | None] = {}
    count = 0
    for r in sorted(records, key=lambda r: int(r.get("t", 0))):
        if r.get("k") != "event":
            continue
        thread, ev, w = r["thread"], r.get("ev"), r["w"]
        if ev in ("wake", "takeover"):
            if holder.get(thread) not in (None, w):
                count += 1
            holder[thread] = w
        elif ev in ("release", "lost") and holder.get(thread) == w:
            holder[thread] = None
    return count


def judge(records: Iterable[Record]) -> Verdict:
    """Judge a demo from its evidence: each check passes only on positive evidence.

    (1) every signal whose send returned was handled (at least once, on the
    thread it was sent to); (2) the runs of a thread never overlap in time and
    every handled signal lies inside its run; (3) per thread, fencing tokens
    strictly increase from run to run. Empty evidence fails.
    """
    records = list(records)
    runs = runs_of(records)
    signals, figures = _check_signals(records)
    exclusive, more = _check_exclusive(records, runs)
    figures.update(more)
    events = Counter(r["ev"] for r in records if r.get("k") == "event")
    figures.update(
        {
            "handovers": events["handover"],
            "takeovers": count_takeovers(records),
            "routed": sum(
                1 for r in records if r.get("k") == "sent" and r.get("outcome") == "deliver"
            ),
            "lost": events["lost"],
            "killed": sorted(r["victim"] for r in records if r.get("k") == "killed"),
        }
    )
    return Verdict([signals, exclusive, _check_tokens(runs)], figures)
