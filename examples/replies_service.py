"""A chat service whose replies stream back from whichever worker owns the thread.

    TENURE_URL=redis://127.0.0.1:6379/0 uvicorn --app-dir examples replies_service:app --workers 3

``POST /threads/{thread_id}/messages`` with ``{"text": ..., "message_id": ...}``
answers with the reply as Server-Sent Events (:mod:`tenure.runtime.sse`). The
message becomes a signal of the thread; the one worker that owns the thread
runs the agent, which appends its reply word by word to the thread's output;
the worker that took the POST streams that output back, wherever the agent
runs. If the owner dies mid-reply, another worker takes the thread over when
its lease expires and answers the same message again: the client sees the
partial reply, a ``run_lost`` event, then the whole reply. A client whose
connection broke POSTs the same message again (same ``message_id``: nothing new
is stored) with ``Last-Event-ID``, and reads on from there.

``POST /threads/{thread_id}/cancel`` stops the thread's current run, wherever it
runs. The agent's words carry the pid of the worker that typed them, to show
where it ran. Settings: ``TENURE_URL``, ``TENURE_EXAMPLE_TTL_MS`` (lease TTL),
``TENURE_EXAMPLE_DELAY`` (seconds between words).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

import tenure
from tenure.runtime.sse import reply_response

URL = os.environ.get("TENURE_URL", "redis://127.0.0.1:6379/0")
TTL_MS = int(os.environ.get("TENURE_EXAMPLE_TTL_MS", "15000"))
DELAY = float(os.environ.get("TENURE_EXAMPLE_DELAY", "0.05"))


class Message(BaseModel):
    text: str
    message_id: str | None = None


async def agent(run: tenure.ThreadRun) -> None:
    """Answer each message by echoing it, one word at a time (a model would stream tokens)."""
    async for signal in run.signals():
        words = f"you said: {signal.payload['text']}".split()
        for word in words:
            await run.append({"text": word, "worker": os.getpid()})
            await asyncio.sleep(DELAY)
        await run.append({"text": " ".join(words), "worker": os.getpid()}, kind="final")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with (
        tenure.from_url(URL) as backend,
        tenure.ThreadRuntime(backend, agent, ttl_ms=TTL_MS, output=True) as runtime,
    ):
        app.state.runtime = runtime
        yield


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/threads/{thread_id}/messages")
async def post_message(thread_id: str, message: Message, request: Request) -> Response:
    runtime: tenure.ThreadRuntime = request.app.state.runtime
    try:
        sent = await runtime.send_signal(
            thread_id, {"text": message.text}, signal_id=message.message_id
        )
    except tenure.InvalidArgument as exc:
        return JSONResponse({"error": str(exc)}, status_code=422)
    return reply_response(runtime, sent, request, heartbeat=5.0)


@app.post("/threads/{thread_id}/cancel")
async def cancel(thread_id: str, request: Request) -> dict[str, str | None]:
    runtime: tenure.ThreadRuntime = request.app.state.runtime
    return {"cancelled": await runtime.cancel(thread_id)}
