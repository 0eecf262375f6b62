"""A chat platform's events webhook on FastAPI, under uvicorn with several worker processes.

    TENURE_URL=redis://127.0.0.1:6379/0 uvicorn --app-dir examples fastapi_threads:app --workers 3

The platform POSTs one event per message (in the shape of Slack's events API:
``{"event": {"type": "message", "channel": …, "thread_ts": …, "text": …,
"client_msg_id": …}}``) to whichever worker its load balancer picks, and
retries a POST that failed. Each worker runs a :class:`tenure.ThreadRuntime` in
the app's lifespan: a message becomes a signal of its conversation thread, and
exactly one run per thread, in one of the workers, reads the thread's messages
in order. A retried POST carries the same ``client_msg_id``, so it stores
nothing new. A worker that dies hands its threads over when its leases expire.

The agent here records what it does in a Redis list (``<prefix>log``), which
the test reads: which run handled which message, with which fencing token.
Settings come from the environment: ``TENURE_URL`` (a backend that carries
signals between processes: ``redis://``, ``sqlite:///``, ``postgresql://``),
``TENURE_EXAMPLE_PREFIX``, ``TENURE_EXAMPLE_TTL_MS``, ``TENURE_EXAMPLE_WORK``
(seconds the agent spends per message).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from fastapi import FastAPI
from pydantic import BaseModel

import tenure

PREFIX = os.environ.get("TENURE_EXAMPLE_PREFIX", "tenure-fastapi-example:")
TTL_MS = int(os.environ.get("TENURE_EXAMPLE_TTL_MS", "15000"))
WORK = float(os.environ.get("TENURE_EXAMPLE_WORK", "0.05"))
URL = os.environ.get("TENURE_URL", "redis://127.0.0.1:6379/0")
LOG_URL = os.environ.get("TENURE_EXAMPLE_LOG_URL", "redis://127.0.0.1:6379/0")


class Message(BaseModel):
    type: str
    channel: str
    thread_ts: str
    text: str
    client_msg_id: str


class Envelope(BaseModel):
    event: Message


log = aioredis.Redis.from_url(LOG_URL)


async def record(step: str, run: tenure.ThreadRun, **fields: Any) -> None:
    entry = {"step": step, "thread": run.thread_key, "run": run.run_id, "token": run.token}
    await log.rpush(f"{PREFIX}log", json.dumps({**entry, "pid": os.getpid(), **fields}))


async def agent(run: tenure.ThreadRun) -> None:
    await record("run-start", run)
    try:
        async for signal in run.signals():
            run.ensure_held()  # before acting: raises LeaseLost once the thread is not ours
            await asyncio.sleep(WORK)  # the agent's work on this message
            await record("handled", run, id=signal.id, text=signal.payload["text"])
    finally:
        await record("run-end", run)


runtime: tenure.ThreadRuntime | None = None


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    global runtime
    options: dict[str, Any] = (
        {"prefix": PREFIX, "quarantine": False} if URL.startswith("redis") else {}
    )
    async with (
        tenure.from_url(URL, **options) as backend,
        tenure.ThreadRuntime(
            backend, agent, ttl_ms=TTL_MS, idle_timeout=0.5, namespace="chat"
        ) as runtime,
    ):
        yield
    await log.aclose()


app = FastAPI(lifespan=lifespan)


@app.post("/events")
async def events(envelope: Envelope) -> dict[str, str]:
    assert runtime is not None
    message = envelope.event
    sent = await runtime.send_signal(
        f"{message.channel}/{message.thread_ts}",
        {"text": message.text},
        signal_id=message.client_msg_id,  # a retried POST stores nothing new
    )
    return {"outcome": sent.outcome, "pid": str(os.getpid())}


@app.get("/health")
async def health() -> dict[str, int]:
    return {"pid": os.getpid()}
