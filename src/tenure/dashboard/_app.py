"""The dashboard as an ASGI application (Starlette): pages, actions, live updates.

Every page is rendered on the server (Jinja2, escaped); a small script of the
package's own keeps a page live through Server-Sent Events and runs the
countdowns. Nothing is fetched from the internet. Reads come from the shared
:class:`LeaseWatcher` (leases, history) or a :class:`Shared` read (threads,
doctor), so neither the pages nor the live updates add backend load per
browser; actions call the operations API (``revoke_lease`` with the token
the operator saw) and are written to the audit log first thing after.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit

import jinja2
import markupsafe
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .._contract import Capability, capabilities_of
from .._errors import ConfigurationError, InvalidArgument, TenureError
from .._operate import _shown
from .._url import from_url, redact_url
from .._validate import check_name, check_prefix
from ..runtime._names import ThreadNames
from ..runtime._status import ThreadStatus, thread_statuses
from ._audit import AuditLog
from ._security import Credentials, Csrf
from ._watcher import STATES, LeaseFilter, LeaseRow, LeaseWatcher, Shared, last_handover

__all__ = ["DashboardSettings", "create_app"]

PAGE_SIZE = 50
#: A bulk action acts on at most this many leases (the dry run says when more match).
BULK_MOST = 500
#: A live page gets at most one update per this many seconds, whatever the backend does.
MIN_GAP_S = 0.2
KEEPALIVE_S = 15.0
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
    #: Extra things the Health page lists (name → value), e.g. telemetry counters.
    counters: Mapping[str, Callable[[], object]] = field(default_factory=dict)


class _State:
    """What the running app holds: the backend, the watcher and the shared reads."""

    def __init__(self, settings: DashboardSettings, backend: Any) -> None:
        self.settings = settings
        self.backend = backend
        self.watcher = LeaseWatcher(backend, settings.prefix, settings.interval)
        self.threads: dict[str, Shared[list[ThreadStatus]]] = {}
        self.doctor = Shared(self._diagnose, max_age=10.0)

    def threads_of(self, namespace: str) -> Shared[list[ThreadStatus]]:
        shared = self.threads.get(namespace)
        if shared is None:
            names = ThreadNames(namespace)

            async def read() -> list[ThreadStatus]:
                return await thread_statuses(self.backend, self.backend, names)

            shared = self.threads[namespace] = Shared(read, self.settings.interval)
        return shared

    async def _diagnose(self) -> list[Any]:
        diagnose = getattr(self.backend, "diagnose", None)
        return [] if diagnose is None else list(await diagnose())


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tenure.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["shown"] = _shown
    env.filters["ttl"] = lambda ms: f"{ms / 1000:.1f}s"
    env.filters["clock"] = lambda at: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    env.filters["query"] = lambda values: urlencode(values)
    return env


def create_app(settings: DashboardSettings) -> Starlette:
    """The dashboard for ``settings``; the backend opens when the app starts (lifespan)."""
    if settings.interval <= 0:
        raise InvalidArgument(f"interval must be above 0 seconds, got {settings.interval}")
    check_prefix(settings.prefix)
    templates = _templates()
    audit = AuditLog(settings.audit_path)
    csrf = Csrf()
    holder: dict[str, _State] = {}
    static = resources.files("tenure.dashboard") / "static"

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with from_url(settings.url) as backend:
            if Capability.OPERATIONS not in capabilities_of(backend):
                raise ConfigurationError(f"{type(backend).__name__} cannot list or revoke leases")
            state = holder["state"] = _State(settings, backend)
            task = asyncio.create_task(state.watcher.run(), name="tenure-dashboard-watcher")
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def page(request: Request, name: str, **values: Any) -> Response:
        """Template ``name`` with the values every page uses, and the CSRF cookie."""
        cookie = request.cookies.get(Csrf.COOKIE)
        fresh = cookie is None
        if cookie is None:
            cookie = Csrf.new_cookie()
        state = holder["state"]
        html = templates.get_template(name).render(
            request=request,
            backend=redact_url(settings.url),
            prefix=settings.prefix,
            read_only=settings.read_only,
            who=_who(request),
            csrf=csrf.token_for(cookie),
            error=state.watcher.error,
            **values,
        )
        response = HTMLResponse(html, status_code=values.get("status", 200))
        if fresh:
            response.set_cookie(
                Csrf.COOKIE, cookie, httponly=True, samesite="strict", secure=_is_https(request)
            )
        return response

    # -- leases ----------------------------------------------------------------

    def lease_filter(request: Request) -> LeaseFilter:
        q = request.query_params
        state = q.get("state", "")
        if state and state not in STATES:
            raise InvalidArgument(f"state must be one of {', '.join(STATES)}, got {state!r}")
        prefix = q.get("prefix", "")
        if prefix:
            check_prefix(prefix)
        return LeaseFilter(prefix, q.get("owner", ""), state, _page_number(q.get("page", "1")))

    def leases_values(chosen: LeaseFilter) -> dict[str, Any]:
        watcher = holder["state"].watcher
        rows, total = watcher.select(chosen, PAGE_SIZE)
        pages = max(1, -(-total // PAGE_SIZE))
        return {
            "rows": rows,
            "total": total,
            "live": len(watcher.known),
            "filter": chosen,
            "pages": pages,
            "states": STATES,
            "first_shown": (chosen.page - 1) * PAGE_SIZE + 1 if rows else 0,
        }

    async def leases(request: Request) -> Response:
        await holder["state"].watcher.ready_for_a_page()
        chosen = lease_filter(request)
        return page(request, "leases.html", view="leases", **leases_values(chosen))

    async def key_page(request: Request) -> Response:
        key = check_name(request.query_params.get("k", ""), "key")
        watcher = holder["state"].watcher
        await watcher.ready_for_a_page()
        return page(
            request,
            "key.html",
            view="key",
            key=key,
            row=watcher.row(key),
            events=watcher.history(key),
            done=request.query_params.get("done", ""),
        )

    # -- actions -----------------------------------------------------------------

    async def confirm_revoke(request: Request) -> Response:
        key = check_name(request.query_params.get("k", ""), "key")
        token = _token(request.query_params.get("token", ""))
        record = await holder["state"].backend.get_lease(key)
        return page(request, "confirm.html", view="confirm", key=key, token=token, record=record)

    async def revoke(request: Request) -> Response:
        form = await acting(request)
        key = check_name(form.get("k", ""), "key")
        token = _token(form.get("token", ""))
        revoked = await revoke_one(request, key, token, form.get("owner", ""))
        done = "revoked" if revoked else "unchanged"
        return RedirectResponse(f"/key?{urlencode({'k': key, 'done': done})}", status_code=303)

    async def revoke_one(
        request: Request, key: str, token: int, owner: str, chosen: LeaseFilter | None = None
    ) -> bool:
        state = holder["state"]
        revoked = bool(await state.backend.revoke_lease(key, token))
        entry: dict[str, Any] = {
            "who": _who(request),
            "client": request.client.host if request.client else None,
            "action": "revoke",
            "key": key,
            "token": token,
            "owner": owner,
            "outcome": "revoked" if revoked else "unchanged: the lease no longer carries the token",
        }
        if chosen is not None:
            entry["filter"] = chosen.query(page=1)
        audit.write(**entry)
        if revoked:
            state.watcher.revoked(key, token, f"revoked by {entry['who']} (token {token})")
        return revoked

    async def bulk_dry_run(request: Request) -> Response:
        chosen = lease_filter(request)
        state = holder["state"]
        await state.watcher.ready_for_a_page()
        found: list[LeaseRow] = []
        more = 0
        prefix = chosen.prefix if chosen.prefix.startswith(settings.prefix) else settings.prefix
        async for key, record in state.backend.scan_leases(prefix):
            row = state.watcher.row(key)
            if row is None or row.token != record.token:
                row = LeaseRow(key, record.owner, record.token, record.ttl_ms, "ok")
            if not chosen.matches(row):
                continue
            if len(found) < BULK_MOST:
                found.append(row)
            else:
                more += 1
        return page(request, "bulk.html", view="bulk", filter=chosen, rows=found, more=more)

    async def bulk_revoke(request: Request) -> Response:
        form = await acting(request)
        chosen = LeaseFilter(
            form.get("prefix", ""), form.get("owner_filter", ""), form.get("state", "")
        )
        keys, tokens, owners = form.getlist("k"), form.getlist("token"), form.getlist("owner")
        if not len(keys) == len(tokens) == len(owners) or len(keys) > BULK_MOST:
            raise InvalidArgument("the bulk revoke's list of leases is malformed")
        done = []
        for key, token, owner in zip(keys, tokens, owners, strict=True):
            checked_key, checked_token = check_name(key, "key"), _token(token)
            revoked = await revoke_one(request, checked_key, checked_token, owner, chosen)
            done.append((checked_key, owner, checked_token, revoked))
        count = sum(outcome for *_, outcome in done)
        return page(request, "bulk_done.html", view="bulk", filter=chosen, done=done, revoked=count)

    async def acting(request: Request) -> _Form:
        """The action's form, once the dashboard may act and the CSRF token is right."""
        if settings.read_only:
            raise _Refused(403, "this dashboard is read-only")
        origin = request.headers.get("origin")
        if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
            raise _Refused(403, "refused: the request comes from another site")
        form = await _read_form(request)
        if not csrf.check(request.cookies.get(Csrf.COOKIE), form.get(Csrf.FIELD)):
            raise _Refused(403, "refused: missing or wrong CSRF token (reload the page and retry)")
        return form

    # -- threads, health, audit ------------------------------------------------------

    def namespace_of(request: Request) -> str:
        namespace = request.query_params.get("ns", "") or DEFAULT_NAMESPACE
        ThreadNames(namespace)
        return namespace

    def threads_values(namespace: str, found: list[ThreadStatus]) -> dict[str, Any]:
        names = ThreadNames(namespace)
        watcher = holder["state"].watcher
        leases = {t.thread_key: names.name(t.thread_key) for t in found}
        handovers = {key: last_handover(watcher.history(name)) for key, name in leases.items()}
        return {"threads": found, "leases": leases, "handovers": handovers}

    async def threads(request: Request) -> Response:
        namespace = namespace_of(request)
        found = await holder["state"].threads_of(namespace).get()
        return page(
            request,
            "threads.html",
            view="threads",
            namespace=namespace,
            **threads_values(namespace, found),
        )

    async def health(request: Request) -> Response:
        state = holder["state"]
        findings = await state.doctor.get()
        watcher = state.watcher
        counters: dict[str, object] = {
            "live leases seen": len(watcher.known),
            "scans": watcher.scans,
            "last scan": f"{watcher.last_scan_s * 1000:.0f} ms",
            "scan interval": f"{settings.interval:g} s",
            "live pages": watcher.viewers,
        }
        counters.update({name: read() for name, read in settings.counters.items()})
        return page(request, "health.html", view="health", findings=findings, counters=counters)

    async def audit_page(request: Request) -> Response:
        return page(request, "audit.html", view="audit", entries=audit.recent())

    async def audit_lines(request: Request) -> Response:
        return PlainTextResponse(audit.lines(), media_type="application/jsonl")

    async def stats(request: Request) -> Response:
        state = holder["state"]
        return JSONResponse(
            {
                "scans": state.watcher.scans,
                "live": len(state.watcher.known),
                "live_pages": state.watcher.viewers,
                "last_scan_ms": round(state.watcher.last_scan_s * 1000, 1),
            }
        )

    # -- live updates --------------------------------------------------------------------

    async def fragment(view: str, request: Request) -> str:
        state = holder["state"]
        if view == "leases":
            chosen = lease_filter(request)
            return templates.get_template("_leases_rows.html").render(
                read_only=settings.read_only, **leases_values(chosen)
            )
        if view == "key":
            key = check_name(request.query_params.get("k", ""), "key")
            return templates.get_template("_key_live.html").render(
                read_only=settings.read_only,
                key=key,
                row=state.watcher.row(key),
                events=state.watcher.history(key),
            )
        if view == "threads":
            namespace = namespace_of(request)
            found = await state.threads_of(namespace).get()
            return templates.get_template("_threads_rows.html").render(
                **threads_values(namespace, found)
            )
        raise InvalidArgument(f"no live view {view!r}")

    async def events(request: Request) -> Response:
        view = request.query_params.get("view", "")
        await fragment(view, request)  # a bad view or filter is refused before streaming
        state = holder["state"]

        async def stream() -> AsyncIterator[str]:
            state.watcher.viewers += 1
            state.watcher.watched()
            try:
                version = state.watcher.version
                last = ""
                yield "retry: 1000\n\n"
                while True:
                    seen = await state.watcher.wait_change(version, KEEPALIVE_S)
                    if seen == version:
                        yield ": keep-alive\n\n"
                        continue
                    version = seen
                    try:
                        html = await fragment(view, request)
                    except TenureError as exc:
                        html = f"<p class=error>{_escape(str(exc))}</p>"
                    if html == last:
                        continue
                    last = html
                    yield (
                        "event: update\n"
                        + "".join(f"data: {line}\n" for line in html.split("\n"))
                        + "\n"
                    )
                    await asyncio.sleep(MIN_GAP_S)
            finally:
                state.watcher.viewers -= 1

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def static_file(request: Request) -> Response:
        name = request.path_params["name"]
        kinds = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
        if name not in kinds:
            return PlainTextResponse("not found", status_code=404)
        return Response((static / name).read_bytes(), media_type=kinds[name])

    async def home(request: Request) -> Response:
        return RedirectResponse("/leases", status_code=307)

    routes = [
        Route("/", home),
        Route("/leases", _guarded(leases)),
        Route("/key", _guarded(key_page)),
        Route("/revoke", _guarded(confirm_revoke), methods=["GET"]),
        Route("/revoke", _guarded(revoke), methods=["POST"]),
        Route("/bulk", _guarded(bulk_dry_run), methods=["GET"]),
        Route("/bulk", _guarded(bulk_revoke), methods=["POST"]),
        Route("/threads", _guarded(threads)),
        Route("/health", _guarded(health)),
        Route("/audit", _guarded(audit_page)),
        Route("/audit.jsonl", _guarded(audit_lines)),
        Route("/stats.json", _guarded(stats)),
        Route("/events", _guarded(events)),
        Route("/static/{name}", static_file),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(_Headers)
    if settings.credentials is not None:
        app.add_middleware(_Authenticate, credentials=settings.credentials)
    return app


#: The largest form an action takes (a bulk revoke of BULK_MOST long keys fits).
_FORM_MOST = 4 << 20


class _Form:
    """An action's urlencoded form (parsed here: no multipart parser needed)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._pairs = pairs

    def get(self, name: str, default: str = "") -> str:
        return next((value for field, value in self._pairs if field == name), default)

    def getlist(self, name: str) -> list[str]:
        return [value for field, value in self._pairs if field == name]


async def _read_form(request: Request) -> _Form:
    kind = request.headers.get("content-type", "").partition(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        raise _Refused(415, "an action takes a form (application/x-www-form-urlencoded)")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _FORM_MOST:
            raise _Refused(413, "the form is too large")
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise InvalidArgument("the form is not UTF-8") from None
    return _Form(pairs)


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _guarded(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` with bad input and refusals answered as plain text, never a traceback."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except _Refused as exc:
            return PlainTextResponse(str(exc), status_code=exc.status)
        except InvalidArgument as exc:
            return PlainTextResponse(str(exc), status_code=400)
        except TenureError as exc:
            return PlainTextResponse(f"backend: {exc}", status_code=503)

    return guarded


def _who(request: Request) -> str:
    return str(request.scope.get("tenure_user") or "local")


def _is_https(request: Request) -> bool:
    return request.url.scheme == "https"


def _page_number(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise InvalidArgument(f"page must be a number, got {text!r}") from None
    if not 1 <= number <= 10**9:
        raise InvalidArgument(f"page must be from 1, got {number}")
    return number


def _token(text: str) -> int:
    try:
        token = int(text)
    except ValueError:
        raise InvalidArgument(f"token must be a number, got {text!r}") from None
    if not 1 <= token < 2**63:
        raise InvalidArgument(f"token must be from 1 to 2**63-1, got {token}")
    return token


def _escape(text: str) -> str:
    return str(markupsafe.escape(text))


class _Authenticate:
    """Every request needs the credentials (pure ASGI, so streaming is untouched)."""

    def __init__(self, app: ASGIApp, credentials: Credentials) -> None:
        self.app = app
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        raw = headers.get(b"authorization")
        who = self.credentials.check(raw.decode("latin-1") if raw else None)
        if who is None:
            response = PlainTextResponse(
                "authentication required",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="tenure dashboard", charset="UTF-8"'},
            )
            await response(scope, receive, send)
            return
        scope["tenure_user"] = who
        await self.app(scope, receive, send)


class _Headers:
    """What every answer says to the browser: nothing from elsewhere, never framed."""

    HEADERS: ClassVar[list[tuple[bytes, bytes]]] = [
        (
            b"content-security-policy",
            b"default-src 'self'; frame-ancestors 'none'; form-action 'self'",
        ),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"x-frame-options", b"DENY"),
    ]

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, sending)
