"""Fenced and plain LangGraph savers on a real SQLite file and the shared PostgreSQL,
opened the way their users open them, for the tests, the fault test's workers
and the benchmark."""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint, empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from tenure.integrations.langgraph import (
    FencedAsyncPostgresSaver,
    FencedAsyncSqliteSaver,
    FencedPostgresSaver,
    FencedSqliteSaver,
)

# How each saver is opened: kind -> (plain class, fenced class, database, how).
KINDS = [
    "sqlite-async",
    "sqlite-sync",
    "postgres-async",
    "postgres-async-pipeline",
    "postgres-async-pool",
    "postgres-sync",
]


def schema_url(url: str, schema: str) -> str:
    """``url`` with ``schema`` first on the search path (the savers' tables are unqualified)."""
    options = urllib.parse.quote(f"-c search_path={schema}")
    return f"{url}{'&' if '?' in url else '?'}options={options}"


def create_schema(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')


def is_sync(saver: BaseCheckpointSaver[Any]) -> bool:
    return isinstance(saver, SqliteSaver | PostgresSaver)


@asynccontextmanager
async def open_saver(kind: str, where: str, *, fenced: bool) -> AsyncIterator[Any]:
    """A set-up saver of ``kind`` on ``where`` (a SQLite path, or a PostgreSQL URL)."""
    if kind == "postgres-async-pipeline":
        # The saver's migrations cannot run in a pipeline: set up without one, as its users must.
        async with open_saver("postgres-async", where, fenced=fenced):
            pass
        async with _open(kind, where, fenced) as saver:
            yield saver
        return
    async with _open(kind, where, fenced) as saver:
        if is_sync(saver):
            saver.setup()
        else:
            await saver.setup()
        yield saver


def _open(kind: str, where: str, fenced: bool) -> AbstractAsyncContextManager[Any]:
    if kind == "sqlite-async":
        cls: Any = FencedAsyncSqliteSaver if fenced else AsyncSqliteSaver
        return cls.from_conn_string(where)  # type: ignore[no-any-return]
    if kind == "sqlite-sync":
        return _sync((FencedSqliteSaver if fenced else SqliteSaver).from_conn_string, where)
    if kind == "postgres-sync":
        return _sync((FencedPostgresSaver if fenced else PostgresSaver).from_conn_string, where)
    cls = FencedAsyncPostgresSaver if fenced else AsyncPostgresSaver
    if kind == "postgres-async":
        return cls.from_conn_string(where)  # type: ignore[no-any-return]
    if kind == "postgres-async-pipeline":
        return cls.from_conn_string(where, pipeline=True)  # type: ignore[no-any-return]
    assert kind == "postgres-async-pool"
    return _pooled(cls, where)


@asynccontextmanager
async def _sync(factory: Callable[[str], Any], where: str) -> AsyncIterator[Any]:
    with factory(where) as saver:
        yield saver


@asynccontextmanager
async def _pooled(cls: Any, url: str) -> AsyncIterator[Any]:
    async with AsyncConnectionPool(
        url,
        min_size=1,
        max_size=2,
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    ) as pool:
        yield cls(pool)


def config(thread_id: str, token: int | None = None, **extra: Any) -> RunnableConfig:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": "", **extra}
    if token is not None:
        configurable["fencing_token"] = token
    return {"configurable": configurable}


def checkpoint(value: Any = None) -> Checkpoint:
    cp = empty_checkpoint()
    if value is not None:
        cp["channel_values"] = {"value": value}
        cp["channel_versions"] = {"value": 1}
    return cp


async def put(
    saver: Any, cfg: RunnableConfig, cp: Checkpoint, metadata: dict[str, Any] | None = None
) -> RunnableConfig:
    meta: Any = metadata or {"source": "loop", "step": 0}
    versions: Any = cp["channel_versions"]
    if is_sync(saver):
        return saver.put(cfg, cp, meta, versions)  # type: ignore[no-any-return]
    return await saver.aput(cfg, cp, meta, versions)  # type: ignore[no-any-return]


async def put_writes(saver: Any, cfg: RunnableConfig, writes: list[tuple[str, Any]]) -> None:
    if is_sync(saver):
        saver.put_writes(cfg, writes, "task-1")
    else:
        await saver.aput_writes(cfg, writes, "task-1")


async def delete_thread(saver: Any, thread_id: str) -> None:
    if is_sync(saver):
        saver.delete_thread(thread_id)
    else:
        await saver.adelete_thread(thread_id)


async def claim_thread(saver: Any, thread_id: str) -> None:
    if is_sync(saver):
        saver.claim_thread(thread_id)
    else:
        await saver.aclaim_thread(thread_id)


async def prune(saver: Any, thread_ids: list[str], strategy: str) -> None:
    if is_sync(saver):
        saver.prune(thread_ids, strategy=strategy)
    else:
        await saver.aprune(thread_ids, strategy=strategy)


async def history(saver: Any, thread_id: str) -> list[Any]:
    """The thread's checkpoints, newest first."""
    cfg = config(thread_id)
    if is_sync(saver):
        return list(saver.list(cfg))
    return [t async for t in saver.alist(cfg)]


async def latest(saver: Any, thread_id: str) -> Any:
    if is_sync(saver):
        return saver.get_tuple(config(thread_id))
    return await saver.aget_tuple(config(thread_id))
