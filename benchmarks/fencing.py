"""Fencing benchmark: LangGraph's checkpoint savers, fenced against plain, in the same run.

Usage: ``python benchmarks/fencing.py [--writes N] [--rounds R]``

Each slice writes ``--writes`` checkpoints of one thread in a row through one
saver (``aput``, each with a small message list stored as a blob, the way a
chat graph's state is), or as many ``aput_writes`` of two channels; the
fenced and the plain saver of each database take turns, slice by slice
(:func:`benchmarks._common.interleave`), so that the load of a shared machine
falls on both alike. The figure is the median latency of one write through
the fenced saver over the plain one's; the goal is at most 1.3. The
throughput ratio of each round is printed too. SQLite: ``AsyncSqliteSaver`` on a file (WAL, as it sets it up), each
saver on a file of its own. PostgreSQL: ``AsyncPostgresSaver`` on one
connection (``from_conn_string``) to the shared server
(``TENURE_TEST_POSTGRES_URL``), each in a schema of its own, dropped after.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: import the benchmarks package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import os
import statistics
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import psycopg
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from benchmarks._common import Figure, interleave, print_table, run, stamped
from tenure.integrations.langgraph import FencedAsyncPostgresSaver, FencedAsyncSqliteSaver

POSTGRES_URL = os.environ.get(
    "TENURE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
GOAL = ("<=", 1.3)
MESSAGES = [{"role": "user" if i % 2 else "ai", "content": f"message {i} " * 8} for i in range(6)]


@asynccontextmanager
async def _postgres_saver(cls: Any) -> AsyncIterator[Any]:
    schema = f"tenure_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    options = urllib.parse.quote(f"-c search_path={schema}")
    sep = "&" if "?" in POSTGRES_URL else "?"
    try:
        async with cls.from_conn_string(f"{POSTGRES_URL}{sep}options={options}") as saver:
            await saver.setup()
            yield saver
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@asynccontextmanager
async def _sqlite_saver(cls: Any, directory: str) -> AsyncIterator[Any]:
    async with cls.from_conn_string(f"{directory}/{cls.__name__}.db") as saver:
        await saver.setup()
        yield saver


class Writer:
    """Writes one thread's checkpoints (or pending writes) through ``saver``, timed."""

    def __init__(self, saver: Any, what: str, writes: int) -> None:
        self.saver = saver
        self.what = what
        self.writes = writes
        self.thread = f"bench-{uuid.uuid4().hex[:8]}"
        self.step = 0
        self.parent: str | None = None
        self.latencies: list[float] = []  # seconds, one per write

    def _config(self) -> Any:
        configurable: dict[str, Any] = {
            "thread_id": self.thread,
            "checkpoint_ns": "",
            "fencing_token": 7,  # ignored by the plain saver (kept in the metadata, as by the fenced one)
        }
        if self.parent is not None:
            configurable["checkpoint_id"] = self.parent
        return {"configurable": configurable}

    async def _put(self) -> None:
        self.step += 1
        cp = empty_checkpoint()
        cp["channel_values"] = {"messages": MESSAGES, "step": self.step}
        cp["channel_versions"] = {"messages": self.step, "step": self.step}
        metadata: Any = {"source": "loop", "step": self.step}
        saved = await self.saver.aput(self._config(), cp, metadata, cp["channel_versions"])
        self.parent = saved["configurable"]["checkpoint_id"]

    async def __call__(self) -> tuple[float, float]:
        if self.parent is None:
            await self._put()
        started = time.perf_counter()
        for i in range(self.writes):
            began = time.perf_counter()
            if self.what == "aput":
                await self._put()
            else:
                self.step += 1  # a task of its own each time: no write is a no-op repeat
                writes = [("messages", MESSAGES[:2]), ("step", i)]
                await self.saver.aput_writes(self._config(), writes, f"task-{self.step}")
            self.latencies.append(time.perf_counter() - began)
        return float(self.writes), time.perf_counter() - started


async def figures(full: bool = False, *, writes: int = 0, rounds: int = 0) -> list[Figure]:
    writes = writes or (200 if full else 60)
    rounds = rounds or (12 if full else 6)
    result: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="tenure-bench-fencing-") as directory:
        for database in ("sqlite", "postgres"):
            async with AsyncExitStack() as stack:
                if database == "sqlite":
                    plain = await stack.enter_async_context(
                        _sqlite_saver(AsyncSqliteSaver, directory)
                    )
                    fenced = await stack.enter_async_context(
                        _sqlite_saver(FencedAsyncSqliteSaver, directory)
                    )
                else:
                    plain = await stack.enter_async_context(_postgres_saver(AsyncPostgresSaver))
                    fenced = await stack.enter_async_context(
                        _postgres_saver(FencedAsyncPostgresSaver)
                    )
                for what in ("aput", "aput_writes"):
                    cases = {
                        "fenced": Writer(fenced, what, writes),
                        "plain": Writer(plain, what, writes),
                    }
                    with stamped(f"fencing: {database} {what}"):
                        runs = await interleave(cases, rounds)
                    # The figure: median latency per write, fenced over plain (a
                    # median shrugs off the stalls of a shared machine, which
                    # the per-slice throughput ratio below shows).
                    medians = [
                        1000 * statistics.median(cases[c].latencies) for c in ("fenced", "plain")
                    ]
                    ratio = medians[0] / medians[1]
                    per_round = ", ".join(f"{1 / r:.2f}" for r in runs.ratios("fenced", "plain"))
                    print(
                        f"{database} {what}: median per write fenced {medians[0]:.3f} ms, "
                        f"plain {medians[1]:.3f} ms: ratio {ratio:.2f}; throughput cost ratio "
                        f"{1 / runs.ratio('fenced', 'plain'):.2f} (per round: {per_round})",
                        flush=True,
                    )
                    result.append(
                        Figure(
                            "fencing",
                            f"{database}: {what}, median cost per write, fenced/plain",
                            medians[0],
                            medians[1],
                            "ms",
                            ratio,
                            GOAL,
                        )
                    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=0, help="writes per slice")
    parser.add_argument("--rounds", type=int, default=0, help="interleaved rounds")
    parser.add_argument("--full", action="store_true", help="longer settings")
    args = parser.parse_args()
    print_table(run(figures(args.full, writes=args.writes, rounds=args.rounds)))


if __name__ == "__main__":
    main()
