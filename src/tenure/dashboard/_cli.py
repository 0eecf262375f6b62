"""``tenure dashboard``: its options, and serving the app with uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from .._contract import Capability, capabilities_of
from .._errors import BackendUnavailable, ConfigurationError, InvalidArgument
from .._url import default_url, from_url
from .._url_options import redact_url
from ._security import AUTH_ENV, is_loopback, load_credentials

__all__ = ["add_parser", "run"]

EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69


def add_parser(commands: Any, url_help: str) -> Any:
    """Add ``dashboard`` to the ``tenure`` command's subcommands."""
    dashboard = commands.add_parser(
        "dashboard",
        help="a live web view of leases, threads and health, with audited revokes",
        description=(
            "Serve a web UI of the backend's leases (live, filterable, paged), the runtime's "
            "threads, the doctor's checks and an audit log of the actions taken. Listens on "
            "127.0.0.1 unless --host says otherwise; any other address needs authentication: "
            f"--auth-file FILE or ${AUTH_ENV}, holding a bearer token or user:password."
        ),
    )
    dashboard.add_argument("--url", default=None, help=url_help)
    dashboard.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    dashboard.add_argument("--port", type=int, default=8765, help="port to listen on (8765)")
    dashboard.add_argument("--prefix", default="", help="show only keys that start with this")
    dashboard.add_argument(
        "--interval", type=float, default=0.5, help="seconds between looks at the leases (0.5)"
    )
    dashboard.add_argument(
        "--auth-file",
        type=Path,
        default=None,
        help=f"file whose first line is a bearer token or user:password (else ${AUTH_ENV})",
    )
    dashboard.add_argument(
        "--read-only", action="store_true", help="show everything, allow no action"
    )
    dashboard.add_argument(
        "--telemetry",
        action="store_true",
        help="record tenure's metrics of this process (its backend calls) and list them on "
        "the Health page (needs opentelemetry-sdk)",
    )
    dashboard.add_argument(
        "--audit-log",
        type=Path,
        default=None,
        help="append every action to this JSON Lines file (default: kept in memory)",
    )
    return dashboard


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; 2 on a refused configuration, 69 when the backend
    cannot be reached or cannot list leases."""
    try:
        from ._app import DashboardSettings, create_app
    except ImportError as exc:
        print(
            f"tenure dashboard needs {exc.name!r}: pip install 'tenure[dashboard]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    import uvicorn

    url = args.url or default_url()
    try:
        credentials = load_credentials(args.auth_file)
        if credentials is None and not is_loopback(args.host):
            raise ConfigurationError(
                f"refusing to serve on {args.host}, which is not a loopback address, without "
                f"authentication: give --auth-file FILE or ${AUTH_ENV}"
            )
        if not 0 <= args.port < 65536:
            raise InvalidArgument(f"port must be from 0 to 65535, got {args.port}")
        reader = _metric_reader() if args.telemetry else None
        app = create_app(
            DashboardSettings(
                url=url,
                prefix=args.prefix,
                interval=args.interval,
                read_only=args.read_only,
                credentials=credentials,
                audit_path=args.audit_log,
                metric_reader=reader,
                instrument=args.telemetry,
            )
        )
    except (ConfigurationError, InvalidArgument) as exc:
        print(f"tenure dashboard: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        asyncio.run(_check_backend(url, args.prefix))
    except (BackendUnavailable, ConfigurationError, InvalidArgument) as exc:
        print(f"tenure dashboard: {exc} (backend {redact_url(url)})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    mode = " (read-only)" if args.read_only else ""
    print(
        f"tenure dashboard{mode}: {redact_url(url)} on http://{args.host}:{args.port}/",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else EXIT_UNAVAILABLE


def _metric_reader() -> Any:
    """An in-memory reader of this process's metrics, set as OpenTelemetry's meter provider."""
    try:
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    except ImportError:
        raise ConfigurationError(
            "--telemetry needs the OpenTelemetry SDK: pip install 'tenure[otel]' opentelemetry-sdk"
        ) from None
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


async def _check_backend(url: str, prefix: str) -> None:
    """Open the backend once before serving, so that a wrong URL is one line, not a traceback."""
    async with from_url(url) as backend:
        if Capability.OPERATIONS not in capabilities_of(backend):
            raise ConfigurationError(f"{type(backend).__name__} cannot list or revoke leases")
        async for _pair in backend.scan_leases(prefix, 1):
            break
