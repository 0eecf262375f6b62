"""The thread harness's policy mix: how its checker settles signals without a
write, on hand-made evidence, then real runs where every signal is sent under a
policy of its own (``python -m safety threads --workload policies``).

A signal without a write is lost unless a rule settled it with evidence
(:func:`safety.threads.checker.settlements`); the runs show no loss, no late
interrupt and no wrong settlement on SQLite, Redis and PostgreSQL with faults,
and a run without faults, where only the runtime's own events can settle a
signal, shows none either (it found the interrupt that dropped a carried
signal, fixed in the same change).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

from safety.threads.checker import check, settlements
from safety.threads.evidence import Fault, Settled, Sink, Stored, Write
from safety.threads.runner import ThreadRunConfig
from tests.safety.helpers import run_and_show

MS = 1_000_000


def sent(sid: str, policy: str, t0: int, t: int, *, outcome: str = "deliver") -> Stored:
    """``sid`` sent under ``policy``: its send began at ``t0`` ms and returned at ``t`` ms."""
    seq = int(sid.removeprefix("s"))
    return Stored(sid, "app", "t", "w", seq, t * MS, outcome, False, policy, t0 * MS)


def wrote(order: int, sid: str, t: int) -> Write:
    return Write(order, "app", "t", 1, "r1", sid, "w1", t * MS)


def event(kind: str, sid: str, t: int, detail: str | None = None) -> Settled:
    return Settled(kind, "app", "t", sid, "r1", detail, "w1", t * MS)


def fault(t: int) -> Fault:
    return Fault("owner-kill", "w1", t * MS, t * MS)


# -- what settles a signal without a write ------------------------------------------


def test_a_signal_without_a_write_or_a_rule_that_settled_it_is_lost() -> None:
    stored = [sent("s1", "enqueue", 0, 1), sent("s2", "coalesce", 2, 3)]
    found = settlements(stored, [wrote(1, "s2", 5)], [])
    assert found.lost == [stored[0]] and not found.counts


def test_a_rejected_send_owes_nothing() -> None:
    found = settlements([sent("s1", "reject", 0, 1, outcome="rejected")], [], [])
    assert not found.lost and not found.counts


def test_a_discard_is_settled_by_its_event_and_only_a_discard() -> None:
    stored = [sent("s1", "discard", 0, 1), sent("s2", "enqueue", 2, 3)]
    settled = [event("discarded", "s1", 4), event("discarded", "s2", 4)]
    found = settlements(stored, [], settled)
    assert found.counts == {"discarded": 1}
    assert found.lost == [stored[1]]  # an enqueue signal cannot be discarded
    assert found.wrong == ["wrong settlement: s2 (enqueue) to app/t was discarded"]
    # Without its event, a discard signal is owed a run like any other.
    assert settlements(stored[:1], [], []).lost == stored[:1]


def test_an_interrupt_settles_the_signals_sent_before_it_never_one_sent_after() -> None:
    stored = [
        sent("s1", "enqueue", 0, 1),
        sent("s2", "interrupt", 2, 5),
        sent("s3", "enqueue", 6, 7),  # began after the interrupt's send returned
    ]
    settled = [
        event("interrupted", "s2", 8, "1 waiting signal(s) skipped"),  # the request's own
        event("interrupted", "s1", 8, "skipped"),
        event("interrupted", "s3", 8, "cancelled with its run"),
    ]
    found = settlements(stored, [wrote(1, "s2", 9)], settled)
    assert found.counts == {"skipped by an interrupt": 2}
    assert found.wrong == [
        "late interrupt: s3 (enqueue) to app/t was skipped, sent after every interrupt "
        "of its thread returned"
    ]
    # The request's own event settles nothing: the interrupting signal is owed.
    assert settlements(stored[1:2], [], settled).lost == stored[1:2]


def test_a_skipped_signal_run_later_by_the_next_owner_is_counted_not_reordered() -> None:
    # The skip's acknowledgement was lost with its owner: the next owner ran the
    # skipped signal, after the interrupting one had run.
    stored = [sent("s1", "enqueue", 0, 1), sent("s2", "interrupt", 2, 3)]
    settled = [event("interrupted", "s1", 4, "skipped")]
    writes = [wrote(1, "s2", 5), wrote(2, "s1", 9), wrote(3, "s2", 9)]
    report = check(stored, writes, [fault(6)], settled=settled)
    assert report.violations == 0
    assert report.settled == {"settled unrun, then run by the next owner (its ack lost)": 1}
    # A discard lost so is counted the same.
    discarded = [event("discarded", "s1", 4)]
    as_discard = [sent("s1", "discard", 0, 1), stored[1]]
    assert check(as_discard, writes, [fault(6)], settled=discarded).violations == 0
    # Without the skip's event the same writes are out of order.
    assert check(stored, writes, [fault(6)], settled=[]).counts()["order"] == 1
    # Without a fault between, nothing could lose the skip: settled and run.
    alone = check(stored, writes, [fault(10)], settled=settled)
    assert alone.counts()["wrong settlements"] == 1
    assert "settled and run: s1" in alone.wrong_settlements[0]
    # Written first, skipped later: a copy delivered again was skipped; nothing to say.
    ran_first = [wrote(1, "s1", 3), wrote(2, "s2", 5)]
    assert check(stored, ran_first, settled=settled).violations == 0


def test_an_interrupt_skipped_with_no_other_interrupt_after_it_is_a_late_interrupt() -> None:
    # Its own send does not count as the interrupt that skipped it.
    alone = [sent("s1", "interrupt", 0, 3)]
    found = settlements(alone, [], [event("interrupted", "s1", 4, "skipped")])
    assert found.wrong and found.wrong[0].startswith("late interrupt: s1")
    # Nor does a carrying signal carry itself: unwritten, with a fault, it is lost.
    carrier = [sent("s1", "coalesce", 0, 3)]
    assert settlements(carrier, [], [], [fault(5)]).lost == carrier


def test_a_coalesced_signal_is_settled_with_the_signal_it_went_into() -> None:
    stored = [sent("s1", "enqueue", 0, 1), sent("s2", "coalesce", 2, 3)]
    into = [event("coalesced", "s1", 4, "into s2")]
    # s2's run took s1 with it and wrote both: nothing to settle.
    assert not settlements(stored, [wrote(1, "s1", 5), wrote(2, "s2", 5)], into).lost
    # s2 settled by an interrupt: s1 went with it.
    cancelled = [*into, event("interrupted", "s2", 5, "cancelled with its run")]
    found = settlements(stored, [], cancelled)
    assert found.counts == {
        "coalesced into a signal an interrupt settled": 1,
        "skipped by an interrupt": 1,
    }
    assert not found.lost
    # s2 ran again without it after its first run was killed (a fault between).
    again = settlements(stored, [wrote(1, "s2", 9)], into, [fault(6)])
    assert again.counts == {"coalesced into a run a fault ended": 1} and not again.lost
    # With no fault in between, a coalesced signal its carrier's run never got is lost.
    assert settlements(stored, [wrote(1, "s2", 9)], into, [fault(10)]).lost == stored[:1]


def test_a_persisted_signal_is_owed_once_a_waking_one_was_sent_after_it() -> None:
    persisted = sent("s1", "persist", 0, 1, outcome="persisted")
    found = settlements([persisted], [], [])
    assert found.counts == {"persisted, never woken": 1} and not found.lost
    woken = [persisted, sent("s2", "enqueue", 2, 3)]
    assert settlements(woken, [wrote(1, "s2", 4)], []).lost == [persisted]


def test_a_carried_signal_is_excused_only_by_a_fault_before_its_carrier_ran() -> None:
    stored = [sent("s1", "enqueue", 0, 1), sent("s2", "debounce", 2, 3)]
    writes = [wrote(1, "s2", 10)]
    found = settlements(stored, writes, [], [fault(5)])
    assert found.counts == {"carried, its owner ended by a fault before the run": 1}
    assert settlements(stored, writes, [], [fault(11)]).lost == stored[:1]
    assert settlements(stored, writes, []).lost == stored[:1]


def test_check_reports_settlements_and_counts_wrong_ones_as_violations() -> None:
    stored = [sent("s1", "enqueue", 0, 1), sent("s2", "discard", 2, 3)]
    report = check(stored, [wrote(1, "s2", 4)], settled=[event("discarded", "s1", 4)])
    assert report.counts()["wrong settlements"] == 1
    assert report.counts()["lost"] == 1
    assert report.violations == 2
    assert report.settled_line() == "settlements: none; "
    # Without settlement evidence (other workloads), the plain rule: written or lost.
    assert check(stored, [wrote(1, "s2", 4)]).settled is None


# -- the sink, cancelled ---------------------------------------------------------------


class HeldRun:
    thread_key = "t"
    run_id = "r1"
    token: int | None = 1

    def ensure_held(self) -> None:
        pass


@pytest.mark.asyncio
async def test_a_write_cancelled_twice_while_it_waits_for_the_sink_keeps_no_lock(
    tmp_path: Path,
) -> None:
    # Found by the policy mix on Redis: a handler cancelled by an interrupt while
    # its write waited for the sink's lock, then again by its lost lease, ended
    # the wait for the lock's hand-back; the lock stayed taken and every worker's
    # writes stalled (192 signals "lost" in a 15 s run).
    path = tmp_path / "sink.db"
    Sink.create(path)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    other.execute("BEGIN IMMEDIATE")  # the sink's BEGIN waits behind it
    sink = Sink(path, "w1")
    try:
        write = asyncio.ensure_future(sink.write(HeldRun(), "app", "s1", 1))
        await asyncio.sleep(0.1)
        write.cancel()
        await asyncio.sleep(0)
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        other.execute("ROLLBACK")  # now the sink's BEGIN gets the lock, and gives it back
        deadline = time.monotonic() + 10
        while True:
            try:
                other.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError:  # database is locked
                assert time.monotonic() < deadline, "the cancelled write kept the sink's lock"
                await asyncio.sleep(0.05)
        other.execute("ROLLBACK")
        await sink.write(HeldRun(), "app", "s2", 1)  # and the sink writes on
        rows = other.execute("SELECT signal_id FROM writes").fetchall()
        assert rows == [("s2",)]
    finally:
        sink.close()
        other.close()


# -- real runs -------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["sqlite", "redis", "postgres"])
def test_a_short_policy_mix_with_faults_loses_nothing(backend: str, tmp_path: Path) -> None:
    rc = ThreadRunConfig(
        backend=backend, duration_s=15.0, seed=3, workdir=str(tmp_path), workload="policies"
    )
    res = run_and_show(rc)
    assert res.violations == 0, "\n".join(res.report.describe())
    assert res.drained_s is not None, "stored signals neither written nor settled after healing"
    assert res.report.signals >= 300
    settled = res.report.settled or Counter[str]()
    # The rules did settle signals: the mix reached them.
    assert settled["discarded"] >= 1 and settled["skipped by an interrupt"] >= 1, settled
    assert sum(n for k, n in res.faults.items() if "not injected" not in k) >= 5, res.faults


@pytest.mark.timeout(180)
def test_a_policy_mix_without_faults_settles_nothing_silently(tmp_path: Path) -> None:
    # No fault: only the runtime's own events settle a signal without a write.
    # Seed 4 lost three signals before the fix of the interrupt that skipped a
    # coalescing signal other signals were carried into.
    rc = ThreadRunConfig(
        backend="sqlite",
        duration_s=15.0,
        seed=4,
        workdir=str(tmp_path),
        workload="policies",
        faults=False,
    )
    res = run_and_show(rc)
    assert res.violations == 0, "\n".join(res.report.describe())
    assert res.drained_s is not None
    assert res.report.signals >= 300
