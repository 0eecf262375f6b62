"""The LangGraph workload: each thread runs a small compiled graph through
:func:`tenure.integrations.langgraph.graph_handler`, on a fenced saver.

The graph (``think -> answer``, a fake chat model, no network) runs each signal
with ``durability="sync"``: three checkpoints per signal (its input, then each
step), every one carrying the writer's fencing token, the signal's id
(LangGraph's ``run_id``) and the tenure run's id in its metadata. Its state keeps
two tallies, ``asked`` and ``answered`` (signal id -> how many times the input
was applied and the answer given, by an adding reducer) and the last two
messages: the final state says how many times each message was answered.

After the run :func:`read_history` reads every thread's checkpoints from the
saver's table in LangGraph's own order (``checkpoint_id``, what
``aget_state_history`` lists) and its final state through the saver, into
``checkpoints.jsonl`` and ``states.jsonl``; :mod:`safety.threads.checker`
judges them with the same functions as the sink's writes.

Only the worker and the runner import this module (it needs ``tenure[langgraph]``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sqlite3
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import psycopg
import psycopg_pool
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from psycopg.rows import dict_row

from tenure import BackendUnavailable, LeaseLost
from tenure.integrations.langgraph import (
    FencedAsyncPostgresSaver,
    FencedAsyncSqliteSaver,
    FenceRefused,
    GraphHandler,
)

from .evidence import Checkpoint, FinalState, Sink

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.pregel import Pregel

    from tenure import Signal, ThreadRun

__all__ = ["build_graph", "open_saver", "postgres_url", "read_history", "recording_handler"]

logger = logging.getLogger("safety.threads.graph")

# What a saver raises while its database is away (a restart, a black hole cut,
# a SQLite lock held by a paused process): waited out while the lease is held.
TRANSIENT = (
    psycopg.OperationalError,
    psycopg_pool.PoolTimeout,
    sqlite3.OperationalError,
    BackendUnavailable,
    OSError,
)


def tally(old: dict[str, int] | None, new: dict[str, int] | None) -> dict[str, int]:
    merged = dict(old or {})
    for key, n in (new or {}).items():
        merged[key] = merged.get(key, 0) + n
    return merged


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    asked: Annotated[dict[str, int], tally]
    answered: Annotated[dict[str, int], tally]


def graph_input(payload: Any) -> dict[str, Any]:
    """A signal's payload (``{"sid": ...}``) as the graph's input: the question."""
    sid = str(payload["sid"])
    return {"messages": [HumanMessage(sid)], "asked": {sid: 1}}


def build_graph(
    saver: BaseCheckpointSaver[Any], rnd: random.Random, work_ms: Sequence[float]
) -> Pregel[Any, Any, Any, Any]:
    """``think`` (1-15 ms of work) -> ``answer`` (a fake chat model's reply)."""
    lo, hi = work_ms

    async def think(state: State) -> dict[str, Any]:
        await asyncio.sleep(rnd.uniform(lo, hi) / 1000)
        return {}

    async def answer(state: State) -> dict[str, Any]:
        question = state["messages"][-1]
        sid = str(question.content)
        model = GenericFakeChatModel(messages=iter([AIMessage(f"re: {sid}")]))
        reply = await model.ainvoke([question])
        # Only the last exchange stays: the tallies are the history that is checked.
        older = [RemoveMessage(id=m.id) for m in state["messages"][:-1] if m.id]
        return {"messages": [*older, reply], "answered": {sid: 1}}

    builder = StateGraph(State).add_sequence([("think", think), ("answer", answer)])
    return builder.add_edge(START, "think").add_edge("answer", END).compile(checkpointer=saver)


class RecordingGraph(GraphHandler):
    """``graph_handler``, as a careful service runs it: a signal whose graph meets a
    database outage runs again (from its last checkpoint) while the lease is held; a
    write the fence refused waits for the runtime to see the lease lost. Each
    finished signal goes to the recording sink too (the runtime's evidence, and how
    the fault injector finds the workers running a thread)."""

    def __init__(
        self, graph: Pregel[Any, Any, Any, Any], sink: Sink, namespace: str, worker: str
    ) -> None:
        super().__init__(graph, ("updates",), None, graph_input, "sync")
        self.sink = sink
        self.namespace = namespace
        self.worker = worker

    def config_for(self, run: ThreadRun, signal: Signal) -> RunnableConfig:
        config = super().config_for(run, signal)
        config["metadata"] = {**config["metadata"], "tenure_run": run.run_id, "worker": self.worker}
        return config

    async def _carefully(self, run: ThreadRun, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await step()
                return
            except FenceRefused:
                # A newer owner wrote the thread: this run is stale; the runtime
                # cancels it once its renewer sees the loss.
                while True:
                    run.ensure_held()
                    await asyncio.sleep(0.05)
            except TRANSIENT as exc:
                run.ensure_held()
                logger.warning("graph of run %s met %r; again", run.run_id, exc)
                await asyncio.sleep(0.1)

    async def _claim(self, run: ThreadRun) -> None:
        await self._carefully(run, lambda: super(RecordingGraph, self)._claim(run))

    async def _stream(self, run: ThreadRun, signal: Signal, graph_input: Any) -> None:
        step = super()._stream
        await self._carefully(run, lambda: step(run, signal, graph_input))

    async def _run_signal(self, run: ThreadRun, signal: Signal) -> None:
        await super()._run_signal(run, signal)
        carried = tuple(c.id for c in signal.coalesced)
        await self.sink.write(run, self.namespace, signal.id, signal.attempt, carried)


def recording_handler(agent: RecordingGraph) -> Any:
    async def handle(run: ThreadRun) -> None:
        try:
            await agent(run)
        except LeaseLost:  # Fenced too
            return

    return handle


def postgres_url(url: str, schema: str) -> str:
    """``url`` with ``schema`` first on the search path (the savers' tables are unqualified)."""
    options = urllib.parse.quote(f"-c search_path={schema}")
    return f"{url}{'&' if '?' in url else '?'}options={options}"


@asynccontextmanager
async def open_saver(where: str, *, fenced: bool = True) -> AsyncIterator[Any]:
    """A saver on ``where`` (a SQLite path or a PostgreSQL URL); PostgreSQL through a
    pool that replaces a connection a restart or a cut broke."""
    if not where.startswith("postgresql"):
        sqlite_cls: Any = FencedAsyncSqliteSaver if fenced else AsyncSqliteSaver
        async with sqlite_cls.from_conn_string(where) as saver:
            yield saver
        return
    pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
        where,
        min_size=1,
        max_size=2,
        open=False,
        timeout=5,
        kwargs={
            "autocommit": True,
            "prepare_threshold": 0,
            "row_factory": dict_row,
            "connect_timeout": 3,
        },
        check=psycopg_pool.AsyncConnectionPool.check_connection,
    )
    await pool.open()
    try:
        pg_cls: Any = FencedAsyncPostgresSaver if fenced else AsyncPostgresSaver
        yield pg_cls(pool)
    finally:
        await pool.close()


async def setup(where: str) -> None:
    """Create the saver's tables and the fence's once, before the workers start."""
    if where.startswith("postgresql"):
        # The saver's migrations cannot run in a pipeline or a pool's transaction.
        async with await psycopg.AsyncConnection.connect(
            where, autocommit=True, prepare_threshold=0, row_factory=dict_row
        ) as conn:
            await FencedAsyncPostgresSaver(conn).setup()
        return
    async with open_saver(where) as saver:
        await saver.setup()


# A thread's history in LangGraph's order, with where the saver stored each
# checkpoint in commit order: SQLite's rowid (a write is one transaction on the
# one writer; a replaced row gets a new one); PostgreSQL keeps no such order.
_HISTORY = (
    "SELECT checkpoint_id, parent_checkpoint_id, CAST(metadata AS TEXT), {stored} "
    "FROM checkpoints WHERE thread_id = {p} AND checkpoint_ns = '' ORDER BY checkpoint_id"
)


def _rows(where: str, thread: str) -> list[tuple[str, str | None, str, int | None]]:
    if where.startswith("postgresql"):
        with psycopg.connect(where) as pg:
            query = _HISTORY.format(p="%s", stored="NULL::bigint")
            found = pg.execute(query, (thread,)).fetchall()
            return [(a, b, c, d) for a, b, c, d in found]
    with sqlite3.connect(where) as db:
        rows = db.execute(_HISTORY.format(p="?", stored="rowid"), (thread,)).fetchall()
    db.close()
    return rows


async def read_history(where: str, threads: Sequence[Sequence[str]], workdir: Path) -> None:
    """Every thread's checkpoint history and final state, into ``workdir``."""
    checkpoints: list[str] = []
    states: list[str] = []
    async with open_saver(where, fenced=False) as saver:
        for namespace, thread in threads:
            rows = await asyncio.to_thread(_rows, where, thread)
            for checkpoint_id, parent, text, stored in rows:
                meta = json.loads(text)
                doc = Checkpoint(
                    namespace,
                    thread,
                    checkpoint_id,
                    parent,
                    meta.get("fencing_token"),
                    str(meta.get("run_id")),
                    str(meta.get("tenure_run")),
                    str(meta.get("worker")),
                    stored,
                )
                checkpoints.append(json.dumps(asdict(doc)))
            latest = await saver.aget_tuple({"configurable": {"thread_id": thread}})
            values = latest.checkpoint["channel_values"] if latest is not None else {}
            state = FinalState(
                namespace, thread, dict(values.get("asked", {})), dict(values.get("answered", {}))
            )
            states.append(json.dumps(asdict(state)))
    (workdir / "checkpoints.jsonl").write_text("".join(line + "\n" for line in checkpoints))
    (workdir / "states.jsonl").write_text("".join(line + "\n" for line in states))
