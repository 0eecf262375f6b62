"""What every benchmark shares: its result type, the event loop it runs on,
load-average stamps, interleaved slices and the ratio and percentile maths.

Each script in ``benchmarks/`` has a ``figures(full=False)`` function that runs
its comparisons and returns :class:`Figure` rows; ``python -m benchmarks``
runs them all, prints the summary table, writes it as JSON and draws the chart.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

__all__ = [
    "LOOP_ENV",
    "Figure",
    "Interleaved",
    "interleave",
    "load_average",
    "loop_name",
    "percentile",
    "print_table",
    "run",
    "stamped",
    "summary_ms",
]

T = TypeVar("T")

#: The event loop every benchmark (and every process it starts) runs on:
#: ``asyncio`` (the default loop) or ``uvloop``. An environment variable so
#: that child processes inherit it.
LOOP_ENV = "TENURE_BENCH_LOOP"


def loop_name() -> str:
    name = os.environ.get(LOOP_ENV, "asyncio")
    if name not in ("asyncio", "uvloop"):
        raise SystemExit(f"{LOOP_ENV} must be asyncio or uvloop, got {name!r}")
    return name


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop named by ``$TENURE_BENCH_LOOP``."""
    if loop_name() == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)


# -- results -------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One comparison: tenure's figure, the baseline's, their ratio and the goal.

    ``goal`` is ``(">=", 0.8)`` or ``("<=", 1.5)`` and applies to ``ratio``, or to
    ``tenure`` itself when ``goal_of="tenure"`` (an absolute goal such as a
    latency under 2 ms). ``backend`` groups the rows in the chart.
    """

    backend: str
    what: str
    tenure: float
    baseline: float | None
    unit: str
    ratio: float | None = None
    goal: tuple[str, float] | None = None
    goal_of: Literal["ratio", "tenure"] = "ratio"
    note: str = ""
    loop: str = field(default_factory=loop_name)

    @classmethod
    def limit(
        cls, backend: str, what: str, value: float, unit: str, goal: tuple[str, float] | None
    ) -> Figure:
        """A figure of tenure alone against an absolute goal (a latency, a CPU share)."""
        return cls(backend, what, value, None, unit, None, goal, "tenure")

    @property
    def met(self) -> bool | None:
        if self.goal is None:
            return None
        value = self.ratio if self.goal_of == "ratio" else self.tenure
        if value is None:
            return None
        op, target = self.goal
        return value >= target if op == ">=" else value <= target

    def goal_text(self) -> str:
        if self.goal is None:
            return ""
        op, target = self.goal
        unit = "" if self.goal_of == "ratio" else f" {self.unit}"
        return f"{'≥' if op == '>=' else '≤'} {target:g}{unit}"


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return ""
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def print_table(figures: Sequence[Figure]) -> None:
    """The summary table: what | tenure | baseline | ratio | goal | met?"""
    rows = [("what", "loop", "tenure", "baseline", "ratio", "goal", "met?")]
    for f in figures:
        met = {None: "", True: "yes", False: "NO"}[f.met]
        rows.append(
            (
                f"{f.backend}: {f.what}",
                f.loop,
                _num(f.tenure, f.unit),
                _num(f.baseline, f.unit),
                "" if f.ratio is None else f"{f.ratio:.2f}",
                f.goal_text(),
                met,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("-+-".join("-" * w for w in widths))


# -- load ------------------------------------------------------------------------------


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


@contextmanager
def stamped(name: str) -> Iterator[None]:
    """Print the load average (1, 5, 15 min) before and after a benchmark."""
    print(f"== {name} on {loop_name()}: load average before {load_average()}", flush=True)
    try:
        yield
    finally:
        print(f"== {name}: load average after {load_average()}", flush=True)


# -- interleaving -------------------------------------------------------------------------

#: One slice of a case: runs for a short while and returns (units of work, seconds).
Slice = Callable[[], Awaitable[tuple[float, float]]]


@dataclass
class Interleaved:
    """Per-case totals and per-round rates of :func:`interleave`."""

    work: dict[str, float]
    seconds: dict[str, float]
    rounds: dict[str, list[float]]

    def rate(self, case: str) -> float:
        """Total work over total time."""
        return self.work[case] / self.seconds[case]

    def ratios(self, case: str, baseline: str) -> list[float]:
        """``case``'s rate over ``baseline``'s, round by round (same conditions)."""
        return [a / b for a, b in zip(self.rounds[case], self.rounds[baseline], strict=True)]

    def ratio(self, case: str, baseline: str) -> float:
        """The median of the per-round ratios."""
        return statistics.median(self.ratios(case, baseline))


async def interleave(cases: Mapping[str, Slice], rounds: int) -> Interleaved:
    """Run one slice of every case per round, in reversed order every other round,
    so that load on a shared machine hits every case alike."""
    names = list(cases)
    result = Interleaved(
        dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0), {n: [] for n in names}
    )
    for i in range(rounds):
        for name in names if i % 2 == 0 else reversed(names):
            work, seconds = await cases[name]()
            result.work[name] += work
            result.seconds[name] += seconds
            result.rounds[name].append(work / seconds)
    return result


# -- percentiles ---------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary_ms(ms: Sequence[float]) -> str:
    """Median, p90 and p99 of latencies in milliseconds."""
    return (
        f"median {statistics.median(ms):7.3f} ms  p90 {percentile(ms, 0.9):7.3f} ms  "
        f"p99 {percentile(ms, 0.99):7.3f} ms  (n={len(ms)})"
    )
