"""A compiled graph run per thread by ``graph_handler``, on a real SQLite file (and
the shared PostgreSQL for the rollback): its stream reaches the thread's output,
an ``interrupt()`` is resumed by a signal, and the ``rollback`` policy removes the
checkpoints of the run it interrupted, fenced like the thread's other writes."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_asyncio
from langgraph.types import Command

import tenure
from tenure import InvalidArgument, ThreadRuntime
from tenure.fencing import FenceRefused
from tenure.integrations.langgraph import (
    FencedAsyncPostgresSaver,
    FencedAsyncSqliteSaver,
    fencing_token,
    graph_handler,
    resume,
)
from tenure.integrations.langgraph._graph import merged_input
from tests.postgres.helpers import drop_schema, new_schema
from tests.support.agent_graph import build_agent

from .langgraph_support import checkpoint, config, create_schema, history, put, schema_url

THREAD = "chat-1"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(saver kind, where its checkpoints go)."""
    if request.param == "sqlite":
        yield "sqlite", str(tmp_path / "checkpoints.db")
        return
    url: str = request.getfixturevalue("postgres_url")
    schema = new_schema()
    create_schema(url, schema)
    yield "postgres", schema_url(url, schema)
    drop_schema(url, schema)


@pytest_asyncio.fixture
async def saver(store: tuple[str, str]) -> AsyncIterator[Any]:
    kind, where = store
    cls: Any = FencedAsyncSqliteSaver if kind == "sqlite" else FencedAsyncPostgresSaver
    async with cls.from_conn_string(where) as s:
        await s.setup()
        yield s


@pytest_asyncio.fixture
async def backend(tmp_path: Path) -> AsyncIterator[Any]:
    async with tenure.from_url(f"sqlite:///{tmp_path}/leases.db") as b:
        yield b


def gated() -> tuple[asyncio.Event, asyncio.Event, Callable[[], Awaitable[None]]]:
    """The agent's ``slow`` step as a gate: ``started`` once a run reaches it, and
    the run waits there until ``gate`` is set."""
    started, gate = asyncio.Event(), asyncio.Event()

    async def pause() -> None:
        started.set()
        await gate.wait()

    return started, gate, pause


def messages(state: Any) -> list[tuple[str, str]]:
    return [(m.type, m.content) for m in state.values["messages"]]


@pytest.mark.asyncio
async def test_the_stream_reaches_the_output_and_an_interrupt_is_resumed_by_a_signal(
    tmp_path: Path, backend: Any
) -> None:
    async with FencedAsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.db")) as saver:
        await saver.setup()
        graph = build_agent(saver)
        agent = graph_handler(graph)
        async with ThreadRuntime(backend, agent, output=True, idle_timeout=0.2) as runtime:
            sent = await runtime.send_signal(THREAD, {"messages": [("user", "hello")]})
            items = await runtime.wait_reply(sent, timeout=30)
            tokens = "".join(i.data["content"] for i in items if i.kind == "messages")
            assert tokens == "you said: hello"
            updates = [next(iter(i.data)) for i in items if i.kind == "updates"]
            assert updates == ["think", "slow", "chat", "approve"]
            assert {i.token for i in items} == {sent_token(items)}

            asked = await runtime.send_signal(THREAD, {"messages": [("user", "approve it")]})
            items = await runtime.wait_reply(asked, timeout=30)
            (question,) = [i.data for i in items if i.kind == "interrupt"]
            assert question[0]["value"] == {"question": "approve?"}

            answered = await runtime.send_signal(THREAD, resume("yes"))
            items = await runtime.wait_reply(answered, timeout=30)
            assert [next(iter(i.data)) for i in items if i.kind == "updates"] == ["approve"]
        state = await graph.aget_state({"configurable": {"thread_id": THREAD}})
        assert messages(state)[-1] == ("ai", "approved: yes")
        assert state.values["steps"].count("think") == 2  # the resume ran no step again


def sent_token(items: list[Any]) -> int:
    return int(items[0].token)


@pytest.mark.asyncio
@pytest.mark.parametrize("policy", ["rollback", "interrupt"])
async def test_rollback_removes_the_interrupted_runs_checkpoints(
    saver: Any, backend: Any, policy: str
) -> None:
    started, _gate, pause = gated()  # never opened: the run is interrupted there
    graph = build_agent(saver, pause)
    agent = graph_handler(graph)
    async with ThreadRuntime(
        backend, agent, output=True, idle_timeout=5, on_rollback=agent.on_rollback
    ) as runtime:
        first = await runtime.send_signal(THREAD, {"messages": [("user", "hello")]})
        await runtime.wait_reply(first, timeout=30)
        busy = await runtime.send_signal(THREAD, {"messages": [("user", "slow one")]})
        await asyncio.wait_for(started.wait(), 30)
        again = await runtime.send_signal(
            THREAD,
            {"messages": [("user", "never mind")]},
            policy=policy,  # type: ignore[arg-type]
        )
        await runtime.wait_reply(again, timeout=30)
    state = await graph.aget_state({"configurable": {"thread_id": THREAD}})
    busy_checkpoints = [
        t for t in await history(saver, THREAD) if t.metadata.get("run_id") == busy.signal_id
    ]
    if policy == "rollback":
        assert messages(state) == [
            ("human", "hello"),
            ("ai", "you said: hello"),
            ("human", "never mind"),
            ("ai", "you said: never mind"),
        ]
        assert busy_checkpoints == []
    else:  # what the rollback removes: the interrupted run's input and steps
        assert ("human", "slow one") in messages(state)
        assert busy_checkpoints
    assert agent._interrupted == {}  # nothing kept for a rollback that never comes


class _ReadRecorder(FencedAsyncSqliteSaver):
    """Notes the fence's token for a thread each time the graph reads its state."""

    seen: list[int | None]

    async def aget_tuple(self, config: Any) -> Any:
        key = str(config["configurable"]["thread_id"]).encode()
        rows = await self._raw_conn.execute_fetchall(
            "SELECT token FROM tenure_fence WHERE key = ?", (key,)
        )
        self.seen.append(int(next(iter(rows))[0]) if rows else None)
        return await super().aget_tuple(config)


@pytest.mark.asyncio
async def test_each_run_fences_the_thread_before_the_graph_reads_it(
    tmp_path: Path, backend: Any
) -> None:
    """Before a run's graph reads the thread's state, the fence already holds the
    run's token: a stale owner's checkpoint cannot land between that read and
    the run's first write (which would fork the thread's history)."""
    async with _ReadRecorder.from_conn_string(str(tmp_path / "cp.db")) as opened:
        saver = cast(_ReadRecorder, opened)
        saver.seen = []
        await saver.setup()
        with fencing_token(1):  # an older owner held the thread
            await saver.aclaim_thread(THREAD)
        tokens: list[int | None] = []
        agent = graph_handler(build_agent(saver))

        async def handler(run: tenure.ThreadRun) -> None:
            tokens.append(run.token)
            saver.seen.clear()
            await agent(run)

        async with ThreadRuntime(backend, handler, output=True, idle_timeout=0.2) as runtime:
            sent = await runtime.send_signal(THREAD, {"messages": [("user", "hello")]})
            await runtime.wait_reply(sent, timeout=30)
        assert tokens and tokens[-1] is not None and tokens[-1] > 1
        assert saver.seen and saver.seen[0] == tokens[-1]


@pytest.mark.asyncio
async def test_a_signal_delivered_again_after_later_ones_ran_is_not_answered_twice(
    saver: Any, backend: Any
) -> None:
    """An owner that finished a signal and died before acknowledging it leaves it to
    be delivered again, after the signals it ran later: LangGraph resumes only from
    the thread's newest checkpoint, so the input would be applied a second time.
    The handler sees that an earlier delivery ran the graph to its end and skips it;
    one that the newest checkpoint shows unfinished still resumes."""
    agent = graph_handler(build_agent(saver))
    replayed: list[Any] = []

    async def handler(run: tenure.ThreadRun) -> None:
        # graph_handler's loop, with the redelivery forced: "again" hands the
        # first signal back as its owner's successor would get it (attempt 2).
        await agent._claim(run)
        async for signal in run.signals():
            if signal.payload == "again":
                await agent._run_signal(run, dataclasses.replace(replayed[0], attempt=2))
                continue
            replayed.append(signal)
            await agent._run_signal(run, signal)

    async with ThreadRuntime(backend, handler, output=True, idle_timeout=0.2) as runtime:
        for text in ("hello", "and then"):
            sent = await runtime.send_signal(THREAD, {"messages": [("user", text)]})
            await runtime.wait_reply(sent, timeout=30)
        sent = await runtime.send_signal(THREAD, "again")
        await runtime.wait_reply(sent, timeout=30)
    state = await agent.graph.aget_state({"configurable": {"thread_id": THREAD}})
    assert [m for m in messages(state) if m[0] == "human"] == [
        ("human", "hello"),
        ("human", "and then"),
    ]
    assert state.values["steps"].count("chat") == 2


@pytest.mark.asyncio
@pytest.mark.parametrize("policy", ["coalesce", "debounce"])
async def test_messages_coalesced_while_the_agent_is_busy_are_answered_once_all_seen(
    saver: Any, backend: Any, policy: str
) -> None:
    """Three messages sent while the agent answers a first one, coalescing (or
    debounced): the graph runs once more, on all three, in order, and answers once.
    Before, graph_handler gave the graph the newest message only: the two it
    replaced were settled as coalesced and never reached the agent."""
    started, gate, pause = gated()
    graph = build_agent(saver, pause)
    agent = graph_handler(graph)
    how: Any = tenure.Debounce(0.2) if policy == "debounce" else policy
    async with ThreadRuntime(backend, agent, output=True, idle_timeout=5) as runtime:
        busy = await runtime.send_signal(THREAD, {"messages": [("user", "slow one")]})
        await asyncio.wait_for(started.wait(), 30)
        sent = [
            await runtime.send_signal(THREAD, {"messages": [("user", text)]}, policy=how)
            for text in ("one", "two", "three")
        ]
        gate.set()
        await runtime.wait_reply(busy, timeout=30)
        await runtime.wait_reply(sent[-1], timeout=30)
    state = await graph.aget_state({"configurable": {"thread_id": THREAD}})
    assert messages(state) == [
        ("human", "slow one"),
        ("ai", "you said: slow one"),
        ("human", "one"),
        ("human", "two"),
        ("human", "three"),
        ("ai", "you said: three"),
    ]
    assert state.values["steps"].count("chat") == 2


def test_inputs_merge_lists_in_order_and_keep_the_newest_of_anything_else() -> None:
    inputs = [
        {"messages": [("user", "a")], "mood": "calm"},
        {"messages": (("user", "b"),), "mood": "cross", "extra": 1},
        {"messages": [("user", "c")]},
    ]
    assert merged_input(inputs) == {
        "messages": [("user", "a"), ("user", "b"), ("user", "c")],
        "mood": "cross",
        "extra": 1,
    }
    assert merged_input([{"messages": []}, resume("yes")]) is not None  # a plain mapping
    assert merged_input([{"messages": []}, Command(resume="yes")]) is None


@pytest.mark.asyncio
async def test_removing_a_runs_checkpoints_is_fenced(saver: Any) -> None:
    cfg = config(THREAD, 7)
    cfg["metadata"] = {"run_id": "r-7"}
    await put(saver, cfg, checkpoint("a"))
    with fencing_token(5), pytest.raises(FenceRefused):
        await saver.adelete_for_run(THREAD, "r-7")
    with pytest.raises(FenceRefused):  # no token at all
        await saver.adelete_for_run(THREAD, "r-7")
    assert len(await history(saver, THREAD)) == 1
    with fencing_token(7):
        await saver.adelete_for_run(THREAD, "r-7")
    assert await history(saver, THREAD) == []


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    from langgraph.graph import START, MessagesState, StateGraph

    builder = StateGraph(MessagesState)
    builder.add_node("n", lambda s: {})
    builder.add_edge(START, "n")
    with pytest.raises(InvalidArgument, match="checkpointer"):
        graph_handler(builder.compile())
    graph = builder.compile(checkpointer=FencedAsyncSqliteSaver.__new__(FencedAsyncSqliteSaver))
    with pytest.raises(InvalidArgument, match="stream_mode"):
        graph_handler(graph, stream_mode=["tokens"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="durability"):
        graph_handler(graph, durability="never")  # type: ignore[arg-type]
