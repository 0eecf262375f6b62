"""The ``tenure`` command line (``python -m tenure``): one registration per subcommand in
``_COMMANDS``, each naming the handler that gives its exit status."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from ._version import __version__

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], int]

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


_EXIT_USAGE = "  2    a usage error (an unknown option, a missing KEY...)"
_EXIT_UNAVAILABLE = (
    "  69   the backend cannot be reached or is misconfigured (an unknown scheme, a bad URL,\n"
    "       a server that does not answer)"
)

# One ``add_argument`` call: its names or flags, and its settings.
_Option = tuple[tuple[str, ...], dict[str, Any]]


def _option(*flags: str, **settings: Any) -> _Option:
    return flags, settings


# The options that mean the same in every command that takes them.
_URL = _option("--url", default=None, help=_URL_HELP)
_JSON = _option("--json", action="store_true", help="JSON Lines instead of columns")
_PREFIX = _option("--prefix", default="", help="only keys that start with this")
_KEY = _option("key", metavar="KEY")


def _add(
    commands: Any,
    name: str,
    handler: Handler,
    *options: _Option,
    description: str,
    exits: Sequence[str],
    **kw: Any,
) -> None:
    """A subcommand with ``options``, whose ``handler(args)`` gives one of its ``exits``."""
    found = commands.add_parser(
        name,
        description=textwrap.fill(description, 88),
        epilog="\n".join(("exit status:", *exits)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kw,
    )
    for flags, settings in options:
        found.add_argument(*flags, **settings)
    found.set_defaults(handler=handler, usage_error=found.error)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tenure",
        description="Distributed leases with fencing tokens, pub/sub and a thread runtime.",
        epilog="Each command's --help lists its exit statuses.",
    )
    parser.add_argument("--version", action="version", version=f"tenure {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _COMMANDS:
        register(commands)
    return parser


def _demo_parser(commands: Any) -> None:
    _add(
        commands,
        "demo",
        _demo,
        _option(
            "--workers", type=_bounded_int(1, 32), default=4, help="worker processes (default 4)"
        ),
        _option("--threads", type=_bounded_int(1, 1000), default=5, help="threads (default 5)"),
        _option(
            "--signals",
            type=_bounded_int(1, 100_000),
            default=200,
            help="signals to send (default 200)",
        ),
        _option(
            "--seed",
            type=_bounded_int(0, 2**63 - 1),
            default=None,
            help="seed of the plan (default random, printed so a run can be repeated)",
        ),
        _option(
            "--url",
            default=None,
            help=(
                "backend URL, e.g. redis://127.0.0.1:6379/0 (default: a fresh SQLite file in a "
                "temp dir; memory:// gives each worker a backend of its own: a negative control "
                "whose verdict must FAIL)"
            ),
        ),
        _option(
            "--ttl-ms",
            type=_bounded_int(100, 600_000),
            default=2000,
            help="lease TTL (default 2000)",
        ),
        _option(
            "--send-seconds",
            type=_seconds(3600),
            default=12.0,
            help="spread the signals over this many seconds (default 12)",
        ),
        _option("--no-kill", dest="kill", action="store_false", help="do not kill a worker"),
        _option("--keep", action="store_true", help="keep the evidence directory"),
        help="run the thread runtime live across worker processes, kill one, judge the result",
        description=(
            "Start several worker processes that run the thread runtime on one backend, send "
            "a seeded stream of signals to a few threads from all of them, SIGKILL a worker "
            "that owns a thread part-way, and show who owns which thread. Ends with a verdict "
            "computed from what the workers recorded: every signal handled, never two owners "
            "of a thread at once, fencing tokens increasing."
        ),
        exits=("  0    PASS", "  1    FAIL", "  2    a usage error, or a URL the demo cannot use"),
    )


def _run_parser(commands: Any) -> None:
    _add(
        commands,
        "run",
        _run,
        _option("key", metavar="KEY", help="the lease key"),
        _option("argv", metavar="CMD", nargs=argparse.REMAINDER, help="the command"),
        _URL,
        _option(
            "--ttl-ms", type=_bounded_int(100, 86_400_000), default=15_000, help="lease TTL (15000)"
        ),
        _option(
            "--wait",
            type=_seconds(1e9, zero=True, forever=True),
            default=0.0,
            help="seconds to wait for a busy key ('forever' waits without limit; default 0)",
        ),
        _option("--owner", default=None, help="the owner's name (default HOST:PID)"),
        _option(
            "--grace",
            type=_seconds(3600),
            default=10.0,
            help="seconds from SIGTERM to SIGKILL (10)",
        ),
        help="run a command while holding a lease (like flock(1), across hosts)",
        usage="tenure run [options] KEY -- CMD [ARGS...]",
        description=(
            "Hold the lease KEY while CMD runs, renewing it. CMD gets TENURE_LEASE_KEY, "
            "TENURE_LEASE_OWNER and TENURE_FENCING_TOKEN. If the lease is lost, CMD's process "
            "group gets SIGTERM, then SIGKILL after --grace seconds; what CMD leaves in its "
            "group when it exits is stopped the same way, and so is the whole group, with "
            "SIGKILL, if tenure run dies. With -- in the line every word before it is tenure "
            "run's (options may follow KEY); without it CMD starts at the word after KEY."
        ),
        exits=(
            "  CMD's own, 128+N when signal N ended it",
            _EXIT_USAGE + ", no CMD, or memory://",
            _EXIT_UNAVAILABLE,
            "  73   KEY is held by another owner (at once, or after --wait seconds)",
            "  75   the lease was lost while CMD ran",
            "  126  CMD cannot be run",
            "  127  CMD was not found",
        ),
    )


def _threads_parser(commands: Any) -> None:
    _add(
        commands,
        "threads",
        _threads,
        _option(
            "--namespace", default="tenure.thread", help="the runtime's namespace (tenure.thread)"
        ),
        _JSON,
        _URL,
        help="the thread runtime's threads: owner, token, TTL, unfinished signals",
        description=(
            "The threads of a namespace that have a run (in any process) or signals not "
            "yet acknowledged, read from the backend."
        ),
        exits=("  0    listed (perhaps nothing)", _EXIT_USAGE, _EXIT_UNAVAILABLE),
    )


def _watch_parser(commands: Any) -> None:
    _add(
        commands,
        "watch",
        _watch,
        _PREFIX,
        _option("--interval", type=_seconds(3600), default=0.5, help="seconds between looks (0.5)"),
        _option(
            "--count",
            type=_bounded_int(1, 2**31),
            default=None,
            help="stop after this many changes",
        ),
        _URL,
        help="a live view of leases being granted, transferred, released and expiring",
        description=(
            "Scan the leases under a prefix every --interval seconds and print each change: "
            "granted, transferred, granted again, released (or revoked), expired, and "
            "leases whose renewals stopped. Runs until interrupted."
        ),
        exits=("  0    interrupted, or --count reached", _EXIT_USAGE, _EXIT_UNAVAILABLE),
    )


def _doctor_parser(commands: Any) -> None:
    _add(
        commands,
        "doctor",
        _doctor,
        _URL,
        help="check that the backend, as deployed, is safe for leases",
        description=(
            "Look at the backend's server or file (eviction, persistence, replication, "
            "isolation, filesystem, clock...) and print each finding with its fix."
        ),
        exits=(
            "  0    nothing unsafe (warnings allowed)",
            "  1    something is unsafe",
            _EXIT_USAGE,
            _EXIT_UNAVAILABLE,
        ),
    )


def _leases_parser(commands: Any) -> None:
    leases = commands.add_parser(
        "leases",
        help="list, show and revoke leases",
        description="Leases as an operator sees them (any backend that declares OPERATIONS).",
    )
    actions = leases.add_subparsers(dest="action", metavar="ACTION", required=True)
    exits = ("  0    done", _EXIT_USAGE, _EXIT_UNAVAILABLE)
    _add(
        actions,
        "list",
        _leases_list,
        _PREFIX,
        _option("--limit", type=_bounded_int(1, 2**63 - 1), default=None, help="at most this many"),
        _URL,
        _JSON,
        help="the live leases: key, owner, token, TTL left",
        description="The live leases: key, owner, token, TTL left.",
        exits=exits,
    )
    _add(
        actions,
        "get",
        _leases_get,
        _KEY,
        _URL,
        _JSON,
        help="one key's live lease (exit 1 when there is none)",
        description="One key's live lease.",
        exits=(*exits, "  1    KEY has no live lease"),
    )
    _add(
        actions,
        "revoke",
        _leases_revoke,
        _KEY,
        _option(
            "--token",
            type=_bounded_int(1, 2**63 - 1),
            default=None,
            help="only if the lease still carries this fencing token",
        ),
        _URL,
        help="force-release a lease, atomically (exit 1 when nothing was revoked)",
        description="Force-release a lease, atomically: its owner's next renewal fails.",
        exits=(*exits, "  1    nothing was revoked"),
    )


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The arguments; for ``run`` with ``--`` in the line, every word before it is tenure's."""
    args = parser.parse_args(argv)
    if args.command != "run" or "--" not in argv:
        return args
    cut = argv.index("--")
    head = argv[:cut]
    args = parser.parse_args(head)  # a KEY left out is missing here, not taken from CMD
    if args.argv:
        # Options after KEY were taken for the command's words: put KEY after them.
        at = len(head) - len(args.argv) - 1
        args = parser.parse_args([*head[:at], *args.argv, head[at]])
        if args.argv:
            args.usage_error(
                "with -- in the line, only options and KEY go before it: "
                "tenure run [options] KEY -- CMD [ARGS...]"
            )
    args.argv = argv[cut + 1 :]
    return args


def _run(args: argparse.Namespace) -> int:
    from ._run import RunSettings, run_command

    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        args.usage_error("no command given: tenure run KEY -- CMD [ARGS...]")
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


def _watch(args: argparse.Namespace) -> int:
    from ._watch import watch

    return watch(args.url, args.prefix, args.interval, args.count)


def _threads(args: argparse.Namespace) -> int:
    from ._operate import threads

    return threads(args.url, args.namespace, args.json)


def _doctor(args: argparse.Namespace) -> int:
    from ._doctor import doctor

    return doctor(args.url)


def _dashboard_parser(commands: Any) -> None:
    from .dashboard._cli import add_parser

    dashboard = add_parser(commands, _URL_HELP)
    dashboard.set_defaults(handler=_dashboard, usage_error=dashboard.error)


def _dashboard(args: argparse.Namespace) -> int:
    from .dashboard._cli import run

    return run(args)


def _leases_list(args: argparse.Namespace) -> int:
    from ._operate import listing

    return listing(args.url, args.prefix, args.limit, args.json)


def _leases_get(args: argparse.Namespace) -> int:
    from ._operate import get

    return get(args.url, args.key, args.json)


def _leases_revoke(args: argparse.Namespace) -> int:
    from ._operate import revoke

    return revoke(args.url, args.key, args.token)


def _demo(args: argparse.Namespace) -> int:
    try:
        from .demo import DemoSettings, run_demo
    except ImportError as exc:  # rich is the optional "demo" extra
        print(f"tenure demo needs {exc.name!r}: pip install 'tenure[demo]'", file=sys.stderr)
        return 2
    # Every demo option is named after the DemoSettings field it sets.
    chosen = {f.name: getattr(args, f.name) for f in dataclasses.fields(DemoSettings)}
    return run_demo(DemoSettings(**chosen))


# One registration per subcommand, in the order --help lists them.
_COMMANDS: tuple[Callable[[Any], None], ...] = (
    _demo_parser,
    _run_parser,
    _leases_parser,
    _threads_parser,
    _watch_parser,
    _doctor_parser,
    _dashboard_parser,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tenure`` command; returns the exit status."""
    parser = _parser()
    args = _parse(parser, list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help()
        return 2
    handler: Handler = args.handler
    return handler(args)
