"""The dashboard as an ASGI application (Starlette): routes, start-up, and what
every answer goes through (authentication, browser security headers, errors).

Pages are rendered on the server (Jinja2, escaped); the package's own small
script keeps a page live through Server-Sent Events and runs the countdowns.
Nothing is fetched from the internet. See :mod:`._pages` and :mod:`._actions`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .._contract import Capability, capabilities_of
from .._errors import ConfigurationError, InvalidArgument, TenureError
from .._url import from_url
from ..telemetry import instrument
from ._actions import Actions
from ._context import Context, DashboardSettings, Refused
from ._pages import Pages
from ._security import Credentials

__all__ = ["DashboardSettings", "create_app"]

Handler = Callable[[Request], Awaitable[Response]]


def create_app(settings: DashboardSettings) -> Starlette:
    """The dashboard for ``settings``; the backend opens when the app starts (lifespan)."""
    ctx = Context(settings)
    pages, actions = Pages(ctx), Actions(ctx)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with from_url(settings.url) as opened:
            if Capability.OPERATIONS not in capabilities_of(opened):
                raise ConfigurationError(f"{type(opened).__name__} cannot list or revoke leases")
            backend = instrument(opened) if settings.instrument else opened
            watcher = ctx.attach(backend)
            task = asyncio.create_task(watcher.run(), name="tenure-dashboard-watcher")
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await ctx.aclose()

    routes = [
        Route("/", pages.home),
        Route("/leases", _guarded(pages.leases)),
        Route("/key", _guarded(pages.key)),
        Route("/threads", _guarded(pages.threads)),
        Route("/thread", _guarded(pages.thread)),
        Route("/health", _guarded(pages.health)),
        Route("/audit", _guarded(pages.audit)),
        Route("/audit.jsonl", _guarded(pages.audit_lines)),
        Route("/stats.json", _guarded(pages.stats)),
        Route("/events", _guarded(pages.events)),
        Route("/static/{name}", pages.static),
        Route("/revoke", _guarded(actions.confirm_revoke), methods=["GET"]),
        Route("/revoke", _guarded(actions.revoke), methods=["POST"]),
        Route("/bulk", _guarded(actions.bulk_dry_run), methods=["GET"]),
        Route("/bulk", _guarded(actions.bulk_revoke), methods=["POST"]),
        Route("/cancel", _guarded(actions.confirm_cancel), methods=["GET"]),
        Route("/cancel", _guarded(actions.cancel), methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(_Headers)
    if settings.credentials is not None:
        app.add_middleware(_Authenticate, credentials=settings.credentials)
    return app


def _guarded(handler: Handler) -> Handler:
    """``handler`` with bad input and refusals answered as plain text, never a traceback."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except Refused as exc:
            return PlainTextResponse(str(exc), status_code=exc.status)
        except InvalidArgument as exc:
            return PlainTextResponse(str(exc), status_code=400)
        except TenureError as exc:
            return PlainTextResponse(f"backend: {exc}", status_code=503)

    return guarded


class _Authenticate:
    """Every request needs the credentials (pure ASGI, so streaming is untouched)."""

    def __init__(self, app: ASGIApp, credentials: Credentials) -> None:
        self.app = app
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = dict(scope["headers"]).get(b"authorization")
        user = self.credentials.check(raw.decode("latin-1") if raw else None)
        if user is None:
            response = PlainTextResponse(
                "authentication required",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="tenure dashboard", charset="UTF-8"'},
            )
            await response(scope, receive, send)
            return
        scope["tenure_user"] = user
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
