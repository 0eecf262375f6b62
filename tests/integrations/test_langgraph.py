"""The fenced LangGraph savers: every write of a stale or token-less run is
refused, atomically with the write, on each saver and each way of opening it."""

from __future__ import annotations

import asyncio
import operator
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
import pytest_asyncio
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from tenure import ConfigurationError, MemoryPubSub, Signal, ThreadRun, ThreadRuntime
from tenure.fencing import FenceRefused
from tenure.integrations.langgraph import (
    FENCING_TOKEN,
    FencedAsyncSqliteSaver,
    fenced_config,
    fencing_token,
)
from tenure.testing import eventually
from tests.postgres.helpers import drop_schema, new_schema

from .langgraph_support import (
    KINDS,
    checkpoint,
    claim_thread,
    config,
    create_schema,
    delete_thread,
    history,
    latest,
    open_saver,
    prune,
    put,
    put_writes,
    schema_url,
)


class State(TypedDict):
    said: Annotated[list[str], operator.add]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def where(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    if kind.startswith("sqlite"):
        yield str(tmp_path / "checkpoints.db")
        return
    url: str = request.getfixturevalue("postgres_url")
    schema = new_schema()
    create_schema(url, schema)
    yield schema_url(url, schema)
    drop_schema(url, schema)


@pytest_asyncio.fixture
async def saver(kind: str, where: str) -> AsyncIterator[Any]:
    async with open_saver(kind, where, fenced=True) as s:
        yield s


@pytest.mark.asyncio
async def test_a_lower_token_is_refused_and_nothing_of_the_write_is_kept(saver: Any) -> None:
    first = await put(saver, config("t", 5), checkpoint("a"))
    await put(saver, config("t", 5), checkpoint("b"))  # the same owner writes again
    await put_writes(
        saver,
        config("t", 5, checkpoint_id=first["configurable"]["checkpoint_id"]),
        [("value", "w5")],
    )
    newer = await put(saver, config("t", 7), checkpoint("c"))
    with pytest.raises(FenceRefused) as refused:
        await put(saver, config("t", 6), checkpoint("stale"))
    assert (refused.value.token, refused.value.highest, refused.value.key) == (6, 7, "t")
    stale_writes = config("t", 6, checkpoint_id=newer["configurable"]["checkpoint_id"])
    with pytest.raises(FenceRefused):
        await put_writes(saver, stale_writes, [("value", "stale")])
    stored = await history(saver, "t")
    assert [t.checkpoint["channel_values"].get("value") for t in stored] == ["c", "b", "a"]
    assert (await latest(saver, "t")).pending_writes == []
    # The token reaches the checkpoint's metadata: the stored history shows who wrote it.
    assert [t.metadata["fencing_token"] for t in stored] == [7, 5, 5]


@pytest.mark.asyncio
async def test_a_claim_fences_a_thread_before_its_owner_writes(saver: Any) -> None:
    """A new owner's claim, before it has written anything, refuses the stale
    owner's checkpoint that would otherwise land after the new owner's read."""
    await put(saver, config("t", 5), checkpoint("a"))
    with fencing_token(7):
        await claim_thread(saver, "t")
    with pytest.raises(FenceRefused) as refused:
        await put(saver, config("t", 5), checkpoint("stale"))
    assert (refused.value.token, refused.value.highest) == (5, 7)
    await put(saver, config("t", 7), checkpoint("b"))
    with fencing_token(6), pytest.raises(FenceRefused):
        await claim_thread(saver, "t")
    with pytest.raises(FenceRefused, match="no fencing token"):
        await claim_thread(saver, "t")
    stored = await history(saver, "t")
    assert [t.checkpoint["channel_values"].get("value") for t in stored] == ["b", "a"]


@pytest.mark.asyncio
async def test_a_write_without_a_token_is_refused(saver: Any) -> None:
    with pytest.raises(FenceRefused, match="no fencing token"):
        await put(saver, config("t"), checkpoint("a"))
    with pytest.raises(FenceRefused, match="no fencing token"):
        await delete_thread(saver, "t")
    assert await history(saver, "t") == []


@pytest.mark.asyncio
async def test_delete_thread_is_fenced_by_the_context_token(saver: Any) -> None:
    await put(saver, config("t", 3), checkpoint("a"))
    await put(saver, config("u", 9), checkpoint("b"))
    with fencing_token(2), pytest.raises(FenceRefused):
        await delete_thread(saver, "t")
    assert len(await history(saver, "t")) == 1
    with fencing_token(3):
        await delete_thread(saver, "t")
        assert await history(saver, "t") == []
        # The config's token wins over the context's.
        await put(saver, config("u", 9), checkpoint("c"))
    assert FENCING_TOKEN.get() is None
    assert len(await history(saver, "u")) == 2
    with fencing_token(4):  # the token stays recorded after the thread is deleted
        await put(saver, config("t"), checkpoint("again"))
    with fencing_token(3), pytest.raises(FenceRefused):
        await put(saver, config("t"), checkpoint("stale"))


@pytest.mark.asyncio
async def test_threads_are_fenced_independently(saver: Any) -> None:
    await put(saver, config("t", 10), checkpoint("a"))
    await put(saver, config("ключ 🔑", 1), checkpoint("b"))
    with pytest.raises(FenceRefused):
        await put(saver, config("ключ 🔑", 0), checkpoint("c"))


@pytest.mark.parametrize("kind", [k for k in KINDS if k.startswith("postgres")])
@pytest.mark.parametrize("strategy", ["delete", "keep_latest"])
@pytest.mark.asyncio
async def test_prune_is_fenced(saver: Any, strategy: str) -> None:
    for value in ("a", "b"):
        await put(saver, config("t", 4), checkpoint(value))
    await put(saver, config("u", 1), checkpoint("x"))
    with fencing_token(3), pytest.raises(FenceRefused):
        await prune(saver, ["u", "t"], strategy)
    assert len(await history(saver, "t")) == 2
    with pytest.raises(FenceRefused, match="no fencing token"):
        await prune(saver, ["t"], strategy)
    with fencing_token(4):
        await prune(saver, ["t", "u"], strategy)
    assert len(await history(saver, "t")) == (0 if strategy == "delete" else 1)


@pytest.mark.parametrize("kind", ["sqlite-async"])
@pytest.mark.asyncio
async def test_sqlite_checks_without_aiosqlite_internals(
    saver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tenure.integrations.langgraph._sqlite import _CheckedCommit

    monkeypatch.setattr(_CheckedCommit, "one_hop", False)
    await put(saver, config("t", 5), checkpoint("a"))
    with pytest.raises(FenceRefused) as refused:
        await put(saver, config("t", 4), checkpoint("stale"))
    assert refused.value.highest == 5
    assert [t.checkpoint["channel_values"]["value"] for t in await history(saver, "t")] == ["a"]


@pytest.mark.asyncio
async def test_a_graph_run_by_the_thread_runtime_writes_with_its_runs_token(
    tmp_path: Path,
) -> None:
    """Every checkpoint a graph writes (each step, and its pending writes)
    carries the run's token from ``fenced_config``; the same graph run with
    an older token is refused at its first write."""
    builder = StateGraph(State)
    builder.add_node("echo", lambda state: {"said": [f"echo {state['said'][-1]}"]})
    builder.add_edge(START, "echo")
    builder.add_edge("echo", END)
    runs: list[ThreadRun] = []
    answered: list[str] = []

    async with FencedAsyncSqliteSaver.from_conn_string(str(tmp_path / "graph.db")) as saver:
        graph = builder.compile(checkpointer=saver)

        async def handler(run: ThreadRun) -> None:
            runs.append(run)
            signal: Signal
            async for signal in run.signals():
                await graph.ainvoke({"said": [signal.payload]}, fenced_config(run))
                answered.append(signal.payload)

        async with MemoryPubSub() as backend, ThreadRuntime(backend, handler) as runtime:
            await runtime.send_signal("chat", "hi")
            await runtime.send_signal("chat", "again")
            await eventually(lambda: len(answered) == 2)
        state = await graph.aget_state({"configurable": {"thread_id": "chat"}})
        assert state.values["said"] == ["hi", "echo hi", "again", "echo again"]
        token = runs[0].token
        assert token is not None
        assert fenced_config(runs[0], {"configurable": {"user": "u"}, "recursion_limit": 5}) == {
            "configurable": {"user": "u", "thread_id": "chat", "fencing_token": token},
            "recursion_limit": 5,
        }
        stored = await history(saver, "chat")
        assert {t.metadata["fencing_token"] for t in stored} == {token}
        before = len(stored)
        stale: RunnableConfig = {"configurable": {"thread_id": "chat", "fencing_token": token - 1}}
        with pytest.raises(FenceRefused):
            await graph.ainvoke({"said": ["late"]}, stale)
        assert len(await history(saver, "chat")) == before


@pytest.mark.parametrize("kind", ["sqlite-async", "postgres-async", "postgres-async-pool"])
@pytest.mark.asyncio
async def test_the_sync_bridges_of_the_async_savers_are_fenced(saver: Any) -> None:
    def from_a_thread(token: int, value: str) -> None:
        saver.put(config("t", token), checkpoint(value), {"source": "loop", "step": 0}, {})

    await asyncio.to_thread(from_a_thread, 5, "a")
    with pytest.raises(FenceRefused):
        await asyncio.to_thread(from_a_thread, 4, "stale")
    with fencing_token(4), pytest.raises(FenceRefused):
        await asyncio.to_thread(saver.delete_thread, "t")
    assert [t.checkpoint["channel_values"]["value"] for t in await history(saver, "t")] == ["a"]


@pytest.mark.parametrize("kind", ["sqlite-async"])
@pytest.mark.asyncio
async def test_a_write_that_bypasses_the_check_is_reported(
    saver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A saver version that commits some other way than the fenced saver knows:
    the write is reported, not passed off as fenced."""
    from tenure.integrations.langgraph._sqlite import _CheckedCommit

    async def plain_commit(self: Any) -> None:
        await self._conn.commit()

    monkeypatch.setattr(_CheckedCommit, "commit", plain_commit)
    with pytest.raises(ConfigurationError, match="without running the fence's check"):
        await put(saver, config("t", 5), checkpoint("a"))


@pytest.mark.asyncio
async def test_a_write_by_run_ids_is_refused_where_a_saver_has_one(tmp_path: Path) -> None:
    """No installed saver has ``delete_for_runs``; one that had it would get it
    refused by its fenced class (it spans threads, which no token fences)."""
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from tenure.integrations.langgraph._fence import fence_writes

    class WithRuns(AsyncSqliteSaver):
        async def adelete_for_runs(self, run_ids: Any) -> None:
            raise AssertionError("the saver's own method was reached")

    @fence_writes
    class FencedWithRuns(WithRuns):
        pass

    async with FencedWithRuns.from_conn_string(str(tmp_path / "runs.db")) as saver:
        with fencing_token(5), pytest.raises(ConfigurationError, match="delete_for_runs"):
            await saver.adelete_for_runs(["run-1"])


@pytest.mark.asyncio
@pytest.mark.parametrize("next_write", ["claim", "put"])
async def test_a_write_cancelled_before_its_commit_is_not_committed_by_the_next(
    tmp_path: Path, next_write: str
) -> None:
    """A stale owner's write is cancelled (its run lost the lease) while its INSERT
    waits for the database; the INSERT runs after all, and the transaction it opens
    is left behind. The next write on the saver's connection (the new owner's, with a
    higher token) must not commit the stale checkpoint with its own: the soak found one
    stored after the successor's."""
    path = tmp_path / "cp.db"
    async with FencedAsyncSqliteSaver.from_conn_string(str(path)) as saver:
        await saver.setup()
        await put(saver, config("t", 5), checkpoint("old owner's first"))
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")  # the stale INSERT waits on the file
        stale = asyncio.ensure_future(put(saver, config("t", 5), checkpoint("stale")))
        await asyncio.sleep(0.3)
        stale.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stale
        blocker.execute("COMMIT")  # the queued INSERT now runs, opening a transaction
        blocker.close()
        if next_write == "claim":  # the new owner's claim commits first (no statement)
            await claim_thread_with(saver, "t", 7)
        await put(saver, config("t", 7), checkpoint("new owner's"))
        values = [t.checkpoint["channel_values"]["value"] for t in await history(saver, "t")]
    assert values == ["new owner's", "old owner's first"]


async def claim_thread_with(saver: Any, thread_id: str, token: int) -> None:
    with fencing_token(token):
        await saver.aclaim_thread(thread_id)


@pytest.mark.asyncio
@pytest.mark.parametrize("cancelled_at", ["checkpoint", "writes"])
@pytest.mark.parametrize("kind", [k for k in KINDS if k.startswith("postgres-async")])
async def test_a_write_cancelled_inside_its_pipeline_commits_nothing(
    saver: Any, cancelled_at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale owner's write is cancelled (its run lost the lease) after its
    statements went into the pipeline and before the fence's check did. psycopg
    syncs a pipeline on the way out of it whatever ended the block, and the sync
    commits what was sent: the stale checkpoint, or the stale writes, unchecked."""
    first = await put(saver, config("t", 5), checkpoint("old owner's"))
    await claim_thread_with(saver, "t", 7)
    statement = saver.UPSERT_CHECKPOINTS_SQL if cancelled_at == "checkpoint" else None
    sent = psycopg.AsyncCursor.execute, psycopg.AsyncCursor.executemany

    async def execute(cur: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        done = await sent[0](cur, query, *args, **kwargs)
        if query is statement:
            raise asyncio.CancelledError  # where the run's cancellation lands
        return done

    async def executemany(cur: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        await sent[1](cur, query, *args, **kwargs)
        writes = (saver.UPSERT_CHECKPOINT_WRITES_SQL, saver.INSERT_CHECKPOINT_WRITES_SQL)
        if cancelled_at == "writes" and query in writes:
            raise asyncio.CancelledError

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", execute)
    monkeypatch.setattr(psycopg.AsyncCursor, "executemany", executemany)
    cfg = config("t", 5, checkpoint_id=first["configurable"]["checkpoint_id"])
    stale = (
        put(saver, config("t", 5), checkpoint("stale"))
        if cancelled_at == "checkpoint"
        else put_writes(saver, cfg, [("value", "stale")])
    )
    with pytest.raises(asyncio.CancelledError):
        await stale
    monkeypatch.undo()
    stored = await history(saver, "t")
    assert [t.checkpoint["channel_values"].get("value") for t in stored] == ["old owner's"]
    assert all(t.pending_writes == [] for t in stored)
    # The saver's connection is usable afterwards, and by the new owner.
    await put(saver, config("t", 7), checkpoint("new owner's"))
    stored = await history(saver, "t")
    assert [t.checkpoint["channel_values"].get("value") for t in stored] == [
        "new owner's",
        "old owner's",
    ]


class _Interrupted(Exception):
    """What ends the sync saver's write early in the test below."""


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["postgres-sync"])
async def test_a_sync_write_that_fails_inside_its_pipeline_commits_nothing(
    saver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync saver's pipeline is synced on the way out too: a write that fails
    after its checkpoint went into the pipeline commits nothing, unchecked."""
    await put(saver, config("t", 5), checkpoint("old owner's"))
    with fencing_token(7):
        await claim_thread(saver, "t")
    sent = psycopg.Cursor.execute

    def execute(cur: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        done = sent(cur, query, *args, **kwargs)
        if query is saver.UPSERT_CHECKPOINTS_SQL:
            raise _Interrupted
        return done

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    with pytest.raises(_Interrupted):
        await put(saver, config("t", 5), checkpoint("stale"))
    monkeypatch.undo()
    stored = await history(saver, "t")
    assert [t.checkpoint["channel_values"].get("value") for t in stored] == ["old owner's"]
