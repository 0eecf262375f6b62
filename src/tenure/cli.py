"""The ``tenure`` command line: ``demo``, ``run``, ``leases``, ``doctor`` (``python -m tenure``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__

__all__ = ["main"]

_URL_HELP = "backend URL (default $TENURE_URL, else the default SQLite file)"


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def _seconds(
    high: float, *, zero: bool = False, forever: bool = False
) -> Callable[[str], float | None]:
    """A parser of seconds below ``high``, above 0 (or from 0 with ``zero``);
    with ``forever``, the word ``forever`` gives ``None`` (no limit)."""

    def parse(text: str) -> float | None:
        if forever and text == "forever":
            return None
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not (value >= 0 if zero else value > 0) or not value < high:
            low = "from 0" if zero else "above 0"
            raise argparse.ArgumentTypeError(
                f"must be {low} and below {high:g} seconds, got {text}"
            )
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tenure",
        description="Distributed leases with fencing tokens, pub/sub and a thread runtime.",
    )
    parser.add_argument("--version", action="version", version=f"tenure {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run the thread runtime live across worker processes, kill one, judge the result",
        description=(
            "Start several worker processes that run the thread runtime on one backend, send "
            "a seeded stream of signals to a few threads from all of them, SIGKILL a worker "
            "that owns a thread part-way, and show who owns which thread. Ends with a verdict "
            "computed from what the workers recorded: every signal handled, never two owners "
            "of a thread at once, fencing tokens increasing. Exit status 0 only on PASS."
        ),
    )
    demo.add_argument(
        "--workers", type=_bounded_int(1, 32), default=4, help="worker processes (default 4)"
    )
    demo.add_argument(
        "--threads", type=_bounded_int(1, 1000), default=5, help="threads (default 5)"
    )
    demo.add_argument(
        "--signals",
        type=_bounded_int(1, 100_000),
        default=200,
        help="signals to send (default 200)",
    )
    demo.add_argument(
        "--seed",
        type=_bounded_int(0, 2**63 - 1),
        default=None,
        help="seed of the plan (default random, printed so a run can be repeated)",
    )
    demo.add_argument(
        "--url",
        default=None,
        help=(
            "backend URL, e.g. redis://127.0.0.1:6379/0 (default: a fresh SQLite file in a "
            "temp dir; memory:// gives each worker a backend of its own: a negative control "
            "whose verdict must FAIL)"
        ),
    )
    demo.add_argument(
        "--ttl-ms", type=_bounded_int(100, 600_000), default=2000, help="lease TTL (default 2000)"
    )
    demo.add_argument(
        "--send-seconds",
        type=_seconds(3600),
        default=12.0,
        help="spread the signals over this many seconds (default 12)",
    )
    demo.add_argument("--no-kill", dest="kill", action="store_false", help="do not kill a worker")
    demo.add_argument("--keep", action="store_true", help="keep the evidence directory")
    run = commands.add_parser(
        "run",
        help="run a command while holding a lease (like flock(1), across hosts)",
        usage="tenure run [options] KEY -- CMD [ARGS...]",
        description=(
            "Hold the lease KEY while CMD runs, renewing it. CMD gets TENURE_LEASE_KEY, "
            "TENURE_LEASE_OWNER and TENURE_FENCING_TOKEN. If the lease is lost, CMD's process "
            "group gets SIGTERM, then SIGKILL after --grace seconds, and tenure run exits 75. "
            "A busy key exits 73 (at once, or after --wait seconds). Otherwise the exit status "
            "is CMD's."
        ),
    )
    run.add_argument("key", metavar="KEY", help="the lease key")
    run.add_argument("argv", metavar="CMD", nargs=argparse.REMAINDER, help="the command")
    run.add_argument(
        "--url",
        default=None,
        help=_URL_HELP,
    )
    run.add_argument(
        "--ttl-ms", type=_bounded_int(100, 86_400_000), default=15_000, help="lease TTL (15000)"
    )
    run.add_argument(
        "--wait",
        type=_seconds(1e9, zero=True, forever=True),
        default=0.0,
        help="seconds to wait for a busy key ('forever' waits without limit; default 0)",
    )
    run.add_argument("--owner", default=None, help="the owner's name (default HOST:PID)")
    run.add_argument(
        "--grace", type=_seconds(3600), default=10.0, help="seconds from SIGTERM to SIGKILL (10)"
    )
    _leases_parser(commands)
    threads = commands.add_parser(
        "threads",
        help="the thread runtime's threads: owner, token, TTL, unfinished signals",
        description=(
            "The threads of a namespace that have a run (in any process) or signals not "
            "yet acknowledged, read from the backend."
        ),
    )
    threads.add_argument(
        "--namespace", default="tenure.thread", help="the runtime's namespace (tenure.thread)"
    )
    threads.add_argument("--json", action="store_true", help="JSON Lines instead of columns")
    threads.add_argument(
        "--url",
        default=None,
        help=_URL_HELP,
    )
    watch = commands.add_parser(
        "watch",
        help="a live view of leases being granted, transferred, released and expiring",
        description=(
            "Scan the leases under a prefix every --interval seconds and print each change: "
            "granted, transferred, granted again, released (or revoked), expired, and "
            "leases whose renewals stopped. Runs until interrupted."
        ),
    )
    watch.add_argument("--prefix", default="", help="only keys that start with this")
    watch.add_argument(
        "--interval", type=_seconds(3600), default=0.5, help="seconds between looks (0.5)"
    )
    watch.add_argument(
        "--count", type=_bounded_int(1, 2**31), default=None, help="stop after this many changes"
    )
    watch.add_argument("--url", default=None, help=_URL_HELP)
    doctor = commands.add_parser(
        "doctor",
        help="check that the backend, as deployed, is safe for leases",
        description=(
            "Look at the backend's server or file (eviction, persistence, replication, "
            "isolation, filesystem, clock...) and print each finding with its fix. "
            "Exit status 1 when anything is unsafe."
        ),
    )
    doctor.add_argument(
        "--url",
        default=None,
        help=_URL_HELP,
    )
    from .dashboard._cli import add_parser as add_dashboard

    add_dashboard(commands, _URL_HELP)
    return parser


def _leases_parser(commands: Any) -> None:
    leases = commands.add_parser(
        "leases",
        help="list, show and revoke leases",
        description="Leases as an operator sees them (any backend that declares OPERATIONS).",
    )
    actions = leases.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="the live leases: key, owner, token, TTL left")
    listing.add_argument("--prefix", default="", help="only keys that start with this")
    listing.add_argument(
        "--limit", type=_bounded_int(1, 2**63 - 1), default=None, help="at most this many"
    )
    get = actions.add_parser("get", help="one key's live lease (exit 1 when there is none)")
    get.add_argument("key", metavar="KEY")
    revoke = actions.add_parser(
        "revoke", help="force-release a lease, atomically (exit 1 when nothing was revoked)"
    )
    revoke.add_argument("key", metavar="KEY")
    revoke.add_argument(
        "--token",
        type=_bounded_int(1, 2**63 - 1),
        default=None,
        help="only if the lease still carries this fencing token",
    )
    for action in (listing, get, revoke):
        action.add_argument("--url", default=None, help=_URL_HELP)
    for action in (listing, get):
        action.add_argument("--json", action="store_true", help="JSON Lines instead of columns")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tenure`` command; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "run":
        from ._run import RunSettings, run_command

        command = list(args.argv)
        if command[:1] == ["--"]:
            command = command[1:]
        if not command:
            print("tenure run: no command given: tenure run KEY -- CMD [ARGS...]", file=sys.stderr)
            return 2
        return run_command(
            RunSettings(
                key=args.key,
                command=command,
                url=args.url,
                ttl_ms=args.ttl_ms,
                wait=args.wait,
                owner=args.owner,
                grace=args.grace,
            )
        )
    if args.command == "watch":
        from ._watch import watch as watch_leases

        return watch_leases(args.url, args.prefix, args.interval, args.count)
    if args.command == "threads":
        from ._operate import threads as show_threads

        return show_threads(args.url, args.namespace, args.json)
    if args.command == "dashboard":
        from .dashboard._cli import run as run_dashboard

        return run_dashboard(args)
    if args.command == "doctor":
        from ._doctor import doctor

        return doctor(args.url)
    if args.command == "leases":
        from . import _operate

        if args.action == "list":
            return _operate.listing(args.url, args.prefix, args.limit, args.json)
        if args.action == "get":
            return _operate.get(args.url, args.key, args.json)
        return _operate.revoke(args.url, args.key, args.token)
    if args.command != "demo":
        parser.print_help()
        return 2
    try:
        from .demo import DemoSettings, run_demo
    except ImportError as exc:  # rich is the optional "demo" extra
        print(f"tenure demo needs {exc.name!r}: pip install 'tenure[demo]'", file=sys.stderr)
        return 2
    # Every demo option is named after the DemoSettings field it sets.
    chosen = {f.name: getattr(args, f.name) for f in dataclasses.fields(DemoSettings)}
    return run_demo(DemoSettings(**chosen))
