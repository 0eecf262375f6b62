"""Every comparison in one run: ``python -m benchmarks [--full] [--loop asyncio|uvloop|both]``.

Runs each benchmark script's ``figures()`` (short settings by default, the
scripts' own defaults with ``--full``), each stamped with the load average
before and after, then prints the summary table (what | tenure | baseline |
ratio | goal | met?), writes it as JSON and draws the chart of tenure/baseline
ratios with their goals (``docs/benchmarks.png``).

Needs the shared Redis and PostgreSQL of the tests (``TENURE_TEST_REDIS_URL``,
``TENURE_TEST_POSTGRES_URL``) and ``redis-server`` and ``etcd`` on the PATH. Publish only
figures from a quiet machine (load average well under 1 before and after).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks._common import LOOP_ENV, Figure, load_average, print_table

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ("memory", "redis", "sqlite", "postgres", "etcd", "handoff", "runtime", "sync")


def chart(figures: Sequence[Figure], path: Path) -> None:
    """One horizontal bar per ratio that has a goal, grouped by backend, goal as a tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = [
        f for f in figures if f.ratio is not None and f.goal is not None and f.goal_of == "ratio"
    ]
    rows.sort(key=lambda f: (f.backend, f.what, f.loop))
    palette = plt.get_cmap("tab10")
    colours = {backend: palette(i) for i, backend in enumerate(sorted({f.backend for f in rows}))}
    fig, ax = plt.subplots(figsize=(12, 0.36 * len(rows) + 1.8))
    for y, f in enumerate(rows):
        assert f.ratio is not None and f.goal is not None
        _op, goal = f.goal
        ax.barh(y, f.ratio, color=colours[f.backend], hatch="//" if f.loop == "uvloop" else None)
        ax.plot([goal, goal], [y - 0.42, y + 0.42], color="black", linewidth=2)
        ax.text(f.ratio, y, f" {f.ratio:.2f}", va="center", fontsize=8)
    labels = [
        f"{f.backend}: {f.what}{' [uvloop]' if f.loop == 'uvloop' else ''}"
        f" ({'higher' if f.goal and f.goal[0] == '>=' else 'lower'} is better)"
        for f in rows
    ]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    values = [
        v for f in rows if f.ratio is not None and f.goal is not None for v in (f.ratio, f.goal[1])
    ]
    if values:
        ax.set_xlim(min(values) / 1.5, max(values) * 2.5)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("tenure / baseline (log scale); black tick: the goal; hatched: on uvloop")
    fig.suptitle("tenure against its baselines, measured in the same run", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_all(
    names: Sequence[str], loops: Sequence[str], full: bool
) -> tuple[list[Figure], list[str]]:
    found: list[Figure] = []
    failed: list[str] = []
    for name in names:
        module = importlib.import_module(f"benchmarks.{name}")
        measure: Callable[[bool], list[Figure]] = module.figures
        for loop in loops:
            os.environ[LOOP_ENV] = loop  # children started by the benchmark inherit it
            try:
                found += measure(full)
            except Exception:
                traceback.print_exc()
                failed.append(f"{name} on {loop}")
    return found, failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--full", action="store_true", help="the scripts' full settings (slow)")
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop", "both"],
        default="asyncio",
        help="event loop to run on; both: every benchmark on each, one after the other",
    )
    parser.add_argument(
        "--only",
        default=",".join(BENCHMARKS),
        help=f"comma-separated subset of {','.join(BENCHMARKS)}",
    )
    parser.add_argument("--json", type=Path, default=ROOT / ".benchmarks" / "results.json")
    parser.add_argument("--chart", type=Path, default=ROOT / "docs" / "benchmarks.png")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; known: {', '.join(BENCHMARKS)}")
    loops = ["asyncio", "uvloop"] if args.loop == "both" else [args.loop]

    started, load_before = time.time(), load_average()
    found, failed = run_all(names, loops, args.full)
    print()
    print_table(found)
    meta = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "full": args.full,
        "loops": loops,
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "failed": failed,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "run": meta,
                "figures": [
                    {**dataclasses.asdict(f), "met": f.met, "goal_text": f.goal_text()}
                    for f in found
                ],
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    chart(found, args.chart)
    print(
        f"\n{len(found)} figures in {meta['seconds']} s; load average before {load_before}, "
        f"after {meta['load_average_after']}"
    )
    print(f"table: {args.json}\nchart: {args.chart}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
