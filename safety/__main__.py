"""``python -m safety run|controls|soak``: the safety evidence from the command line.

- ``run``: one short run with faults; exit 1 on any violation, a failed acquire
  sweep or a damaged SQLite file.
- ``controls``: every negative control (mutant) on the backend; exit 1 if one is
  not caught.
- ``soak``: a long ``run`` (any duration); prints the figure line for SAFETY.md.
- ``threads``: the thread runtime's harness (a run with faults, ``--controls``,
  or a soak with a long ``--duration``; see :mod:`safety.threads`).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time

from .mutants import mutants_for
from .runner import RunConfig, RunResult, run
from .threads.cli import add_parser as add_threads_parser
from .threads.cli import cmd_threads

BACKENDS = [
    "memory",
    "sqlite",
    "redis",
    "redis-aof",
    "redis-sentinel",
    "redis-sentinel-min-replicas",
    "redis-cluster",
    "postgres",
    "etcd",
]


def _config(ns: argparse.Namespace, **over: object) -> RunConfig:
    rc = RunConfig(
        backend=ns.backend,
        duration_s=ns.duration,
        seed=ns.seed,
        lease_clients=ns.lease_clients,
        counter_clients=ns.counter_clients,
        ttl_ms=ns.ttl_ms,
        faults=not ns.no_faults,
        fault_kinds=ns.faults,
        workdir=ns.workdir,
        check_budget=ns.budget,
    )
    for k, v in over.items():
        setattr(rc, k, v)
    return rc


def _print_result(res: RunResult, *, show: int = 5) -> None:
    print(res.figure_line())
    for v in res.report.violations[:show]:
        print(v.describe())
    if len(res.report.violations) > show:
        print(f"... and {len(res.report.violations) - show} more violations")
    if res.sweep_failed:
        print(f"acquire sweep failed on {len(res.sweep_failed)} keys: {res.sweep_failed[:5]}")
    print(f"history and result.json in {res.workdir}")


def _healthy(res: RunResult) -> bool:
    return (
        not res.report.violations
        and res.sweep_ok
        and (res.integrity is None or res.integrity == "ok")
    )


def cmd_run(ns: argparse.Namespace) -> int:
    started = time.monotonic()
    res = asyncio.run(run(_config(ns)))
    _print_result(res)
    print(f"seed {ns.seed}; reproduce: python -m safety {shlex.join(sys.argv[1:])}")
    print(f"took {time.monotonic() - started:.1f} s")
    return 0 if _healthy(res) else 1


def cmd_controls(ns: argparse.Namespace) -> int:
    names = ns.only or list(mutants_for(ns.backend))
    caught = 0
    for name in names:
        # Client pauses make stale owners: the ones whose release, renew or
        # write a mutant lets through.
        rc = _config(ns, mutant=name, fault_kinds=["client-pause"], workdir=None)
        res = asyncio.run(run(rc))
        props = sorted({v.prop for v in res.report.violations})
        hit = "P4" in props if name == "no-fencing" else bool(props)
        caught += hit
        print(
            f"control {name}: {'CAUGHT' if hit else 'NOT CAUGHT'} "
            f"({', '.join(props) or 'no violation'}; {res.operations} operations; {res.workdir})"
        )
        if hit and res.report.violations and ns.verbose:
            print(res.report.violations[0].describe())
    print(f"{ns.backend}: controls caught {caught}/{len(names)}")
    return 0 if caught == len(names) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m safety", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, default_duration in (("run", 30.0), ("controls", 8.0), ("soak", 600.0)):
        p = sub.add_parser(name)
        p.add_argument("--backend", choices=BACKENDS, required=True)
        p.add_argument("--duration", type=float, default=default_duration, help="seconds")
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--lease-clients", type=int, default=12)
        p.add_argument("--counter-clients", type=int, default=4)
        p.add_argument("--ttl-ms", type=int, default=300)
        p.add_argument("--no-faults", action="store_true")
        p.add_argument(
            "--faults",
            nargs="+",
            default=None,
            metavar="KIND",
            help="only these fault kinds (repeat one to weight it); e.g. redis-clock-back "
            "and redis-clock-forward on redis/redis-aof, which are not in the default set",
        )
        p.add_argument("--workdir", default=None)
        p.add_argument("--budget", type=int, default=100_000, help="WGL configurations per key")
        if name == "controls":
            p.add_argument("--only", nargs="*", help="run only these mutants")
            p.add_argument("-v", "--verbose", action="store_true")
    add_threads_parser(sub)
    ns = parser.parse_args(argv)
    if ns.cmd == "threads":
        return cmd_threads(ns)
    if ns.cmd == "controls":
        return cmd_controls(ns)
    return cmd_run(ns)


if __name__ == "__main__":
    sys.exit(main())
