"""Checkers for P1-P5 (``/work/shared/SAFETY.md`` → the project's ``SAFETY.md``).

Two kinds:

- **Direct checks** (P1 exclusivity of safe windows, P3 token monotonicity, P4 fenced
  counter, P5 no resurrection) are sorts and sweeps: O(n log n), any history size.
  P1 and P3 are decided by ``tenure._history``, the checker ``tenure demo``'s
  verdict uses too; this module derives the safe windows and the token sightings.
- **P2 linearizability** per key by a Wing-Gong-Lowe search against a *timed fenced
  mutex* (see :func:`step`), with a budget: PASS, FAIL or UNKNOWN. UNKNOWN is
  reported as such and never counted as a pass.

Time. The backend measures TTLs on its own clock; the history uses the host's
monotonic clock. A lease granted by an operation that ran in ``[inv, ret]`` expires
on the backend somewhere in ``[inv + ttl·(1-rho) - margin, ret + ttl·(1+rho) + margin]``.
The model only calls a lease *live* (or *expired*) when every placement of the two
operations' linearization points inside their intervals agrees; otherwise both
outcomes are allowed. So the search never fails a correct backend because of clock
skew within rho, at the price of missing violations that hide inside that slack.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from tenure._history import Sighting, Window, handoffs, token_clashes

from .history import INF, Op, group_by_key

__all__ = [
    "CheckConfig",
    "KeyResult",
    "Report",
    "State",
    "Violation",
    "check_all",
    "check_counter",
    "check_exclusivity",
    "check_linearizable",
    "check_no_resurrection",
    "check_tokens",
    "minimal_failing_prefix",
    "step",
]

NEG = -(2**63)


@dataclass(frozen=True, slots=True)
class CheckConfig:
    """rho: allowed clock-rate error; margin_ms: clock granularity and rounding slack."""

    rho: float = 0.01
    margin_ms: float = 2.0
    budget: int = 200_000  # search configurations per key before UNKNOWN
    # An operation of unknown outcome takes effect, if at all, within this many ms
    # of its invoke. None: any time later (no assumption). The runner sets it from
    # its fault bounds (op timeout + the longest client pause + the longest server
    # stall + slack); without it, old ambiguous operations make the search explode.
    info_horizon_ms: float | None = None

    def ttl_lo(self, ttl_ms: float) -> float:
        return ttl_ms * 1e6 * (1 - self.rho) - self.margin_ms * 1e6

    def ttl_hi(self, ttl_ms: float) -> float:
        return ttl_ms * 1e6 * (1 + self.rho) + self.margin_ms * 1e6


@dataclass(slots=True)
class Violation:
    prop: str
    key: str
    message: str
    ops: list[Op] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"{self.prop} violated on key {self.key!r}: {self.message}"]
        lines.extend("    " + o.describe() for o in self.ops)
        return "\n".join(lines)


# -- the timed fenced-mutex model ------------------------------------------------


class State(NamedTuple):
    """Holder (None: free), its token (None: granted but not yet observed), the
    interval of the operation that last set its deadline, that TTL, and ``floor``:
    every later grant's token must exceed it."""

    holder: str | None
    token: int | None
    base_inv: float
    base_ret: float
    ttl: int
    floor: int


INITIAL = State(None, None, 0.0, 0.0, 0, NEG)


def _free(s: State) -> State:
    return State(None, None, 0.0, 0.0, 0, s.floor)


def _status(s: State, o: Op, cfg: CheckConfig) -> str:
    """free | live | expired | either, as seen by ``o`` linearized after ``s`` was set."""
    if s.holder is None:
        return "free"
    hi_elapsed = o.ret - s.base_inv
    lo_elapsed = max(0.0, o.inv - s.base_ret)
    if hi_elapsed < cfg.ttl_lo(s.ttl):
        return "live"
    if lo_elapsed > cfg.ttl_hi(s.ttl):
        return "expired"
    return "either"


def _grant_token_ok(s: State, token: Any) -> bool:
    return isinstance(token, int) and token > s.floor


def step(s: State, o: Op, cfg: CheckConfig) -> list[State]:
    """Every state the model can be in after ``o`` is linearized at ``s``; [] if illegal.

    An ``info`` operation only yields its *effectful* outcomes: leaving it
    unlinearized already stands for "it never happened".
    """
    st = _status(s, o, cfg)
    held = st in ("live", "either")
    may_be_gone = st in ("free", "expired", "either")
    a = o.args
    info = o.type == "info"
    if info:
        # If it happened, it happened by its horizon (or at any later time).
        ret = INF if cfg.info_horizon_ms is None else o.inv + cfg.info_horizon_ms * 1e6
    else:
        ret = o.ret
    out: list[State] = []
    if o.op == "acquire":
        owner, ttl = a["owner"], int(a["ttl_ms"])
        res = o.result if isinstance(o.result, dict) else {}
        if info or res.get("acquired"):
            t = o.token
            if held and s.holder == owner:
                if info:
                    out.append(State(owner, s.token, o.inv, ret, ttl, s.floor))
                elif s.token == t or (s.token is None and isinstance(t, int) and t >= s.floor):
                    assert isinstance(t, int)
                    out.append(State(owner, t, o.inv, ret, ttl, max(s.floor, t)))
            if may_be_gone:
                if info:
                    out.append(State(owner, None, o.inv, ret, ttl, s.floor + 1))
                elif _grant_token_ok(s, t):
                    assert isinstance(t, int)
                    out.append(State(owner, t, o.inv, ret, ttl, t))
        else:
            named = res.get("owner")
            if named is None:
                # Refused without naming a holder (Redis's quarantine after it may
                # have lost leases): a liveness matter, never unsafe.
                out.append(s)
            elif held and s.holder != owner and named == s.holder:
                out.append(s)
    elif o.op == "renew":
        owner, ttl = a["owner"], int(a["ttl_ms"])
        if info or o.result is True:
            if held and s.holder == owner:
                out.append(State(owner, s.token, o.inv, ret, ttl, s.floor))
        elif s.holder != owner:
            out.append(s)
        elif st != "live":
            out.append(_free(s))
    elif o.op == "release":
        owner = a["owner"]
        if s.holder == owner:
            out.append(_free(s))
        elif not info:
            out.append(s)
    elif o.op == "transfer":
        src, dst, ttl = a["from_owner"], a["to_owner"], int(a["ttl_ms"])
        if info or o.result is True:
            if held and s.holder == src:
                out.append(State(dst, None, o.inv, ret, ttl, s.floor + 1))
        elif s.holder != src:
            out.append(s)
        elif st != "live":
            out.append(_free(s))
    elif o.op == "lose":
        # The server restarted without its data (Redis without persistence):
        # every lease is gone; tokens must still rise (the floor stays).
        out.append(_free(s))
    elif o.op == "get":
        if info:
            return []
        rec = o.result
        if rec is None:
            if st == "free":
                out.append(s)
            elif st != "live":
                out.append(_free(s))
        elif held and isinstance(rec, dict) and rec.get("owner") == s.holder:
            t = o.token
            if s.token == t:
                out.append(s)
            elif s.token is None and isinstance(t, int) and t >= s.floor:
                out.append(s._replace(token=t, floor=max(s.floor, t)))
    else:
        raise ValueError(f"not a lease operation: {o.op!r}")
    return out


# -- the Wing-Gong-Lowe search ---------------------------------------------------


@dataclass(slots=True)
class KeyResult:
    key: str
    status: str  # PASS | FAIL | UNKNOWN
    ops: int
    explored: int
    witness: list[Op] = field(default_factory=list)


def _search(ops: Sequence[Op], cfg: CheckConfig, budget: int) -> tuple[str, int]:
    """DFS over (linearized set, state) with memoisation (Lowe's cache)."""
    n = len(ops)
    required = 0
    for i, o in enumerate(ops):
        if o.type == "ok":
            required |= 1 << i
    horizon = INF if cfg.info_horizon_ms is None else cfg.info_horizon_ms * 1e6
    visited: set[tuple[int, State]] = set()
    # (linearized set, state, latest invoke among the linearized: the search's "now")
    stack: list[tuple[int, State, float]] = [(0, INITIAL, 0.0)]
    explored = 0
    while stack:
        lin, s, now = stack.pop()
        if lin & required == required:
            return "PASS", explored
        explored += 1
        if explored > budget:
            return "UNKNOWN", explored
        # Lowest unlinearized index.
        lo = (~lin & (lin + 1)).bit_length() - 1
        min_ret = INF
        succ: list[tuple[int, State, float]] = []
        for i in range(lo, n):
            if lin >> i & 1:
                continue
            o = ops[i]
            if o.inv > min_ret:
                break
            if o.ret < min_ret:
                min_ret = o.ret
            if o.type == "info" and now > o.inv + horizon:
                continue  # too late for it to take effect now
            for s2 in step(s, o, cfg):
                if o.type == "info" and s2 == s:
                    continue
                cfgkey = (lin | 1 << i, s2)
                if cfgkey not in visited:
                    visited.add(cfgkey)
                    succ.append((lin | 1 << i, s2, max(now, o.inv)))
        # Completed operations first (pushed last, popped first).
        succ.sort(key=lambda c: ops[(c[0] ^ lin).bit_length() - 1].type == "ok")
        stack.extend(succ)
    return "FAIL", explored


def _relevant_info(hist: Sequence[Op]) -> list[Op]:
    """The history with only the ambiguous operations that something later could need.

    A lost acquire, renew or transfer matters only if its (new) owner is seen
    later (named as holder, or acting as owner); a lost release may always matter.
    """
    seen_after: dict[str, float] = {}
    for o in hist:
        if o.type != "ok":
            continue
        names = [o.args.get("owner"), o.args.get("from_owner")]
        if isinstance(o.result, dict):
            names.append(o.result.get("owner"))
        for name in names:
            if isinstance(name, str):
                seen_after[name] = max(seen_after.get(name, -INF), o.inv)
    out = []
    for o in hist:
        if o.type == "info" and o.op != "release":
            who = str(o.args.get("to_owner") or o.args.get("owner"))
            if seen_after.get(who, -INF) <= o.inv:
                continue
        out.append(o)
    return out


def _staged_search(hist: Sequence[Op], cfg: CheckConfig, budget: int) -> tuple[str, int]:
    """Cheap searches first, each sound for PASS: leaving ambiguous operations out
    only removes ways to explain the history. FAIL needs the full search."""
    used = 0
    stages = [
        [o for o in hist if o.type == "ok"],
        _relevant_info(hist),
    ]
    for stage in stages:
        if len(stage) == len(hist):
            break
        status, explored = _search(stage, cfg, budget - used)
        used += explored
        if status == "PASS":
            return status, used
        if used >= budget:
            return "UNKNOWN", used
    status, explored = _search(hist, cfg, budget - used)
    return status, used + explored


def _cut(ops: Sequence[Op], t: float) -> list[Op]:
    """The history as it stood at time ``t``: later invokes dropped, unfinished ops ambiguous."""
    out = []
    for o in ops:
        if o.inv > t:
            break
        if o.ret > t and o.type != "info":
            o = replace(o, type="info", result=None, token=None, ret=INF)
        if o.type != "fail":
            out.append(o)
    return out


def minimal_failing_prefix(ops: Sequence[Op], cfg: CheckConfig, budget: int) -> list[Op]:
    """The shortest time-cut of a failing history that still fails.

    Sound: if the history cut at ``t`` has no linearization, neither has any longer
    cut, so a binary search over cut times finds the first moment the history
    became impossible. The returned operations end at that moment.
    """
    times = sorted({o.inv for o in ops} | {o.ret for o in ops if o.ret != INF})
    lo, hi = 0, len(times) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _staged_search(_cut(ops, times[mid]), cfg, budget)[0] == "FAIL":
            hi = mid
        else:
            lo = mid + 1
    return _cut(ops, times[lo])


def check_linearizable(
    key: str, ops: Sequence[Op], cfg: CheckConfig | None = None, *, witness_ops: int = 16
) -> KeyResult:
    """P2 for one key's history (lease operations only)."""
    cfg = cfg or CheckConfig()
    hist = sorted((o for o in ops if o.type != "fail"), key=lambda o: o.inv)
    status, explored = _staged_search(hist, cfg, cfg.budget)
    witness: list[Op] = []
    if status == "FAIL":
        prefix = minimal_failing_prefix(hist, cfg, cfg.budget)
        end = max((o.ret for o in prefix if o.ret != INF), default=prefix[-1].inv)
        end = max(end, prefix[-1].inv)
        # The operations that mattered overlap the last moments of the prefix.
        horizon = end - 2 * max(cfg.ttl_hi(int(o.args.get("ttl_ms", 0))) for o in prefix)
        witness = [o for o in prefix if o.ret >= horizon][-witness_ops:]
    return KeyResult(key, status, len(hist), explored, witness)


# -- direct checks -----------------------------------------------------------------


def _windows(ops: Sequence[Op], cfg: CheckConfig) -> list[tuple[float, float, str, Op]]:
    """Safe windows ``(start, end, owner, op)`` of one key's history."""
    wins: dict[str, list[list[Any]]] = {}

    def add(owner: str, o: Op) -> None:
        end = o.inv + cfg.ttl_lo(int(o.args["ttl_ms"]))
        if end > o.ret:
            wins.setdefault(owner, []).append([o.ret, end, owner, o])

    def cap(owner: str, t: float) -> None:
        for w in reversed(wins.get(owner, [])):
            if w[1] <= t:
                break
            if w[0] < t:
                w[1] = t
            else:
                w[1] = w[0]

    for o in sorted(ops, key=lambda o: o.inv):
        if o.op == "release":
            cap(o.args["owner"], o.inv)
        elif o.op == "transfer":
            cap(o.args["from_owner"], o.inv)
        if o.type != "ok":
            continue
        if (o.op == "acquire" and isinstance(o.result, dict) and o.result.get("acquired")) or (
            o.op == "renew" and o.result is True
        ):
            add(o.args["owner"], o)
        elif o.op == "transfer" and o.result is True:
            add(o.args["to_owner"], o)
    return [(w[0], w[1], w[2], w[3]) for ws in wins.values() for w in ws if w[1] > w[0]]


def check_exclusivity(key: str, ops: Sequence[Op], cfg: CheckConfig) -> list[Violation]:
    """P1: safe windows of different owners never overlap."""
    windows = (Window(start, end, owner, o) for start, end, owner, o in _windows(ops, cfg))
    return [
        Violation(
            "P1",
            key,
            f"{h.after.owner!r} was granted at {h.after.start / 1e6:.3f} ms while "
            f"{h.before.owner!r} was safe until {h.before.end / 1e6:.3f} ms",
            [h.before.item, h.after.item],
        )
        for h in handoffs(windows)
        if h.gap < 0
    ]


def _sightings(ops: Sequence[Op]) -> Iterator[Sighting[Op]]:
    """Every completed operation that saw a holder with its token."""
    for o in ops:
        if o.type != "ok" or not isinstance(o.token, int):
            continue
        if o.op == "acquire" and isinstance(o.result, dict) and o.result.get("acquired"):
            yield Sighting(o.inv, o.ret, o.args["owner"], o.token, o)
        elif o.op == "get" and isinstance(o.result, dict):
            yield Sighting(o.inv, o.ret, o.result["owner"], o.token, o)


def check_tokens(key: str, ops: Sequence[Op]) -> list[Violation]:
    """P3: tokens strictly increase in real-time order; one token, one owner."""
    out: list[Violation] = []
    for c in token_clashes(_sightings(ops)):
        if c.shared:
            message = f"token {c.later.token} given to {c.earlier.owner!r} and {c.later.owner!r}"
        else:
            message = (
                f"token {c.later.token} observed after token {c.earlier.token} "
                "had already been issued"
            )
        out.append(Violation("P3", key, message, [c.earlier.item, c.later.item]))
    return out


def check_no_resurrection(key: str, ops: Sequence[Op], cfg: CheckConfig) -> list[Violation]:
    """P5: a renew whose lease had certainly expired before it was sent must fail."""
    base: dict[str, tuple[float, int]] = {}  # owner -> (ret of the op that set the deadline, ttl)
    out: list[Violation] = []
    last: dict[str, Op] = {}
    for o in sorted(ops, key=lambda o: o.inv):
        a = o.args
        if o.op == "renew" and o.type == "ok" and o.result is True:
            b = base.get(a["owner"])
            if b is not None and o.inv - b[0] > cfg.ttl_hi(b[1]):
                out.append(
                    Violation(
                        "P5",
                        key,
                        f"renew by {a['owner']!r} succeeded {(o.inv - b[0]) / 1e6:.1f} ms after "
                        f"its lease was last set (TTL {b[1]} ms): a resurrection",
                        [last[a["owner"]], o],
                    )
                )
        extends = (
            o.op == "acquire"
            and (o.type == "info" or (isinstance(o.result, dict) and o.result.get("acquired")))
        ) or (o.op == "renew" and (o.type == "info" or o.result is True))
        if extends and o.type != "fail":
            base[a["owner"]] = (o.ret, int(a["ttl_ms"]))
            last[a["owner"]] = o
        if o.op == "transfer" and o.type != "fail" and (o.type == "info" or o.result is True):
            base[a["to_owner"]] = (o.ret, int(a["ttl_ms"]))
            last[a["to_owner"]] = o
    return out


@dataclass(slots=True)
class CounterResult:
    acknowledged: int
    unknown: int
    final: int | None
    ok: bool


def check_counter(ops: Iterable[Op], final: int | None) -> tuple[CounterResult, list[Violation]]:
    """P4: acknowledged ≤ final ≤ acknowledged + writes of unknown outcome."""
    acked = unknown = 0
    for o in ops:
        if o.op != "write":
            continue
        if o.type == "ok" and o.result == "accepted":
            acked += 1
        elif o.type == "info":
            unknown += 1
    ok = final is not None and acked <= final <= acked + unknown
    res = CounterResult(acked, unknown, final, ok)
    if ok or final is None:
        return res, []
    return res, [
        Violation(
            "P4",
            "counter",
            f"final counter {final} but {acked} increments acknowledged "
            f"(+{unknown} of unknown outcome): {acked - final} updates lost",
        )
    ]


@dataclass(slots=True)
class Report:
    violations: list[Violation]
    keys: list[KeyResult]
    operations: int
    counter: CounterResult | None

    @property
    def passed(self) -> int:
        return sum(1 for k in self.keys if k.status == "PASS")

    @property
    def unknown(self) -> int:
        return sum(1 for k in self.keys if k.status == "UNKNOWN")

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        n = len(self.keys) or 1
        by_prop: dict[str, int] = {}
        for v in self.violations:
            by_prop[v.prop] = by_prop.get(v.prop, 0) + 1
        props = ", ".join(f"{p}: {c}" for p, c in sorted(by_prop.items())) or "none"
        return (
            f"{self.operations} operations on {len(self.keys)} keys; violations: {props}; "
            f"linearizability: {self.passed} PASS ({100 * self.passed / n:.1f}%), "
            f"{self.unknown} UNKNOWN ({100 * self.unknown / n:.1f}%), "
            f"{len(self.keys) - self.passed - self.unknown} FAIL"
        )


def state_loss_ops(key: str, windows: Sequence[tuple[float, float]]) -> list[Op]:
    """Synthetic operations for server restarts that lost every lease.

    Each happened somewhere inside ``(start, end)`` (kill sent, server back up),
    so it must be linearized there, like any completed operation.
    """
    return [Op("server", key, "lose", {}, "ok", None, None, float(a), float(b)) for a, b in windows]


def check_all(
    ops: Sequence[Op],
    cfg: CheckConfig | None = None,
    *,
    counter_final: int | None = None,
    linearizability: bool = True,
    state_loss: Sequence[tuple[float, float]] = (),
) -> Report:
    """Every check on a whole run's history.

    ``state_loss``: time windows in which the server restarted without its data;
    the linearizability model lets every lease vanish once inside each (the
    direct checks need no such allowance: exclusivity must hold regardless).
    """
    cfg = cfg or CheckConfig()
    violations: list[Violation] = []
    keys: list[KeyResult] = []
    for key, kops in sorted(group_by_key(ops).items()):
        violations += check_exclusivity(key, kops, cfg)
        violations += check_tokens(key, kops)
        violations += check_no_resurrection(key, kops, cfg)
        if linearizability:
            first = min(o.inv for o in kops)
            lost = state_loss_ops(key, [w for w in state_loss if w[1] > first])
            kr = check_linearizable(key, [*kops, *lost], cfg)
            keys.append(kr)
            if kr.status == "FAIL":
                violations.append(
                    Violation(
                        "P2",
                        key,
                        "no linearization against the timed fenced mutex; "
                        "minimal failing history ends with:",
                        kr.witness,
                    )
                )
    counter = None
    if any(o.op == "write" for o in ops) or counter_final is not None:
        counter, cv = check_counter(ops, counter_final)
        violations += cv
    return Report(violations, keys, len(ops), counter)
