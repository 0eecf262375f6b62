"""The thread runtime's harness: its checkers on hand-made evidence, then real runs.

The checker tests feed :mod:`safety.threads.checker` small histories that must
be caught and clean ones that must pass. The runs start real worker processes
on SQLite, on a private Redis and on a private PostgreSQL (``redis-server`` and
PostgreSQL's binaries must be installed; they fail, never skip, when missing):
a short run with faults per backend must show no violation, and each negative
control must be caught. The soak is ``python -m safety threads --duration ...``
(SAFETY.md).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from safety.threads.checker import (
    LOOP_BOUND,
    answers,
    check,
    checkpoint_writes,
    duplicates,
    forks,
    interleaved,
    lost_signals,
    misrouted,
    order_violations,
    overlaps,
    percentile,
    takeover_delays,
)
from safety.threads.controls import CONTROLS
from safety.threads.evidence import Checkpoint, Fault, FinalState, Stored, Write
from safety.threads.runner import ThreadRunConfig, control_config
from tests.safety.helpers import run_and_show

MS = 1_000_000


def sent(
    sid: str, seq: int, *, thread: str = "t", sender: str = "s", ns: str = "app", t: int = 0
) -> Stored:
    return Stored(sid, ns, thread, sender, seq, t * MS)


def wrote(
    order: int,
    sid: str,
    token: int | None,
    *,
    run: str = "",
    thread: str = "t",
    ns: str = "app",
    worker: str = "w",
    t: int | None = None,
) -> Write:
    return Write(
        order,
        ns,
        thread,
        token,
        run or f"r{token}",
        sid,
        worker,
        (order if t is None else t) * MS,
    )


# -- lost ------------------------------------------------------------------------


def test_a_stored_signal_without_a_write_is_lost() -> None:
    stored = [sent("a", 1), sent("b", 2)]
    assert lost_signals(stored, [wrote(1, "a", 1)]) == [stored[1]]


def test_every_stored_signal_written_is_not_lost() -> None:
    # Writes of signals nobody was told are stored (an unknown outcome) are fine.
    stored = [sent("a", 1), sent("b", 2)]
    writes = [wrote(1, "b", 1), wrote(2, "a", 1), wrote(3, "x", 1)]
    assert lost_signals(stored, writes) == []


# -- overlaps --------------------------------------------------------------------


def test_a_write_from_a_lower_token_after_a_higher_one_is_an_overlap() -> None:
    writes = [wrote(1, "a", 5), wrote(2, "b", 6), wrote(3, "c", 5)]
    found = overlaps(writes)
    assert [(o.newer.order, o.stale.order, o.shared) for o in found] == [(2, 3, False)]
    assert "wrote after" in found[0].describe()


def test_overlaps_are_judged_in_commit_order_and_per_thread() -> None:
    # Out of order in the list, in order by commit; another thread's tokens are its own.
    writes = [wrote(3, "c", 7), wrote(1, "a", 5), wrote(2, "b", 2, thread="u")]
    assert overlaps(writes) == []
    assert overlaps([wrote(1, "a", 5), wrote(2, "b", 3, ns="app:v2")]) == []


def test_rising_tokens_and_a_run_writing_many_times_pass() -> None:
    writes = [wrote(1, "a", 1), wrote(2, "b", 1), wrote(3, "c", 2), wrote(4, "d", 2)]
    assert overlaps(writes) == []


def test_two_runs_writing_one_token_is_an_overlap() -> None:
    writes = [wrote(1, "a", 4, run="r1"), wrote(2, "b", 4, run="r2")]
    found = overlaps(writes)
    assert len(found) == 1 and found[0].shared
    assert "shares token" in found[0].describe()


def test_writes_without_a_token_are_not_judged_as_overlaps() -> None:
    assert overlaps([wrote(1, "a", 5), wrote(2, "b", None)]) == []
    assert check([sent("a", 1)], [wrote(1, "a", None)]).untokened == 1


# -- interleaved -----------------------------------------------------------------


def test_a_run_writing_again_after_another_runs_write_is_interleaved() -> None:
    writes = [wrote(1, "a", 5), wrote(2, "b", 6), wrote(3, "c", 5), wrote(4, "d", 6)]
    found = interleaved(writes)
    assert [(i.other.order, i.again.order) for i in found] == [(2, 3), (3, 4)]
    assert "interleaved on app/t: run r5" in found[0].describe()


def test_contiguous_runs_per_thread_are_not_interleaved() -> None:
    writes = [
        wrote(1, "a", 5),
        wrote(2, "x", 9, thread="u"),
        wrote(3, "b", 5),
        wrote(4, "c", 6),
        wrote(5, "y", 3, thread="u"),  # another thread: its runs are its own
        wrote(6, "d", 6),
    ]
    assert interleaved(writes) == []


# -- checkpoint histories (the LangGraph workload) --------------------------------


def cp(n: int, sid: str, token: int | None, run: str = "", parent: int | None = -1) -> Checkpoint:
    """The ``n``-th checkpoint of thread app/t; its parent the one before (``-1``)."""
    up = n - 1 if parent == -1 else parent
    return Checkpoint(
        "app", "t", f"c{n:03}", None if not up else f"c{up:03}", token, sid, run or f"r{token}", "w"
    )


def final(asked: dict[str, int], answered: dict[str, int]) -> list[FinalState]:
    return [FinalState("app", "t", asked, answered)]


def test_a_clean_checkpoint_history_passes() -> None:
    history = [cp(1, "a", 1), cp(2, "a", 1), cp(3, "b", 2), cp(4, "b", 2)]
    report = check(
        [sent("a", 1), sent("b", 2)],
        [wrote(1, "a", 1), wrote(2, "b", 2)],
        checkpoints=history,
        states=final({"a": 1, "b": 1}, {"a": 1, "b": 1}),
    )
    assert report.violations == 0, report.describe()
    assert report.checkpoints == 4 and report.forks == 0
    assert report.counts()["not answered once"] == 0


def test_a_token_going_back_in_a_checkpoint_history_is_caught() -> None:
    # A stale run's checkpoint after its successor's: backwards, and interleaved.
    history = [cp(1, "a", 1), cp(2, "b", 2), cp(3, "a", 1)]
    report = check(
        [sent("a", 1), sent("b", 2)],
        [wrote(1, "a", 1), wrote(2, "b", 2)],
        checkpoints=history,
        states=final({"a": 1, "b": 1}, {"a": 1, "b": 1}),
    )
    assert report.counts()["checkpoint overlaps"] == 1
    assert report.counts()["interleaved"] == 1
    assert report.violations == 2
    assert report.describe()[0].startswith("interleaved on app/t: run r1")
    assert report.describe()[1].startswith("checkpoint overlap on app/t: run r1 (token 1")


def test_two_runs_interleaved_in_a_checkpoint_history_are_caught() -> None:
    # One token, two runs taking turns: no token goes back, the runs interleave
    # (and share the token).
    history = [cp(1, "a", 3, "x"), cp(2, "a", 3, "y"), cp(3, "a", 3, "x")]
    report = check([sent("a", 1)], [wrote(1, "a", 3)], checkpoints=history)
    assert len(report.interleaved) == 1
    assert all(o.shared for o in report.history_overlaps) and report.history_overlaps


def test_checkpoint_writes_keep_the_history_order() -> None:
    writes = checkpoint_writes([cp(1, "a", 1), cp(2, "b", 2)])
    assert [(w.order, w.signal_id, w.token, w.run_id) for w in writes] == [
        (1, "a", 1, "r1"),
        (2, "b", 2, "r2"),
    ]


def test_a_stale_checkpoint_stored_after_a_newer_owners_is_caught() -> None:
    """The SQLite fork of the LangGraph soak: by checkpoint id the history reads
    tokens 5, 5, 9, 9, but the saver committed the stale run's second checkpoint
    (token 5) after the successor's two. Only the commit order shows it."""
    history = [cp(1, "a", 5), cp(2, "a", 5), cp(3, "b", 9, parent=1), cp(4, "b", 9)]
    stored = [replace(c, stored=n) for c, n in zip(history, (1, 4, 2, 3), strict=True)]
    report = check([sent("a", 1), sent("b", 2)], [], checkpoints=stored)
    assert [(o.newer.token, o.stale.token) for o in report.stored_overlaps] == [(9, 5)]
    assert report.counts()["checkpoints stored backwards"] == 1
    assert report.violations >= 1
    assert report.history_overlaps == []  # the history order alone misses it
    # A saver without a commit order (PostgreSQL) is judged on its history only.
    assert check([sent("a", 1), sent("b", 2)], [], checkpoints=history).stored_overlaps == []
    in_order = [replace(c, stored=n) for n, c in enumerate(history, 1)]
    assert check([sent("a", 1), sent("b", 2)], [], checkpoints=in_order).stored_overlaps == []


def test_a_checkpoint_off_the_previous_one_is_a_fork() -> None:
    # c3 was written on c1: c2 (a stale run's, landed before c3) is off the chain.
    assert forks([cp(1, "a", 1), cp(2, "a", 1), cp(3, "a", 2, parent=1)]) == 1
    assert forks([cp(1, "a", 1), cp(2, "a", 1)]) == 0


def test_a_message_not_answered_exactly_once_is_caught() -> None:
    stored = [sent("a", 1), sent("b", 2), sent("c", 3)]
    found = answers(
        stored, final({"a": 2, "b": 1, "x": 2}, {"a": 2, "b": 0, "x": 1})
    )  # c: never applied
    assert found == [
        "answers on app/t: a applied 2 and answered 2 times in the final state",
        "answers on app/t: b applied 1 and answered 0 times in the final state",
        "answers on app/t: c applied 0 and answered 0 times in the final state",
        "answers on app/t: x applied 2 and answered 1 times in the final state "
        "(its send did not return)",
    ]
    assert answers(stored, final({"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 1, "c": 1})) == []
    # A thread whose state is missing answers nothing.
    assert len(answers(stored, [FinalState("app", "u", {}, {})])) == 3


# -- order -----------------------------------------------------------------------


def test_a_signal_first_written_before_an_earlier_one_breaks_order() -> None:
    stored = [sent("a", 1), sent("b", 2), sent("c", 3)]
    writes = [wrote(1, "b", 1), wrote(2, "c", 1), wrote(3, "a", 2)]
    found = order_violations(stored, writes)
    assert [(r.earlier.signal_id, r.later.signal_id) for r in found] == [("a", "b"), ("a", "c")]
    assert "seq 2" in found[0].describe()


def test_order_is_per_sender_and_thread_and_uses_first_writes() -> None:
    stored = [
        sent("a", 1),
        sent("b", 2),
        sent("x", 1, sender="other"),  # another sender: no order with a, b
        sent("y", 1, thread="u"),
    ]
    writes = [
        wrote(1, "x", 1),
        wrote(2, "a", 1),
        wrote(3, "y", 1, thread="u"),
        wrote(4, "b", 1),
        wrote(5, "a", 2),  # a duplicate of a, after b: only first writes count
    ]
    assert order_violations(stored, writes) == []


def test_a_lost_signal_is_not_an_order_violation() -> None:
    stored = [sent("a", 1), sent("b", 2)]
    assert order_violations(stored, [wrote(1, "b", 1)]) == []


# -- misrouted, duplicates ----------------------------------------------------------


def test_a_signal_handled_by_another_namespaces_thread_is_misrouted() -> None:
    stored = [sent("a", 1, ns="app", thread="v2:42"), sent("b", 1, ns="app:v2", thread="42")]
    writes = [
        wrote(1, "a", 1, ns="app:v2", thread="42"),
        wrote(2, "b", 1, ns="app:v2", thread="42"),
    ]
    assert [(s.signal_id, w.order) for s, w in misrouted(stored, writes)] == [("a", 1)]


def test_duplicates_are_counted() -> None:
    writes = [wrote(1, "a", 1), wrote(2, "a", 2), wrote(3, "b", 2), wrote(4, "a", 3)]
    assert duplicates(writes) == {"a": 3}
    report = check([sent("a", 1), sent("b", 2)], writes)
    assert report.violations == 0 and report.duplicates == {"a": 3}


# -- the takeover bound --------------------------------------------------------------


def test_takeover_delay_runs_from_the_kill_to_the_next_write_of_a_waiting_thread() -> None:
    stored = [sent("a", 1, t=10), sent("b", 2, t=95), sent("c", 1, thread="u", t=20)]
    writes = [
        wrote(1, "a", 1, worker="w1", t=50),
        wrote(2, "c", 1, thread="u", worker="w1", t=60),
        wrote(3, "b", 2, worker="w2", t=1100),
        wrote(4, "z", 1, thread="u", worker="w2", t=5000),
    ]
    kill = Fault("owner-kill", "w1", 100 * MS, 100 * MS)
    # t waited (b stored before the kill, written after); u had nothing waiting.
    assert takeover_delays(stored, writes, [kill]) == [1000.0]
    # A kill of a worker that did not run the thread measures nothing.
    assert takeover_delays(stored, writes, [Fault("owner-kill", "w9", 100 * MS, 100 * MS)]) == []


def test_a_takeover_another_fault_overlapped_is_left_out_of_the_unhindered_figure() -> None:
    kill = Fault("owner-kill", "w1", 100 * MS, 100 * MS)
    near = Fault("owner-pause", "w2", 500 * MS, 1050 * MS)  # the successor paused
    far = Fault("owner-kill", "w3", 2000 * MS, 2000 * MS)
    stored = [sent("a", 1, t=10), sent("b", 2, t=95)]
    writes = [wrote(1, "a", 1, worker="w1", t=50), wrote(2, "b", 2, worker="w2", t=1100)]
    assert takeover_delays(stored, writes, [kill], [kill, far]) == [1000.0]
    assert takeover_delays(stored, writes, [kill], [kill, near, far]) == []
    report = check(stored, writes, [kill, near])
    assert report.takeover_ms == [1000.0] and report.takeover_isolated_ms == []


def test_percentile() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 100.0], 99) == 100.0
    assert percentile([], 50) != percentile([], 50)  # NaN


def test_a_clean_history_has_no_violation() -> None:
    stored = [sent("a", 1), sent("b", 2), sent("c", 1, sender="s2")]
    writes = [wrote(1, "a", 1), wrote(2, "c", 1), wrote(3, "b", 2)]
    report = check(stored, writes)
    assert report.violations == 0
    assert report.describe() == []
    assert report.counts() == {
        "lost": 0,
        "overlaps": 0,
        "order": 0,
        "misrouted": 0,
        "looped": 0,
        "interleaved": 0,
    }


def test_a_poison_signal_is_judged_by_its_handings_not_as_lost() -> None:
    poison = Stored("p", "app", "t", "s", 2, 0, poison=True)
    stored = [sent("a", 1), poison, sent("b", 3)]
    writes = [wrote(1, "a", 1), wrote(2, "b", 1)]
    report = check(stored, writes, handed={"p": LOOP_BOUND})
    assert report.violations == 0 and report.poisoned == 1
    looping = check(stored, writes, handed={"p": LOOP_BOUND + 1})
    assert looping.looped == {"p": LOOP_BOUND + 1}
    assert looping.describe() == [f"looped: poison signal p handed {LOOP_BOUND + 1} times"]
    # A loop on it stalls the thread: the signals after it are lost.
    stalled = check(stored, writes[:1], handed={"p": 40})
    assert stalled.counts()["lost"] == 1 and stalled.counts()["looped"] == 1


# -- real runs -------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["sqlite", "redis", "postgres"])
def test_short_run_with_faults_has_no_violation(backend: str, tmp_path: Path) -> None:
    res = run_and_show(
        ThreadRunConfig(backend=backend, duration_s=15.0, seed=11, workdir=str(tmp_path))
    )
    assert res.violations == 0, "\n".join(res.report.describe())
    assert res.drained_s is not None, "stored signals still unwritten after healing"
    # The run must have done something worth checking.
    assert res.report.signals >= 300
    assert res.report.poisoned >= 1  # handler-raised CancelledErrors, never a loop or stall
    assert sum(n for k, n in res.faults.items() if "not injected" not in k) >= 5, res.faults


@pytest.mark.timeout(300)
@pytest.mark.parametrize("control", CONTROLS)
def test_negative_control_is_caught(control: str, tmp_path: Path) -> None:
    backend = "redis" if control == "never-lose" else "sqlite"
    # A control's bug shows only when the faults meet it (a pause during a run):
    # runs with new seeds follow until it is caught, for up to 150 s (one or two
    # on a quiet machine; a loaded one does less work per run).
    started, seed = time.monotonic(), 5
    while True:
        res = run_and_show(
            control_config(backend, control, seed=seed, workdir=str(tmp_path / str(seed)))
        )
        if res.violations or time.monotonic() - started > 150:
            break
        seed += 1
    assert res.violations >= 1, (
        f"control {control} went unnoticed in {seed - 4} runs: {res.figure_line()}"
    )
    expected = {
        # A run that never learns of its loss writes what it holds after its
        # successor (overlaps); a process that keeps its threads' sessions
        # (never handed back) shows as signals lost, and runs show one or both.
        "never-lose": ("overlaps", "lost"),
        "no-reclaim": ("lost",),
        "collide": ("misrouted",),
    }[control]
    assert any(res.report.counts()[kind] >= 1 for kind in expected), res.figure_line()


@pytest.mark.timeout(120)
def test_signals_sent_during_a_fresh_redis_quarantine_are_not_lost(tmp_path: Path) -> None:
    # Found by this harness: the first signals of new threads, sent while a fresh
    # Redis refused grants with no holder, were published before the thread's
    # consumer group existed and never run. No faults: nothing else explains a loss.
    res = run_and_show(
        ThreadRunConfig(
            backend="redis",
            duration_s=4.0,
            seed=3,
            faults=False,
            cold_start=True,
            workdir=str(tmp_path),
        )
    )
    assert res.report.counts()["lost"] == 0, "\n".join(res.report.describe())
