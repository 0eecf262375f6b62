"""Helpers for the PostgreSQL tests: a controllable SQL clock, schema clean-up, workers.

Worker functions run in separate OS processes (``multiprocessing`` spawn), so
they live in this importable module rather than in a test file.
"""

from __future__ import annotations

import asyncio
from multiprocessing.synchronize import Barrier
from typing import Any

import psycopg
from psycopg import sql

from tenure.backends.postgres import PostgresLeaseProvider

from ..support.servers import unique_name

# A fixed instant for the frozen clock: tests see only the offsets they add.
_EPOCH = "2030-01-01 00:00:00+00"


class SqlClock:
    """Freezes ``<schema>.lease_now()`` and moves it only when told to.

    Replaces the function with ``CREATE OR REPLACE`` (the provider reads every
    time through it), so the backend's own statements run on controlled time.
    """

    def __init__(self, url: str, schema: str) -> None:
        self.url = url
        self.schema = schema
        self.offset_ms = 0

    async def set(self, offset_ms: int) -> None:
        self.offset_ms = int(offset_ms)
        body = f"SELECT timestamptz '{_EPOCH}' + interval '{self.offset_ms} milliseconds'"
        statement = sql.SQL(
            "CREATE OR REPLACE FUNCTION {}() RETURNS timestamptz LANGUAGE sql VOLATILE AS {}"
        ).format(sql.Identifier(self.schema, "lease_now"), sql.Literal(body))
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute(statement)

    async def advance(self, ms: int) -> None:
        await self.set(self.offset_ms + ms)


def drop_schema(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def new_schema() -> str:
    return f"tenure_test_{unique_name()}"


def race_worker(
    url: str, schema: str, key: str, name: str, rounds: int, barrier: Barrier
) -> list[tuple[int, bool, str | None, int | None]]:
    """One contender: each round, wait for all, try to acquire, wait, release if won.

    Returns ``(round, acquired, owner seen, token)`` per round. Owners are
    unique per round, so a same-owner re-acquire can never count as a win.
    """

    async def main() -> list[tuple[int, bool, str | None, int | None]]:
        results: list[tuple[int, bool, str | None, int | None]] = []
        async with PostgresLeaseProvider.from_url(url, schema=schema) as provider:
            for r in range(rounds):
                owner = f"{name}-round-{r}"
                await asyncio.to_thread(barrier.wait, 60)
                got = await provider.acquire_lease(key, owner, 30_000)
                results.append((r, got.acquired, got.owner, got.token))
                # Everyone has tried before the winner lets go.
                await asyncio.to_thread(barrier.wait, 60)
                if got.acquired:
                    await provider.release_lease(key, owner)
        return results

    return asyncio.run(main())


def first_use_worker(url: str, schema: str, key: str, name: str, barrier: Barrier) -> Any:
    """Start on a schema that does not exist yet, all at once; try to take ``key``."""

    async def main() -> tuple[bool, str | None]:
        async with PostgresLeaseProvider.from_url(url, schema=schema) as provider:
            await asyncio.to_thread(barrier.wait, 60)
            got = await provider.acquire_lease(key, name, 30_000)
            return got.acquired, got.owner

    return asyncio.run(main())


def _run_and_report(queue: Any, index: int, fn: Any, args: tuple[Any, ...]) -> None:
    try:
        queue.put((index, True, fn(*args)))
    except BaseException as exc:
        queue.put((index, False, repr(exc)))
        raise


def run_in_processes(
    fn: Any, args_per_process: list[tuple[Any, ...]], ctx: Any, timeout: float = 240
) -> list[Any]:
    """Run ``fn(*args)`` in one spawned OS process per entry; their results, in order.

    Fails (raises) when a process raised, died or did not finish in ``timeout``.
    """
    queue = ctx.Queue()
    processes = [
        ctx.Process(target=_run_and_report, args=(queue, i, fn, args), daemon=True)
        for i, args in enumerate(args_per_process)
    ]
    for process in processes:
        process.start()
    results: dict[int, Any] = {}
    try:
        for _ in processes:
            index, ok, value = queue.get(timeout=timeout)
            if not ok:
                raise AssertionError(f"worker {index} raised {value}")
            results[index] = value
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
    return [results[i] for i in range(len(processes))]
