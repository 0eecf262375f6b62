"""A LangGraph agent behind several workers: any worker takes a message, one runs the thread.

    TENURE_URL=redis://127.0.0.1:6379/0 \\
    LANGGRAPH_CHECKPOINTS=postgresql://127.0.0.1:5432/postgres \\
    uvicorn --app-dir examples langgraph_service:app --workers 3

``POST /threads/{thread_id}/messages`` with ``{"text": ..., "message_id": ...}``
answers with the agent's reply as Server-Sent Events: the message becomes a
signal of the thread, the one worker that owns the thread runs the graph
(``graph_handler``: a fake chat model streams its answer token by token, no
network), and the worker that took the POST streams the thread's output back.
The checkpoints go to PostgreSQL (or a SQLite file: ``LANGGRAPH_CHECKPOINTS=path``)
through a fenced saver, so a worker that lost the thread writes nothing.

A message starting with ``/confirm`` makes the agent ask first (LangGraph's
``interrupt()``): the reply ends with an ``interrupt`` event, and
``POST /threads/{thread_id}/resume`` with ``{"value": ...}``, to any worker,
resumes the graph where the owner stopped it. ``GET /threads/{thread_id}`` gives
the thread's messages from the checkpoints. ``"policy"`` in a message chooses
what it does to a reply still running (``enqueue``, ``reject``, ``interrupt``,
``rollback``: the interrupted run's checkpoints are removed).

Each response says which worker took it (``X-Worker``), and each reply which
worker ran the graph (a ``custom`` event ``{"worker": ...}``). Settings: ``TENURE_URL``,
``LANGGRAPH_CHECKPOINTS``, ``TENURE_EXAMPLE_TTL_MS`` (lease TTL),
``TENURE_EXAMPLE_IDLE`` (seconds a worker keeps an idle thread).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt
from pydantic import BaseModel

import tenure
from tenure.integrations.langgraph import (
    FencedAsyncPostgresSaver,
    FencedAsyncSqliteSaver,
    graph_handler,
    resume,
)
from tenure.runtime.sse import reply_response

URL = os.environ.get("TENURE_URL", "redis://127.0.0.1:6379/0")
CHECKPOINTS = os.environ.get("LANGGRAPH_CHECKPOINTS", "postgresql://127.0.0.1:5432/postgres")
TTL_MS = int(os.environ.get("TENURE_EXAMPLE_TTL_MS", "15000"))
IDLE = float(os.environ.get("TENURE_EXAMPLE_IDLE", "5"))
WORKER = f"worker-{os.getpid()}"


class Message(BaseModel):
    text: str
    message_id: str | None = None
    policy: Literal["enqueue", "reject", "interrupt", "rollback"] | None = None


class Resume(BaseModel):
    value: Any
    message_id: str | None = None


async def chat(state: MessagesState) -> dict[str, Any]:
    """The model: a fake one that echoes, streamed token by token like a real one."""
    text = str(state["messages"][-1].content)
    get_stream_writer()({"worker": WORKER})  # to show which worker runs the thread
    model = GenericFakeChatModel(messages=iter([AIMessage(content=f"you said: {text}")]))
    return {"messages": [await model.ainvoke(state["messages"])]}


def confirm(state: MessagesState) -> dict[str, Any]:
    """Ask a human before answering a ``/confirm`` message (resumed from any worker)."""
    if not str(state["messages"][-1].content).startswith("/confirm"):
        return {}
    answer = interrupt({"question": "go ahead?"})
    return {"messages": [AIMessage(content=f"confirmed: {answer}")]}


builder = StateGraph(MessagesState)
builder.add_node("confirm", confirm)
builder.add_node("chat", chat)
builder.add_edge(START, "confirm")
builder.add_edge("confirm", "chat")
builder.add_edge("chat", END)


def open_saver() -> AbstractAsyncContextManager[Any]:
    if CHECKPOINTS.startswith(("postgres://", "postgresql://")):
        return FencedAsyncPostgresSaver.from_conn_string(CHECKPOINTS)
    return FencedAsyncSqliteSaver.from_conn_string(CHECKPOINTS)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with open_saver() as saver, tenure.from_url(URL) as backend:
        # Every worker starts at once: one at a time creates the tables.
        async with tenure.hold(backend, "langgraph-service:setup", WORKER, 30_000, wait=60):
            await saver.setup()
        graph = builder.compile(checkpointer=saver)
        agent = graph_handler(graph, stream_mode=("updates", "messages", "custom"))
        async with tenure.ThreadRuntime(
            backend,
            agent,
            ttl_ms=TTL_MS,
            idle_timeout=IDLE,
            process_id=WORKER,
            output=True,
            on_rollback=agent.on_rollback,
        ) as runtime:
            app.state.runtime, app.state.graph = runtime, graph
            yield


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok", "worker": WORKER}


async def _send(
    request: Request, thread_id: str, payload: Any, message_id: str | None, policy: Any = None
) -> Response:
    runtime: tenure.ThreadRuntime = request.app.state.runtime
    try:
        sent = await runtime.send_signal(thread_id, payload, signal_id=message_id, policy=policy)
    except tenure.InvalidArgument as exc:
        return JSONResponse({"error": str(exc)}, status_code=422)
    if sent.outcome == "rejected":
        return JSONResponse({"error": "the thread is busy"}, status_code=409)
    response = reply_response(runtime, sent, request, heartbeat=5.0)
    response.headers["X-Worker"] = WORKER
    return response


@app.post("/threads/{thread_id}/messages")
async def post_message(thread_id: str, message: Message, request: Request) -> Response:
    payload = {"messages": [{"role": "user", "content": message.text}]}
    return await _send(request, thread_id, payload, message.message_id, message.policy)


@app.post("/threads/{thread_id}/resume")
async def post_resume(thread_id: str, answer: Resume, request: Request) -> Response:
    return await _send(request, thread_id, resume(answer.value), answer.message_id)


@app.get("/threads/{thread_id}")
async def get_thread(thread_id: str, request: Request) -> dict[str, Any]:
    state = await request.app.state.graph.aget_state({"configurable": {"thread_id": thread_id}})
    messages = state.values.get("messages", [])
    return {"messages": [{"type": m.type, "content": m.content} for m in messages]}
