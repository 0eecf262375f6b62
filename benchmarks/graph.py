"""A LangGraph message through the thread runtime against the graph streamed directly.

Usage: ``python benchmarks/graph.py [--messages N] [--tokens T] [--rounds R] [--backend B]``

One process, one graph (``tests/support/agent_graph.py``: four steps, a fake chat
model streaming ``T`` tokens), fenced checkpoints on a SQLite file (``sqlite``) or
the shared PostgreSQL (``postgres``, the runtime on the shared Redis). Per
message, in interleaved slices of ``N`` messages:

- direct: ``graph.astream(..., stream_mode=["updates", "messages"],
  durability="sync")`` consumed in this process;
- runtime: ``send_signal`` to a ``ThreadRuntime(graph_handler(graph), output=True)``
  of the same process and ``wait_reply`` for the whole reply (every chunk a fenced
  append to the thread's output, plus the runtime's lifecycle items).

Prints the median time per message of each and their ratio (runtime / direct).
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: the repository root first (benchmarks/redis.py shadows redis)
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import urllib.parse
import uuid
from contextlib import AsyncExitStack
from typing import Any

import psycopg

import tenure
from benchmarks._common import load_average
from tenure.integrations.langgraph import (
    FencedAsyncPostgresSaver,
    FencedAsyncSqliteSaver,
    fenced_config,
    graph_handler,
)
from tests.support.agent_graph import build_agent

REDIS_URL = os.environ.get("TENURE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get("TENURE_BENCH_POSTGRES_URL", "postgresql://127.0.0.1:5432/postgres")


def _drop(schema: str) -> None:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as pg:
        pg.execute(f'DROP SCHEMA "{schema}" CASCADE')


def message(n: int, tokens: int) -> dict[str, Any]:
    return {"messages": [("user", " ".join(f"w{n}.{i}" for i in range(tokens)))]}


async def direct(graph: Any, thread: str, count: int, tokens: int, token: int) -> float:
    """Seconds per message, streamed in this process with the runtime's config."""

    class Run:  # what fenced_config reads of a ThreadRun
        thread_key, token = thread, 0

    Run.token = token
    started = time.perf_counter()
    for n in range(count):
        config = fenced_config(Run())  # type: ignore[arg-type]  # the two fields it reads
        config["metadata"] = {"run_id": uuid.uuid4().hex}
        async for _ in graph.astream(
            message(n, tokens), config, stream_mode=["updates", "messages"], durability="sync"
        ):
            pass
    return (time.perf_counter() - started) / count


async def through(runtime: tenure.ThreadRuntime, thread: str, count: int, tokens: int) -> float:
    started = time.perf_counter()
    for n in range(count):
        sent = await runtime.send_signal(thread, message(n, tokens))
        await runtime.wait_reply(sent, timeout=60)
    return (time.perf_counter() - started) / count


async def main(args: argparse.Namespace) -> None:
    prefix = f"bench-graph-{uuid.uuid4().hex[:8]}"
    async with AsyncExitStack() as stack:
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="tenure-bench-graph-"))
        if args.backend == "sqlite":
            saver: Any = await stack.enter_async_context(
                FencedAsyncSqliteSaver.from_conn_string(f"{directory}/checkpoints.db")
            )
            backend = await stack.enter_async_context(
                tenure.from_url(f"sqlite:///{directory}/leases.db")
            )
        else:
            schema = prefix.replace("-", "_")
            with psycopg.connect(POSTGRES_URL, autocommit=True) as pg:
                pg.execute(f'CREATE SCHEMA "{schema}"')
            stack.callback(_drop, schema)
            options = urllib.parse.quote(f"-c search_path={schema}")
            saver = await stack.enter_async_context(
                FencedAsyncPostgresSaver.from_conn_string(f"{POSTGRES_URL}?options={options}")
            )
            backend = await stack.enter_async_context(tenure.from_url(REDIS_URL))
        await saver.setup()
        graph = build_agent(saver)
        runtime = await stack.enter_async_context(
            tenure.ThreadRuntime(
                backend, graph_handler(graph), output=True, idle_timeout=5, namespace=prefix
            )
        )
        times: dict[str, list[float]] = {"direct": [], "runtime": []}
        print(f"load average before: {load_average()}")
        for r in range(args.rounds):
            times["direct"].append(
                await direct(graph, f"{prefix}-direct", args.messages, args.tokens, 1)
            )
            times["runtime"].append(
                await through(runtime, f"{prefix}-runtime", args.messages, args.tokens)
            )
            print(
                f"round {r}: direct {times['direct'][-1] * 1000:.1f} ms, "
                f"runtime {times['runtime'][-1] * 1000:.1f} ms per message"
            )
        print(f"load average after: {load_average()}")
    d, t = (statistics.median(times[k]) * 1000 for k in ("direct", "runtime"))
    ratios = [b / a for a, b in zip(times["direct"], times["runtime"], strict=True)]
    print(
        f"{args.backend}, {args.tokens} tokens: direct {d:.1f} ms, runtime {t:.1f} ms per "
        f"message (medians); runtime / direct {statistics.median(ratios):.2f}x "
        f"(median of the rounds' ratios)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    asyncio.run(main(parser.parse_args()))
