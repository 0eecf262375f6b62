"""LangGraph on tenure: checkpoint savers whose writes are fenced by a lease's token.

A worker that lost a thread's lease (paused, partitioned) must not write the
thread's state after its successor: every write of a fenced saver is refused,
atomically with the write, when its token is lower than the highest that has
written the thread, or missing::

    from tenure.integrations.langgraph import FencedAsyncPostgresSaver, fenced_config

    async with FencedAsyncPostgresSaver.from_conn_string(url) as saver:
        await saver.setup()
        graph = builder.compile(checkpointer=saver)

        async def handler(run):  # a tenure ThreadRuntime handler
            async for signal in run.signals():
                await graph.ainvoke(signal.payload, fenced_config(run))

The savers for SQLite need ``langgraph-checkpoint-sqlite``, those for
PostgreSQL ``langgraph-checkpoint-postgres`` (``pip install 'tenure[langgraph]'``
installs both); each is imported on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ...fencing import FenceRefused
from ._fence import FENCING_TOKEN, fenced_config, fencing_token
from ._graph import GraphHandler, graph_handler, resume

if TYPE_CHECKING:
    from ._postgres import FencedAsyncPostgresSaver, FencedPostgresSaver
    from ._sqlite import FencedAsyncSqliteSaver, FencedSqliteSaver

__all__ = [
    "FENCING_TOKEN",
    "FenceRefused",
    "FencedAsyncPostgresSaver",
    "FencedAsyncSqliteSaver",
    "FencedPostgresSaver",
    "FencedSqliteSaver",
    "GraphHandler",
    "fenced_config",
    "fencing_token",
    "graph_handler",
    "resume",
]

_LAZY = {
    "FencedAsyncSqliteSaver": "_sqlite",
    "FencedSqliteSaver": "_sqlite",
    "FencedAsyncPostgresSaver": "_postgres",
    "FencedPostgresSaver": "_postgres",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
