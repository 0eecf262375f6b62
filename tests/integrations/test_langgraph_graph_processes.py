"""``graph_handler`` across real processes, on real SQLite files (leases, signals and
output in one, checkpoints in another) and on PostgreSQL (a schema for each): the owner SIGKILLed in the middle of a
graph, the next owner resumes from the last checkpoint and the thread completes;
an ``interrupt()`` answered by a signal sent from another process, run by the owner;
a ``rollback`` sent from another process removes the owner's interrupted run.

The reader is this process: a runtime on its own backend object that is never
started (it reads the output, it runs nothing).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sqlite3
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

import tenure
from tenure.integrations.langgraph import resume
from tenure.runtime import OutputItem, ThreadRun, ThreadRuntime
from tests.postgres.helpers import drop_schema, new_schema
from tests.runtime.test_runtime_processes import Worker
from tests.support.agent_graph import SLOW_ENV, build_agent

from .langgraph_support import create_schema, open_saver, schema_url

ROOT = Path(__file__).resolve().parents[2]
THREAD = "chat-1"


class Workers:
    """Runtime processes of one namespace: ``leases`` (a tenure URL) and ``checkpoints``
    (a SQLite path or a PostgreSQL URL)."""

    def __init__(self, leases: str, checkpoints: str) -> None:
        self.leases = leases
        self.checkpoints = checkpoints
        self.postgres = checkpoints.startswith("postgresql")
        self.workers: list[Worker] = []

    async def start(self, name: str, slow: float = 0.0) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.integrations.langgraph_graph_worker",
            self.leases,
            self.checkpoints,
            name,
            cwd=ROOT,
            env={**os.environ, SLOW_ENV: str(slow)},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = Worker(name, proc)
        self.workers.append(worker)
        await worker.wait(lambda: bool(worker.of("ready")), timeout=60)
        return worker

    async def state(self) -> dict[str, Any]:
        opened: Any = (AsyncPostgresSaver if self.postgres else AsyncSqliteSaver).from_conn_string
        async with opened(self.checkpoints) as saver:
            graph = build_agent(saver)
            snapshot = await graph.aget_state({"configurable": {"thread_id": THREAD}})
            return dict(snapshot.values)

    def checkpoints_by(self, column: str) -> list[Any]:
        """``column`` of the thread's checkpoints, as JSON text, oldest first: in commit
        order on SQLite (rowid), in order of their time-ordered ids on PostgreSQL."""
        if self.postgres:
            with psycopg.connect(self.checkpoints) as pg:
                rows = pg.execute(
                    f"SELECT {column}::text FROM checkpoints WHERE thread_id = %s "
                    "ORDER BY checkpoint_id",
                    (THREAD,),
                ).fetchall()
            return [r for (r,) in rows]
        with sqlite3.connect(self.checkpoints) as conn:
            rows = conn.execute(
                f"SELECT CAST({column} AS TEXT) FROM checkpoints WHERE thread_id = ? ORDER BY rowid",
                (THREAD,),
            ).fetchall()
        conn.close()
        return [r for (r,) in rows]


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(the runtime's URL, where the checkpoints go)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/leases.db", str(tmp_path / "checkpoints.db")
        return
    url: str = request.getfixturevalue("postgres_url")
    checkpoints, leases = new_schema(), new_schema()
    create_schema(url, checkpoints)
    yield f"{url}?schema={leases}", schema_url(url, checkpoints)
    drop_schema(url, checkpoints)
    drop_schema(url, leases)


@pytest_asyncio.fixture
async def workers(stores: tuple[str, str]) -> AsyncIterator[Workers]:
    leases, checkpoints = stores
    kind = "postgres-async" if checkpoints.startswith("postgresql") else "sqlite-async"
    async with open_saver(kind, checkpoints, fenced=True):
        pass  # the tables exist before the workers start at once
    spawned = Workers(leases, checkpoints)
    try:
        yield spawned
    finally:
        for worker in spawned.workers:
            if worker.proc.returncode is None:
                worker.resume()
        await asyncio.gather(*(w.quit() for w in spawned.workers))


async def nothing(run: ThreadRun) -> None:
    async for _ in run.signals():
        pass


@pytest_asyncio.fixture
async def reader(workers: Workers) -> AsyncIterator[ThreadRuntime]:
    async with tenure.from_url(workers.leases) as backend:
        runtime = ThreadRuntime(backend, nothing, output=True)
        try:
            yield runtime
        finally:
            await runtime.aclose()


async def read_until(
    runtime: ThreadRuntime, done: Any, after: int = 0, timeout: float = 60
) -> list[OutputItem]:
    items: list[OutputItem] = []
    async with asyncio.timeout(timeout):
        async for item in runtime.follow(THREAD, after=after):
            items.append(item)
            if done(items):
                return items
    raise AssertionError("unreachable")


def updated(item: OutputItem) -> str | None:
    return next(iter(item.data)) if item.kind == "updates" else None


def finished(signal_id: str) -> Any:
    return lambda items: any(
        i.kind == "signal_finished" and i.signal_id == signal_id for i in items
    )


@pytest.mark.slow
@pytest.mark.asyncio
async def test_an_owner_killed_mid_graph_is_resumed_from_its_last_checkpoint(
    workers: Workers, reader: ThreadRuntime
) -> None:
    first = await workers.start("a", slow=600)
    sent = await first.send(THREAD, {"messages": [("user", "slow answer please")]})
    before = await read_until(reader, lambda items: any(i.kind == "custom" for i in items))
    first.kill()  # inside the slow step: "think" is checkpointed, "slow" is not
    await first.proc.wait()
    await workers.start("b")  # its sweep takes the thread once a's lease expires
    items = await read_until(reader, finished(sent["signal_id"]), after=before[-1].position)

    kinds = [i.kind for i in items]
    assert "run_lost" in kinds
    resumed = [updated(i) for i in items if updated(i)]
    assert resumed == ["slow", "chat", "approve"]  # "think" did not run again
    assert "".join(i.data["content"] for i in items if i.kind == "messages") == (
        "you said: slow answer please"
    )
    state = await workers.state()
    assert state["steps"] == ["think", "slow", "chat", "approve"]
    assert [(m.type, m.content) for m in state["messages"]] == [
        ("human", "slow answer please"),
        ("ai", "you said: slow answer please"),
    ]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_an_interrupt_is_resumed_by_a_signal_sent_from_another_process(
    workers: Workers, reader: ThreadRuntime
) -> None:
    owner = await workers.start("owner")
    other = await workers.start("other")
    asked = await owner.send(THREAD, {"messages": [("user", "approve the refund")]})
    items = await read_until(reader, finished(asked["signal_id"]))
    (question,) = [i.data for i in items if i.kind == "interrupt"]
    assert question[0]["value"] == {"question": "approve?"}
    runs = {i.run_id: i.data["process"] for i in items if i.kind == "run_started"}

    answered = await other.send(THREAD, resume("granted"))
    assert answered["outcome"] == "deliver"  # the owner's run is still active: routed to it
    items = await read_until(reader, finished(answered["signal_id"]), after=items[-1].position)
    ran = {i.run_id for i in items if i.signal_id == answered["signal_id"]}
    runs.update({i.run_id: i.data["process"] for i in items if i.kind == "run_started"})
    assert {runs[r] for r in ran} == {"owner"}
    assert [updated(i) for i in items if updated(i)] == ["approve"]
    state = await workers.state()
    assert state["messages"][-1].content == "approved: granted"
    assert state["steps"] == ["think", "slow", "chat", "approve"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_an_owner_paused_mid_graph_past_its_ttl_writes_nothing_after_its_successor(
    workers: Workers, reader: ThreadRuntime
) -> None:
    paused = await workers.start("a", slow=2)  # its step ends while it is stopped
    sent = await paused.send(THREAD, {"messages": [("user", "slow answer please")]})
    before = await read_until(reader, lambda items: any(i.kind == "custom" for i in items))
    paused.pause()
    await workers.start("b")
    items = await read_until(reader, finished(sent["signal_id"]), after=before[-1].position)
    paused.resume()
    await paused.wait(lambda: bool(paused.of("event", kind="run_end")), timeout=60)
    (end,) = paused.of("event", kind="run_end")
    assert end["detail"] in ("lost", "failed")  # stopped at its next step, or refused there

    tokens = [int(json.loads(m)["fencing_token"]) for m in workers.checkpoints_by("metadata")]
    assert [(a, b) for a, b in itertools.pairwise(tokens) if b < a] == []
    successor = {i.run_id for i in items if i.kind == "run_started"}
    assert {i.run_id for i in items if i.kind == "messages"} <= successor
    state = await workers.state()
    assert [(m.type, m.content) for m in state["messages"]] == [
        ("human", "slow answer please"),
        ("ai", "you said: slow answer please"),
    ]
    assert state["steps"] == ["think", "slow", "chat", "approve"]
    head = await reader.last_position(THREAD)
    everything = await read_until(reader, lambda got: got[-1].position >= head)
    first_of_successor = min(i.position for i in everything if i.run_id in successor)
    late = [i for i in everything if i.position > first_of_successor and i.kind != "run_lost"]
    assert {i.run_id for i in late} <= successor  # nothing of the paused owner after it


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_rollback_sent_from_another_process_removes_the_owners_run(
    workers: Workers, reader: ThreadRuntime
) -> None:
    owner = await workers.start("owner", slow=600)
    other = await workers.start("other")
    await owner.send(THREAD, {"messages": [("user", "slow answer please")]})
    before = await read_until(reader, lambda items: any(i.kind == "custom" for i in items))
    again = await other.send(THREAD, {"messages": [("user", "never mind")]}, policy="rollback")
    await read_until(reader, finished(again["signal_id"]), after=before[-1].position)
    await owner.wait(lambda: bool(owner.of("event", kind="rollback")))
    assert [e["detail"] for e in owner.of("event", kind="rollback")] == ["ok"]

    state = await workers.state()
    assert [(m.type, m.content) for m in state["messages"]] == [
        ("human", "never mind"),
        ("ai", "you said: never mind"),
    ]
    assert state["steps"] == ["think", "slow", "chat", "approve"]
    runs = [json.loads(m).get("run_id") for m in workers.checkpoints_by("metadata")]
    assert set(runs) == {again["signal_id"]}  # none of the rolled-back run
