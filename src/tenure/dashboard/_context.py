"""What the dashboard's pages and actions share: its settings, templates, CSRF
key and audit log, and, once the app has started, the backend with the
shared watcher and shared reads (threads, doctor)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from .._errors import ConfigurationError, InvalidArgument, OutputTruncated
from .._operate import _shown
from .._url_options import redact_url
from .._validate import check_prefix
from ..runtime import OutputItem, ThreadRun, ThreadRuntime
from ..runtime._identity import is_opening
from ..runtime._names import ThreadNames
from ..runtime._status import ThreadStatus, thread_statuses
from ._audit import AuditLog
from ._security import Credentials, Csrf
from ._watcher import STATES, LeaseFilter, LeaseWatcher, Shared, last_handover

__all__ = ["PAGE_SIZE", "Context", "DashboardSettings", "Refused", "parse_token", "who"]

PAGE_SIZE = 50
#: A thread's page shows this many of its newest output items.
RECENT_OUTPUT = 20
#: Threads whose output is kept for pages (the least recently shown are forgotten).
_OUTPUTS_KEPT = 256
DEFAULT_NAMESPACE = "tenure.thread"


@dataclass(frozen=True)
class DashboardSettings:
    """What ``tenure dashboard`` was started with (the credentials are never shown)."""

    url: str
    prefix: str = ""
    interval: float = 0.5
    read_only: bool = False
    credentials: Credentials | None = None
    audit_path: Path | None = None
    #: Extra things the Health page lists (name → value).
    counters: Mapping[str, Callable[[], object]] = field(default_factory=dict)
    #: An OpenTelemetry SDK metric reader read on demand (``InMemoryMetricReader``):
    #: the Health page lists the ``tenure.*`` metrics it has.
    metric_reader: Any = None
    #: Wrap the backend with :func:`tenure.telemetry.instrument` (each call counted).
    instrument: bool = False


class Refused(Exception):
    """A request the dashboard will not serve; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Context:
    def __init__(self, settings: DashboardSettings) -> None:
        if not 0 < settings.interval <= 3600:
            raise InvalidArgument(
                f"interval must be above 0 and at most 3600 seconds, got {settings.interval}"
            )
        check_prefix(settings.prefix)
        self.settings = settings
        self.templates = _templates()
        self.audit = AuditLog(settings.audit_path)
        self.csrf = Csrf()
        self.backend: Any = None
        self.watcher = LeaseWatcher(None, settings.prefix, settings.interval)
        self.doctor = Shared(self._diagnose, max_age=10.0)
        self._threads: dict[str, Shared[list[ThreadStatus]]] = {}
        self._runtimes: dict[str, ThreadRuntime] = {}
        self._outputs: OrderedDict[tuple[str, str], Shared[list[OutputItem] | None]] = OrderedDict()

    def attach(self, backend: Any) -> LeaseWatcher:
        """Read from ``backend`` from now on; returns the watcher to run."""
        self.backend = backend
        self.watcher = LeaseWatcher(backend, self.settings.prefix, self.settings.interval)
        return self.watcher

    def runtime_of(self, namespace: str) -> ThreadRuntime:
        """A runtime of ``namespace`` that is never started: it runs nothing, it sends
        the runtime's own cancel (``ThreadRuntime.cancel``) to a run elsewhere and
        reads the threads' output."""
        runtime = self._runtimes.get(namespace)
        if runtime is None:
            try:
                runtime = ThreadRuntime(
                    self.backend,
                    _runs_nothing,
                    namespace=namespace,
                    output=True,
                    process_id="tenure-dashboard",
                )
            except ConfigurationError as exc:
                raise Refused(409, f"this backend cannot cancel a thread's run: {exc}") from None
            self._runtimes[namespace] = runtime
        return runtime

    async def aclose(self) -> None:
        """Close what the actions opened on the backend (before the backend closes)."""
        runtimes, self._runtimes = list(self._runtimes.values()), {}
        for runtime in runtimes:
            await runtime.aclose()

    # -- shared reads ----------------------------------------------------------

    def output_of(self, names: ThreadNames, thread_key: str) -> Shared[list[OutputItem] | None]:
        """The thread's newest output items (``None``: this backend keeps no output),
        read at most once per look however many pages show them."""
        at = (names.namespace, thread_key)
        shared = self._outputs.get(at)
        if shared is None:

            async def read() -> list[OutputItem] | None:
                try:
                    runtime = self.runtime_of(names.namespace)
                except Refused:
                    return None
                return await recent_output(runtime, thread_key, RECENT_OUTPUT)

            shared = self._outputs[at] = Shared(read, self.settings.interval)
            while len(self._outputs) > _OUTPUTS_KEPT:
                self._outputs.popitem(last=False)
        else:
            self._outputs.move_to_end(at)
        return shared

    def threads_of(self, namespace: str) -> Shared[list[ThreadStatus]]:
        shared = self._threads.get(namespace)
        if shared is None:
            names = ThreadNames(namespace)

            async def read() -> list[ThreadStatus]:
                return await thread_statuses(self.backend, self.backend, names)

            shared = self._threads[namespace] = Shared(read, self.settings.interval)
        return shared

    async def _diagnose(self) -> list[Any]:
        diagnose = getattr(self.backend, "diagnose", None)
        return [] if diagnose is None else list(await diagnose())

    # -- rendering ---------------------------------------------------------------

    def page(self, request: Request, name: str, **values: Any) -> Response:
        """Template ``name`` with what every page shows, and the browser's CSRF cookie."""
        cookie = request.cookies.get(Csrf.COOKIE)
        fresh = cookie is None
        if cookie is None:
            cookie = Csrf.new_cookie()
        html = self.templates.get_template(name).render(
            backend=redact_url(self.settings.url),
            prefix=self.settings.prefix,
            read_only=self.settings.read_only,
            who=who(request),
            csrf=self.csrf.token_for(cookie),
            error=self.watcher.error,
            since=self.watcher.version,
            **values,
        )
        response = HTMLResponse(html)
        if fresh:
            secure = request.url.scheme == "https"
            response.set_cookie(
                Csrf.COOKIE, cookie, httponly=True, samesite="strict", secure=secure
            )
        return response

    def fragment(self, name: str, **values: Any) -> str:
        """A live part of a page (sent by Server-Sent Events)."""
        return self.templates.get_template(name).render(read_only=self.settings.read_only, **values)

    def lease_filter(self, request: Request) -> LeaseFilter:
        q = request.query_params
        state = q.get("state", "")
        if state and state not in STATES:
            raise InvalidArgument(f"state must be one of {', '.join(STATES)}, got {state!r}")
        prefix = q.get("prefix", "")
        if prefix:
            check_prefix(prefix)
        return LeaseFilter(prefix, q.get("owner", ""), state, _page_number(q.get("page", "1")))

    async def first_leases_values(self, chosen: LeaseFilter) -> dict[str, Any]:
        """The leases page: at once from the first look's first leases while it is
        under way (page 1 only), from the last whole look otherwise."""
        if chosen.page == 1:
            read = await self.watcher.first_leases(PAGE_SIZE)
            if read is not None:
                rows = self.watcher.preview(read, chosen, PAGE_SIZE)
                values = self.leases_values(chosen)
                values.update(rows=rows, reading=len(read), first_shown=1 if rows else 0)
                return values
        await self.watcher.ready_for_a_page()
        return self.leases_values(chosen)

    def leases_values(self, chosen: LeaseFilter) -> dict[str, Any]:
        rows, total = self.watcher.select(chosen, PAGE_SIZE)
        return {
            "reading": None,
            "rows": rows,
            "total": total,
            "live": len(self.watcher.known),
            "filter": chosen,
            "pages": max(1, -(-total // PAGE_SIZE)),
            "states": STATES,
            "first_shown": (chosen.page - 1) * PAGE_SIZE + 1 if rows else 0,
        }

    @staticmethod
    def namespace_of(request: Request) -> str:
        namespace = request.query_params.get("ns", "") or DEFAULT_NAMESPACE
        ThreadNames(namespace)
        return namespace

    @staticmethod
    def thread_of(namespace: str, thread_key: str) -> tuple[ThreadNames, str]:
        """The namespace's names and the thread key (both checked), from a query or a form."""
        names = ThreadNames(namespace or DEFAULT_NAMESPACE)
        names.name(thread_key)
        return names, thread_key

    def thread_values(
        self,
        names: ThreadNames,
        thread_key: str,
        found: list[ThreadStatus],
        output: list[OutputItem] | None,
    ) -> dict[str, Any]:
        """One thread's page: its status (``None``: no run, nothing pending), its lease's history."""
        status = next((t for t in found if t.thread_key == thread_key), None)
        lease = names.name(thread_key)
        events = self.watcher.history(lease)
        return {
            "namespace": names.namespace,
            "thread_key": thread_key,
            "status": status,
            # A session still opening (phase 0) has no run yet: nothing to cancel.
            "cancellable": status is not None
            and status.owner is not None
            and not is_opening(status.owner),
            "lease": lease,
            "output": output,
            "events": events,
            "handover": last_handover(events),
        }

    def threads_values(self, namespace: str, found: list[ThreadStatus]) -> dict[str, Any]:
        names = ThreadNames(namespace)
        leases = {t.thread_key: names.name(t.thread_key) for t in found}
        handovers = {key: last_handover(self.watcher.history(name)) for key, name in leases.items()}
        return {"namespace": namespace, "threads": found, "leases": leases, "handovers": handovers}


async def recent_output(runtime: ThreadRuntime, thread_key: str, count: int) -> list[OutputItem]:
    """The newest ``count`` output items of ``thread_key`` at most, oldest first."""
    head = await runtime.last_position(thread_key)
    after = max(0, head - count)
    items: list[OutputItem] = []
    try:
        async with asyncio.timeout(10):  # the items up to head exist: never waits long
            while after < head:
                try:
                    async for item in runtime.follow(thread_key, after=after):
                        items.append(item)
                        if item.position >= head:
                            return items
                except OutputTruncated as exc:  # retention dropped some meanwhile
                    after, items = exc.first - 1, []
    except TimeoutError:
        pass
    return items


def _shown_data(data: Any) -> str:
    if isinstance(data, bytes):
        return f"({len(data)} bytes)"
    text = json.dumps(data, ensure_ascii=False)
    return text if len(text) <= 200 else text[:199] + "…"


async def _runs_nothing(run: ThreadRun) -> None:
    """The handler of the dashboard's runtimes, which are never started."""


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tenure.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["shown"] = _shown
    env.filters["data"] = _shown_data
    env.filters["ttl"] = lambda ms: f"{ms / 1000:.1f}s"
    env.filters["clock"] = lambda at: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    env.filters["query"] = lambda values: urlencode(values)
    return env


def who(request: Request) -> str:
    """Who sent ``request``: the authenticated user, or ``local`` without authentication."""
    return str(request.scope.get("tenure_user") or "local")


def _page_number(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise InvalidArgument(f"page must be a number, got {text!r}") from None
    if not 1 <= number <= 10**9:
        raise InvalidArgument(f"page must be from 1, got {number}")
    return number


def parse_token(text: str) -> int:
    try:
        token = int(text)
    except ValueError:
        raise InvalidArgument(f"token must be a number, got {text!r}") from None
    if not 1 <= token < 2**63:
        raise InvalidArgument(f"token must be from 1 to 2**63-1, got {token}")
    return token
