"""The pages (leases, a key, threads, health, audit) and their live updates.

Every page is rendered on the server from the shared watcher or a shared
read; a live page gets its changing part again through Server-Sent Events,
at most once per look and only when it changed, so neither pages nor live
updates add backend load per browser.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from importlib import resources

import markupsafe
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

from .._errors import InvalidArgument, TenureError
from .._validate import check_name
from ._context import Context
from ._telemetry import metric_rows

__all__ = ["Pages"]

#: A live page gets at most one update per this many seconds, whatever the backend does.
MIN_GAP_S = 0.2
KEEPALIVE_S = 15.0
_STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}


def _since(text: str, default: int) -> int:
    """The watcher's version a page was rendered from (``default`` when not a number)."""
    try:
        return int(text)
    except ValueError:
        return default


class Pages:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/leases", status_code=307)

    async def leases(self, request: Request) -> Response:
        chosen = self.ctx.lease_filter(request)
        values = await self.ctx.first_leases_values(chosen)
        return self.ctx.page(request, "leases.html", view="leases", **values)

    async def key(self, request: Request) -> Response:
        key = check_name(request.query_params.get("k", ""), "key")
        watcher = self.ctx.watcher
        await watcher.ready_for_a_page()
        return self.ctx.page(
            request,
            "key.html",
            view="key",
            key=key,
            row=watcher.row(key),
            events=watcher.history(key),
            done=request.query_params.get("done", ""),
        )

    async def threads(self, request: Request) -> Response:
        namespace = self.ctx.namespace_of(request)
        found = await self.ctx.threads_of(namespace).get()
        return self.ctx.page(
            request,
            "threads.html",
            view="threads",
            **self.ctx.threads_values(namespace, found),
        )

    async def thread(self, request: Request) -> Response:
        names, thread_key = self.ctx.thread_of(
            request.query_params.get("ns", ""), request.query_params.get("t", "")
        )
        await self.ctx.watcher.ready_for_a_page()
        found = await self.ctx.threads_of(names.namespace).get()
        output = await self.ctx.output_of(names, thread_key).get()
        return self.ctx.page(
            request,
            "thread.html",
            view="thread",
            done=request.query_params.get("done", ""),
            **self.ctx.thread_values(names, thread_key, found, output),
        )

    async def health(self, request: Request) -> Response:
        findings = await self.ctx.doctor.get()
        watcher = self.ctx.watcher
        counters: dict[str, object] = {
            "live leases seen": len(watcher.known),
            "scans": watcher.scans,
            "last scan": f"{watcher.last_scan_s * 1000:.0f} ms",
            "scan interval": f"{watcher.interval:g} s ({watcher.idle_interval:g} s unwatched)",
            "live pages": watcher.viewers,
        }
        counters.update({name: read() for name, read in self.ctx.settings.counters.items()})
        reader = self.ctx.settings.metric_reader
        return self.ctx.page(
            request,
            "health.html",
            view="health",
            findings=findings,
            counters=counters,
            metrics=None if reader is None else metric_rows(reader),
        )

    async def audit(self, request: Request) -> Response:
        return self.ctx.page(request, "audit.html", view="audit", entries=self.ctx.audit.recent())

    async def audit_lines(self, request: Request) -> Response:
        return PlainTextResponse(self.ctx.audit.lines(), media_type="application/jsonl")

    async def stats(self, request: Request) -> Response:
        watcher = self.ctx.watcher
        return JSONResponse(
            {
                "scans": watcher.scans,
                "live": len(watcher.known),
                "live_pages": watcher.viewers,
                "last_scan_ms": round(watcher.last_scan_s * 1000, 1),
                "scanning_s": round(watcher.scanning_s, 3),
            }
        )

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return PlainTextResponse("not found", status_code=404)
        data = (resources.files("tenure.dashboard") / "static" / name).read_bytes()
        return Response(data, media_type=_STATIC[name])

    # -- live updates --------------------------------------------------------------

    async def _fragment(self, view: str, request: Request) -> str:
        ctx = self.ctx
        if view == "leases":
            return ctx.fragment("_leases_rows.html", **ctx.leases_values(ctx.lease_filter(request)))
        if view == "key":
            key = check_name(request.query_params.get("k", ""), "key")
            return ctx.fragment(
                "_key_live.html",
                key=key,
                row=ctx.watcher.row(key),
                events=ctx.watcher.history(key),
            )
        if view == "threads":
            namespace = ctx.namespace_of(request)
            found = await ctx.threads_of(namespace).get()
            return ctx.fragment("_threads_rows.html", **ctx.threads_values(namespace, found))
        if view == "thread":
            names, thread_key = ctx.thread_of(
                request.query_params.get("ns", ""), request.query_params.get("t", "")
            )
            found = await ctx.threads_of(names.namespace).get()
            output = await ctx.output_of(names, thread_key).get()
            return ctx.fragment(
                "_thread_live.html", **ctx.thread_values(names, thread_key, found, output)
            )
        raise InvalidArgument(f"no live view {view!r}")

    async def events(self, request: Request) -> Response:
        """The live part of the page ``view`` (its query as the page's), as Server-Sent Events."""
        view = request.query_params.get("view", "")
        await self._fragment(view, request)  # a bad view or filter is refused before streaming
        return StreamingResponse(
            self._stream(view, request),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def _stream(self, view: str, request: Request) -> AsyncIterator[str]:
        watcher = self.ctx.watcher
        watcher.viewers += 1
        watcher.watched()
        try:
            # From the look the page was rendered from: a look that ended between the
            # page and this stream is sent at once, not at the next change.
            version = _since(request.query_params.get("since", ""), watcher.version)
            last = ""
            yield "retry: 1000\n\n"
            while True:
                seen = await watcher.wait_change(version, KEEPALIVE_S)
                if seen == version:
                    yield ": keep-alive\n\n"
                    continue
                version = seen
                try:
                    html = await self._fragment(view, request)
                except TenureError as exc:
                    html = f"<p class=error>{markupsafe.escape(str(exc))}</p>"
                if html == last:
                    continue
                last = html
                # An event's lines end at CR as well as LF: a CR in a key must not end one.
                lines = html.replace("\r", "&#13;").split("\n")
                yield "event: update\n" + "".join(f"data: {line}\n" for line in lines)
                yield "\n"
                await asyncio.sleep(MIN_GAP_S)
        finally:
            watcher.viewers -= 1
