"""Server-Sent Events for ASGI apps (Starlette, FastAPI): a thread's reply as an SSE response.

::

    @app.post("/threads/{thread_id}/messages")
    async def post(thread_id: str, message: Message, request: Request) -> Response:
        sent = await runtime.send_signal(thread_id, message.text, signal_id=message.id)
        return reply_response(runtime, sent, request)

Each output item is one event: ``id`` is its position, ``event`` its kind,
``data`` the item as JSON (``bytes`` as base64 under ``"data_b64"``). The first
event, ``accepted``, carries the position the reply starts after, so a client
that got anything at all has a ``Last-Event-ID`` to resume from. A request with
``Last-Event-ID`` resumes after it (send the same message again with the same
id: nothing new is stored, and nothing is read twice). A comment line goes out
every ``heartbeat`` seconds without an item, so proxies keep the connection.
The response ends when the reply is complete; when the client goes away, the
server stops reading the thread's output (Starlette cancels the body).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from .._errors import InvalidArgument, OutputTruncated
from ._output import OutputItem
from ._runtime import ThreadRuntime
from ._types import SendResult

__all__ = ["reply_events", "reply_response", "sse_event"]


def sse_event(item: OutputItem) -> str:
    """``item`` as one SSE event (its position as the id, its kind as the event)."""
    doc: dict[str, Any] = {
        "position": item.position,
        "run_id": item.run_id,
        "token": item.token,
        "signal_id": item.signal_id,
        "kind": item.kind,
        "at": item.at,
    }
    if isinstance(item.data, bytes):
        doc["data_b64"] = base64.b64encode(item.data).decode("ascii")
    else:
        doc["data"] = item.data
    return f"id: {item.position}\nevent: {item.kind}\ndata: {json.dumps(doc)}\n\n"


def last_event_id(request: Request) -> int | None:
    """The position in the request's ``Last-Event-ID`` header (``None`` without one)."""
    raw = request.headers.get("last-event-id")
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"Last-Event-ID must be an output position, got {raw!r}") from None
    if value < 0:
        raise InvalidArgument(f"Last-Event-ID must be an output position, got {raw!r}")
    return value


async def reply_events(
    runtime: ThreadRuntime,
    result: SendResult,
    *,
    after: int | None = None,
    heartbeat: float = 15.0,
) -> AsyncGenerator[str, None]:
    """The SSE text of ``result``'s reply: ``accepted``, its items, heartbeats; ends with it."""
    start = result.output_after if after is None else after
    start = start or 0
    yield f"id: {start}\nevent: accepted\ndata: {json.dumps({'signal_id': result.signal_id})}\n\n"
    items = aiter(runtime.reply(result, after=start))
    pending: asyncio.Task[OutputItem] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.get_running_loop().create_task(
                    _next(items), name="tenure-sse-read"
                )
            done, _ = await asyncio.wait({pending}, timeout=heartbeat)
            if not done:
                yield ": heartbeat\n\n"
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            except OutputTruncated as exc:
                yield f"event: truncated\ndata: {json.dumps({'first': exc.first})}\n\n"
                return
            finally:
                pending = None
            yield sse_event(item)
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        with contextlib.suppress(Exception):
            await items.aclose()  # type: ignore[attr-defined]  # an async generator


async def _next(items: AsyncIterator[OutputItem]) -> OutputItem:
    return await anext(items)


def reply_response(
    runtime: ThreadRuntime, result: SendResult, request: Request, *, heartbeat: float = 15.0
) -> StreamingResponse:
    """``result``'s reply as a ``text/event-stream`` response, resumed after ``Last-Event-ID``."""
    return StreamingResponse(
        reply_events(runtime, result, after=last_event_id(request), heartbeat=heartbeat),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
