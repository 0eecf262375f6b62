"""The fast checkers agree with brute force on small random histories."""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from safety.checker import (
    INITIAL,
    CheckConfig,
    State,
    _windows,
    check_exclusivity,
    check_linearizable,
    check_tokens,
    step,
)
from safety.history import Op

from .helpers import denied, granted, mk

CFG = CheckConfig()
OWNERS = ["a", "b", "c"]


def brute_linearizable(ops: list[Op]) -> bool:
    """Every subset containing all completed ops, every order, every model outcome."""
    ops = [o for o in ops if o.type != "fail"]
    required = [o for o in ops if o.type == "ok"]
    optional = [o for o in ops if o.type == "info"]
    for r in range(len(optional) + 1):
        for extra in itertools.combinations(optional, r):
            chosen = required + list(extra)
            for order in itertools.permutations(chosen):
                # Real-time order: nothing placed after an op that returned before it began.
                if any(
                    order[j].ret < order[i].inv
                    for i in range(len(order))
                    for j in range(i + 1, len(order))
                ):
                    continue
                states: set[State] = {INITIAL}
                for o in order:
                    states = {s2 for s in states for s2 in step(s, o, CFG)}
                    if not states:
                        break
                if states:
                    return True
    return False


def brute_exclusive(ops: list[Op]) -> bool:
    wins = _windows(ops, CFG)
    return not any(
        a[2] != b[2] and a[0] < b[1] and b[0] < a[1] for a, b in itertools.combinations(wins, 2)
    )


def brute_tokens(ops: list[Op]) -> bool:
    obs = []
    for o in ops:
        if o.type != "ok" or o.token is None:
            continue
        if o.op == "acquire" and o.result.get("acquired"):
            obs.append((o.args["owner"], o.token, o))
        elif o.op == "get" and o.result is not None:
            obs.append((o.result["owner"], o.token, o))
    for (oa, ta, a), (ob, tb, b) in itertools.permutations(obs, 2):
        if ta == tb and oa != ob:
            return False
        if (oa, ta) != (ob, tb) and a.ret < b.inv and ta >= tb:
            # b's identity is only fresh if it was not observed before a finished.
            first_b = min((x for w, t, x in obs if (w, t) == (ob, tb)), key=lambda x: x.inv)
            if a.ret < first_b.inv:
                return False
    return True


def random_history(rnd: random.Random, n_ops: int) -> list[Op]:
    procs = rnd.sample(OWNERS, rnd.randint(2, 3))
    clock = dict.fromkeys(procs, 0.0)
    ops = []
    for _ in range(n_ops):
        p = rnd.choice(procs)
        inv = clock[p] + rnd.choice([0, 5, 30, 60, 120])
        dur = rnd.choice([1, 10, 40])
        info = rnd.random() < 0.12
        ret = None if info else inv + dur
        clock[p] = inv + dur + 1
        kind = rnd.choice(["acquire", "acquire", "acquire", "renew", "release", "transfer", "get"])
        ttl = rnd.choice([50, 100])
        tok = rnd.randint(1, 4)
        other = rnd.choice([o for o in OWNERS if o != p])
        res: Any
        if kind == "acquire":
            res = granted(p) if rnd.random() < 0.6 else denied(other)
            ops.append(
                mk(p, "acquire", inv, ret, res, token=tok if res["acquired"] else None, ttl_ms=ttl)
            )
        elif kind == "renew":
            ops.append(mk(p, "renew", inv, ret, rnd.random() < 0.5, ttl_ms=ttl))
        elif kind == "release":
            ops.append(mk(p, "release", inv, ret, None))
        elif kind == "transfer":
            ops.append(
                mk(
                    p,
                    "transfer",
                    inv,
                    ret,
                    rnd.random() < 0.5,
                    from_owner=p,
                    to_owner=other,
                    ttl_ms=ttl,
                )
            )
        else:
            rec = None if rnd.random() < 0.4 else {"owner": rnd.choice(procs)}
            ops.append(mk(p, "get", inv, ret, rec, token=None if rec is None else tok))
        if clock[p] > 10_000:
            break
    ops.sort(key=lambda o: o.inv)
    # Each process must have one op in flight at a time: drop ops after an info.
    seen_info: set[str] = set()
    kept = []
    for o in ops:
        if o.process in seen_info:
            continue
        if o.type == "info":
            seen_info.add(o.process)
        kept.append(o)
    return kept


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 6))
def test_wgl_agrees_with_brute_force(seed: int, n: int) -> None:
    ops = random_history(random.Random(seed), n)
    expected = brute_linearizable(ops)
    got = check_linearizable("k", ops, CFG).status
    assert got == ("PASS" if expected else "FAIL"), [o.describe() for o in ops]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 8))
def test_direct_checks_agree_with_brute_force(seed: int, n: int) -> None:
    ops = random_history(random.Random(seed), n)
    assert (check_exclusivity("k", ops, CFG) == []) == brute_exclusive(ops)
    assert (check_tokens("k", ops) == []) == brute_tokens(ops)


def test_random_histories_exercise_both_verdicts() -> None:
    # Guards the two tests above against a generator that only makes one kind.
    rnd = random.Random(1)
    verdicts = {brute_linearizable(random_history(rnd, 5)) for _ in range(200)}
    assert verdicts == {True, False}
    rnd = random.Random(2)
    excl = {brute_exclusive(random_history(rnd, 6)) for _ in range(200)}
    assert excl == {True, False}
