"""``python -m safety threads``: a thread run with faults, every control, or a soak."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any

from .controls import CONTROLS
from .runner import (
    BACKENDS,
    WORKLOADS,
    ThreadRunConfig,
    ThreadRunResult,
    check_dir,
    control_config,
    run_threads,
    spread,
)

__all__ = ["add_parser", "cmd_threads"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "threads",
        help="the thread runtime's harness",
        description="A thread run with faults (exit 1 on any violation), --controls "
        "(exit 1 if one is not caught), or --control NAME alone.",
    )
    p.add_argument("--backend", choices=BACKENDS, required=True)
    p.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="runtime",
        help="langgraph: each thread runs a graph on a fenced saver (a SQLite file; "
        "PostgreSQL on --backend postgres) and every thread's checkpoints are checked; "
        "policies: each signal is sent under a policy of a mix (every policy), and a "
        "signal without a write must have been settled by one",
    )
    p.add_argument("--duration", type=float, default=None, help="seconds of sending")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--ttl-ms", type=int, default=1000)
    p.add_argument("--fault-gap", type=float, nargs=2, default=(0.5, 1.5), metavar=("LO", "HI"))
    p.add_argument(
        "--send-gap",
        type=float,
        nargs=2,
        default=None,
        metavar=("LO", "HI"),
        help="ms between a worker's sends (default 5 40; 100 400 for langgraph)",
    )
    p.add_argument("--no-faults", action="store_true")
    p.add_argument(
        "--output", action="store_true", help="runtimes keep output; check every thread's"
    )
    p.add_argument("--kinds", nargs="+", default=None, help="only these fault kinds")
    p.add_argument("--workdir", default=None)
    p.add_argument("--control", choices=CONTROLS, default=None)
    p.add_argument("--controls", action="store_true", help="run every control")
    p.add_argument("--recheck", metavar="DIR", help="only judge the evidence a run left in DIR")
    p.add_argument(
        "--warm-start",
        action="store_true",
        help="Redis: start the workers only once the fresh server grants leases",
    )


def _show(res: ThreadRunResult) -> None:
    print(res.figure_line())
    for line in res.report.describe():
        print("  " + line)
    print(f"  evidence in {res.workdir}; took {res.elapsed_s:.1f} s")


def cmd_threads(ns: argparse.Namespace) -> int:
    common: dict[str, Any] = {
        "seed": ns.seed,
        "workers": ns.workers,
        "threads": ns.threads,
        "ttl_ms": ns.ttl_ms,
        "workdir": ns.workdir,
        "cold_start": not ns.warm_start,
        "output": ns.output,
        "workload": ns.workload,
    }
    if ns.duration is not None:
        common["duration_s"] = ns.duration
    if ns.recheck:
        rc = ThreadRunConfig(backend=ns.backend, ttl_ms=ns.ttl_ms, workload=ns.workload)
        report = check_dir(Path(ns.recheck), rc)
        counts = ", ".join(f"{v} {k}" for k, v in report.counts().items())
        print(
            f"{report.signals} signals, {report.writes} writes, {report.checkpoints} "
            f"checkpoints ({report.forks} forks); {counts}; {report.settled_line()}"
            f"{len(report.duplicates)} duplicated signals; takeover after owner kill "
            f"p50/p99/max {spread(report.takeover_ms)} ms ({len(report.takeover_ms)}), "
            f"with no other fault during it {spread(report.takeover_isolated_ms)} ms "
            f"({len(report.takeover_isolated_ms)})"
        )
        for line in report.describe():
            print("  " + line)
        return 0 if report.violations == 0 else 1
    if ns.controls or ns.control:
        names = [ns.control] if ns.control else list(CONTROLS)
        caught = 0
        for name in names:
            # One directory per control: a run's evidence must not mix with another's.
            over = dict(common, workdir=ns.workdir and str(Path(ns.workdir) / name))
            res = asyncio.run(run_threads(control_config(ns.backend, name, **over)))
            hit = res.violations > 0
            caught += hit
            print(f"control {name}: {'CAUGHT' if hit else 'NOT CAUGHT'}")
            _show(res)
        print(f"{ns.backend}: thread controls caught {caught}/{len(names)}")
        return 0 if caught == len(names) else 1
    rc = ThreadRunConfig(
        backend=ns.backend,
        faults=not ns.no_faults,
        fault_kinds=ns.kinds,
        fault_gap_s=tuple(ns.fault_gap),
        send_gap_ms=tuple(ns.send_gap) if ns.send_gap else None,
        **common,
    )
    res = asyncio.run(run_threads(rc))
    _show(res)
    print(f"reproduce: python -m safety {shlex.join(sys.argv[1:])}")
    return 0 if res.violations == 0 and res.drained_s is not None else 1
