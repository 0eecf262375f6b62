"""The checkers on hand-made histories: good ones pass, planted bugs are caught."""

from __future__ import annotations

from pathlib import Path

from safety.checker import (
    CheckConfig,
    check_all,
    check_counter,
    check_exclusivity,
    check_linearizable,
    check_no_resurrection,
    check_tokens,
)
from safety.history import HistoryWriter, Op, load_dir
from safety.threads.checker import stale_outputs
from safety.threads.evidence import OutputSeen

from .helpers import MS, denied, granted, mk

CFG = CheckConfig()


def props(ops: list[Op]) -> set[str]:
    return {v.prop for v in check_all(ops, CFG).violations}


def test_sequential_handover_passes() -> None:
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=1, ttl_ms=100),
        mk("b", "acquire", 2, 3, denied("a"), ttl_ms=100),
        mk("a", "renew", 30, 31, True, ttl_ms=100),
        mk("a", "release", 40, 41),
        mk("b", "acquire", 42, 43, granted("b"), token=2, ttl_ms=100),
        mk("c", "get", 44, 45, {"owner": "b"}, token=2),
        mk("b", "transfer", 50, 51, True, from_owner="b", to_owner="b.1", ttl_ms=100),
        mk("b", "acquire", 52, 53, granted("b.1"), token=3, owner="b.1", ttl_ms=100),
        # b.1 walks away; after the TTL c takes over.
        mk("c", "acquire", 200, 201, granted("c"), token=4, ttl_ms=100),
        mk("b", "renew", 210, 211, False, owner="b.1", ttl_ms=100),
    ]
    report = check_all(ops, CFG)
    assert report.violations == []
    assert [k.status for k in report.keys] == ["PASS"]


def test_concurrent_race_one_winner_passes() -> None:
    # Both invoked together; either order of linearization must be found.
    ops = [
        mk("a", "acquire", 0, 10, denied("b"), ttl_ms=100),
        mk("b", "acquire", 1, 9, granted("b"), token=7, ttl_ms=100),
    ]
    assert check_linearizable("k", ops, CFG).status == "PASS"


def test_double_grant_is_caught() -> None:
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=1, ttl_ms=1000),
        mk("b", "acquire", 10, 11, granted("b"), token=2, ttl_ms=1000),
    ]
    assert {"P1", "P2"} <= props(ops)


def test_token_going_back_is_caught() -> None:
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=5, ttl_ms=100),
        mk("a", "release", 2, 3),
        mk("b", "acquire", 10, 11, granted("b"), token=4, ttl_ms=100),
    ]
    assert check_tokens("k", ops)
    assert {"P2", "P3"} <= props(ops)


def test_same_token_twice_is_caught() -> None:
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=5, ttl_ms=100),
        mk("a", "release", 2, 3),
        mk("b", "acquire", 10, 11, granted("b"), token=5, ttl_ms=100),
    ]
    assert "P3" in props(ops)


def test_renew_after_expiry_is_caught() -> None:
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=1, ttl_ms=100),
        mk("a", "renew", 500, 501, True, ttl_ms=100),
    ]
    assert check_no_resurrection("k", ops, CFG)
    assert {"P2", "P5"} <= props(ops)


def test_renew_just_before_expiry_is_fine() -> None:
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=1, ttl_ms=100),
        mk("a", "renew", 95, 96, True, ttl_ms=100),
        mk("a", "renew", 190, 191, True, ttl_ms=100),
    ]
    assert props(ops) == set()


def test_release_by_non_owner_deleting_is_caught() -> None:
    # Plain-delete release: a stale owner frees b's lease, c walks in.
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=1, ttl_ms=100),
        mk("b", "acquire", 150, 151, granted("b"), token=2, ttl_ms=1000),
        mk("a", "release", 160, 161),
        mk("c", "acquire", 170, 171, granted("c"), token=3, ttl_ms=1000),
    ]
    assert {"P1", "P2"} <= props(ops)


def test_renew_of_someone_elses_lease_is_caught() -> None:
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=1, ttl_ms=1000),
        mk("b", "renew", 10, 11, True, ttl_ms=1000),
    ]
    assert {"P1", "P2"} <= props(ops)


def test_denied_naming_wrong_holder_is_caught() -> None:
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=1, ttl_ms=1000),
        mk("b", "acquire", 10, 11, denied("z"), ttl_ms=1000),
    ]
    assert check_linearizable("k", ops, CFG).status == "FAIL"


def test_get_none_while_certainly_held_is_caught() -> None:
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=1, ttl_ms=1000),
        mk("b", "get", 10, 11, None),
    ]
    assert check_linearizable("k", ops, CFG).status == "FAIL"


def test_ambiguous_acquire_may_or_may_not_have_happened() -> None:
    happened = [
        mk("a", "acquire", 0, None, ttl_ms=1000),
        mk("b", "acquire", 10, 11, denied("a"), ttl_ms=1000),
    ]
    never = [
        mk("a", "acquire", 0, None, ttl_ms=1000),
        mk("b", "acquire", 10, 11, granted("b"), token=3, ttl_ms=1000),
    ]
    assert check_linearizable("k", happened, CFG).status == "PASS"
    assert check_linearizable("k", never, CFG).status == "PASS"


def test_ambiguous_grant_raises_the_token_floor() -> None:
    # a's lost acquire took effect (b was denied naming a), so a token was used:
    # a later grant reusing the last seen token is impossible.
    ops = [
        mk("c", "acquire", 0, 1, granted("c"), token=1, ttl_ms=50),
        mk("c", "release", 2, 3),
        mk("a", "acquire", 4, None, ttl_ms=50),
        mk("b", "acquire", 10, 11, denied("a"), ttl_ms=50),
        mk("b", "acquire", 300, 301, granted("b"), token=2, ttl_ms=50),
    ]
    assert check_linearizable("k", ops, CFG).status == "FAIL"
    ops[-1] = mk("b", "acquire", 300, 301, granted("b"), token=3, ttl_ms=50)
    assert check_linearizable("k", ops, CFG).status == "PASS"


def test_clock_slack_is_tolerated_both_ways() -> None:
    # Taken over 0.5% early (inside rho = 1%): allowed.
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=1, ttl_ms=1000),
        mk("b", "acquire", 996, 997, granted("b"), token=2, ttl_ms=1000),
    ]
    assert props(ops) == set()
    # 5% early: a violation.
    ops[1] = mk("b", "acquire", 950, 951, granted("b"), token=2, ttl_ms=1000)
    assert {"P1", "P2"} <= props(ops)


def test_minimal_failing_history_is_short_and_names_the_culprits() -> None:
    ops = []
    t = 0.0
    for i in range(1, 200):
        who = f"p{i % 5}"
        ops.append(mk(who, "acquire", t, t + 1, granted(who), token=i, ttl_ms=100))
        ops.append(mk(who, "release", t + 2, t + 3))
        t += 5
    ops.append(mk("x", "acquire", t, t + 1, granted("x"), token=1000, ttl_ms=100))
    ops.append(mk("y", "acquire", t + 5, t + 6, granted("y"), token=1001, ttl_ms=100))
    result = check_linearizable("k", ops, CFG)
    assert result.status == "FAIL"
    assert len(result.witness) <= 16
    assert result.witness[-1].process == "y"
    assert any(o.process == "x" for o in result.witness)


def test_budget_exhaustion_is_unknown_not_pass() -> None:
    ops = [mk(f"p{i}", "acquire", 0, 100, denied("p0"), ttl_ms=1000) for i in range(1, 8)]
    ops.append(mk("p0", "acquire", 0, 100, granted("p0"), token=1, ttl_ms=1000))
    tiny = CheckConfig(budget=3)
    assert check_linearizable("k", ops, tiny).status == "UNKNOWN"
    assert check_linearizable("k", ops, CFG).status == "PASS"
    report = check_all(ops, tiny)
    assert report.unknown == 1 and report.passed == 0


def test_exclusivity_counts_release_as_the_end_of_a_window() -> None:
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=1, ttl_ms=1000),
        mk("a", "release", 10, 11),
        mk("b", "acquire", 12, 13, granted("b"), token=2, ttl_ms=1000),
    ]
    assert check_exclusivity("k", ops, CFG) == []


def test_counter_equality() -> None:
    writes = [mk("a", "write", i, i + 0.5, "accepted", key="counter") for i in range(5)]
    writes.append(mk("a", "write", 9, 9.5, "rejected", key="counter"))
    writes.append(mk("b", "write", 10, None, key="counter"))
    res, v = check_counter(writes, 5)
    assert res.ok and v == [] and res.acknowledged == 5 and res.unknown == 1
    assert check_counter(writes, 6)[0].ok
    res, v = check_counter(writes, 3)
    assert not res.ok and v[0].prop == "P4"


def test_history_files_round_trip_and_cut_lines(tmp_path: Path) -> None:
    w = HistoryWriter(tmp_path / "a.jsonl", "a")
    w.event("k", "acquire", "invoke", 0, args={"owner": "a", "ttl_ms": 100})
    w.event("k", "acquire", "ok", 1_000_000, result=granted("a"), token=1)
    w.event("k", "release", "invoke", 2_000_000, args={"owner": "a"})
    w.close()
    with (tmp_path / "a.jsonl").open("a") as f:
        f.write('{"process": "a", "ke')  # a writer killed mid-line
    ops = load_dir(tmp_path)
    assert [(o.op, o.type) for o in ops] == [("acquire", "ok"), ("release", "info")]


def test_info_horizon_bounds_when_a_lost_call_can_take_effect() -> None:
    # b is denied naming a long after a's lost acquire; only a late effect explains it.
    ops = [
        mk("a", "acquire", 0, None, ttl_ms=100),
        mk("c", "acquire", 10, 11, granted("c"), token=1, ttl_ms=100),
        mk("c", "release", 20, 21),
        mk("b", "acquire", 3000, 3001, denied("a"), ttl_ms=100),
    ]
    assert check_linearizable("k", ops, CFG).status == "PASS"
    bounded = CheckConfig(info_horizon_ms=1000)
    assert check_linearizable("k", ops, bounded).status == "FAIL"
    assert check_linearizable("k", ops, CheckConfig(info_horizon_ms=5000)).status == "PASS"


def test_refusal_without_a_holder_is_allowed_even_on_a_free_key() -> None:
    # Redis refuses grants during its quarantine after a restart that lost data.
    ops = [
        mk("a", "acquire", 0, 1, denied(None), ttl_ms=100),
        mk("b", "acquire", 2, 3, granted("b"), token=9, ttl_ms=100),
    ]
    assert props(ops) == set()


def test_state_loss_window_lets_leases_vanish_but_keeps_tokens_rising() -> None:
    ops = [
        mk("a", "acquire", 0, 1, granted("a"), token=5, ttl_ms=1000),
        mk("a", "get", 50, 51, None),
    ]
    assert check_all(ops, CFG).violations
    assert check_all(ops, CFG, state_loss=[(MS * 10, MS * 40)]).violations == []
    # After the loss a new grant must still carry a higher token.
    ops.append(mk("b", "acquire", 60, 61, granted("b"), token=4, ttl_ms=1000))
    props = {v.prop for v in check_all(ops, CFG, state_loss=[(MS * 10, MS * 40)]).violations}
    assert "P2" in props


def test_stale_outputs_finds_a_stale_owners_item_after_its_successors_and_gaps() -> None:
    def seen(position: int, run: str, token: int, thread: str = "t") -> OutputSeen:
        return OutputSeen("app", thread, position, run, token, "token")

    clean = [seen(1, "a", 5), seen(2, "a", 5), seen(3, "b", 7), seen(1, "x", 1, "u")]
    assert stale_outputs(clean) == []
    stale = [seen(1, "a", 5), seen(2, "b", 7), seen(3, "a", 5)]
    assert [line.split(":")[0] for line in stale_outputs(stale)] == ["stale output of app/t"]
    gap = [seen(1, "a", 5), seen(3, "a", 5), seen(3, "a", 5)]
    assert len(stale_outputs(gap)) == 2
