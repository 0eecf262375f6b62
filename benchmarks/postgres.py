"""PostgreSQL lease and event figures against raw statements, measured in the same run.

Not a test: prints rates and ratios. Two lease workloads, each run with tenure's
``PostgresLeaseProvider`` and with raw psycopg statements that do the same
writes (an upsert of the lease row, then an update freeing it) through the
same driver and the same kind of pool:

1. sequential acquire + release cycles, one task;
2. four OS processes contending on the same 100 keys (acquire, release if won).

Two event workloads (``PostgresPubSub``, a publishing instance and a
subscribing one, against raw statements on two connections):

3. publish -> callback latency, one event at a time, against a raw
   ``INSERT … ; NOTIFY`` on one connection -> the notification read by
   ``LISTEN`` on another;
4. events per second through one consumer group (8 publishing tasks, one
   subscriber), against raw ``INSERT`` statements (8 tasks) drained by one
   task looping on ``DELETE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED
   LIMIT 100) RETURNING``.

The machine running this is usually shared and its commit latency drifts, so
the two kinds take turns (blocks of cycles, or wall-clock slices shared by
all processes) instead of running one after the other. Each kind has its own
table and keys, so they never contend with each other.

Usage: ``.venv/bin/python benchmarks/postgres.py [--url URL] [--cycles N] [--seconds S]``
(default URL: ``$TENURE_TEST_POSTGRES_URL`` or the local server). Works in a
schema of its own, dropped at the end. Goal: tenure >= 0.8 of the raw rate.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: import the benchmarks package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import multiprocessing
import os
import random
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from benchmarks._common import (
    Figure,
    interleave,
    percentile,
    print_table,
    run,
    stamped,
)
from tenure import Event
from tenure.backends.postgres import PostgresLeaseProvider, PostgresPubSub

DEFAULT_URL = os.environ.get(
    "TENURE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TTL_MS = 30_000
# (sequential cycles, seconds of contention, latency samples, events per throughput round)
FULL = (2000, 10.0, 500, 4000)
SHORT = (500, 3.0, 100, 1000)

RAW_TABLE = """
CREATE TABLE IF NOT EXISTS {table} (
    key bytea PRIMARY KEY, owner bytea, token bigint NOT NULL, deadline timestamptz NOT NULL
)"""
RAW_ACQUIRE = """
INSERT INTO {table} AS t (key, owner, token, deadline)
VALUES (%(key)s, %(owner)s, 1, clock_timestamp() + %(ttl_ms)s * interval '1 millisecond')
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = t.token + 1,
    deadline = excluded.deadline
WHERE t.owner IS NULL OR t.deadline <= clock_timestamp() OR t.owner = excluded.owner
RETURNING t.token
"""
# With tenure's durability: a release commits without waiting for the WAL flush
# (losing one in a crash only lets the lease expire), a grant waits for it.
RAW_RELEASE = (
    "UPDATE {table} SET owner = NULL WHERE key = %(key)s AND owner = %(owner)s"
    " AND set_config('synchronous_commit', 'off', true) IS NOT NULL"
)


class Raw:
    """The baseline: the same writes as plain statements, no checks, no translation."""

    def __init__(self, url: str, schema: str) -> None:
        self.pool = AsyncConnectionPool(
            url, min_size=1, max_size=10, open=False, kwargs={"autocommit": True}
        )
        table = sql.Identifier(schema, "raw_leases")
        self.acquire_q = sql.SQL(RAW_ACQUIRE).format(table=table).as_string(None)
        self.release_q = sql.SQL(RAW_RELEASE).format(table=table).as_string(None)
        self.table_q = sql.SQL(RAW_TABLE).format(table=table)

    async def open(self) -> None:
        await self.pool.open()
        async with self.pool.connection() as conn:
            await conn.execute(self.table_q)

    async def acquire(self, key: str, owner: str) -> bool:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                self.acquire_q, {"key": key.encode(), "owner": owner.encode(), "ttl_ms": TTL_MS}
            )
            return await cur.fetchone() is not None

    async def release(self, key: str, owner: str) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(self.release_q, {"key": key.encode(), "owner": owner.encode()})

    async def close(self) -> None:
        await self.pool.close()


class Tenure:
    def __init__(self, url: str, schema: str) -> None:
        self.provider = PostgresLeaseProvider.from_url(url, schema=schema)

    async def open(self) -> None:
        await self.provider.get_lease_owner("warm-up")

    async def acquire(self, key: str, owner: str) -> bool:
        return (await self.provider.acquire_lease(key, owner, TTL_MS)).acquired

    async def release(self, key: str, owner: str) -> None:
        await self.provider.release_lease(key, owner)

    async def close(self) -> None:
        await self.provider.aclose()


def make(kind: str, url: str, schema: str) -> Raw | Tenure:
    return Raw(url, schema) if kind == "raw" else Tenure(url, schema)


BLOCK = 25  # cycles per block in the sequential run
SLICE = 0.25  # seconds per time slice in the contention run


async def sequential(url: str, schema: str, cycles: int) -> dict[str, float]:
    """Cycles per second of each kind, run in alternating blocks in one process.

    Commit latency on a shared machine drifts by 2x within seconds, so raw and
    tenure take turns every few cycles and see the same conditions.
    """
    clients = {kind: make(kind, url, schema) for kind in ("raw", "tenure")}
    for client in clients.values():
        await client.open()

    def block(kind: str) -> Any:
        async def cycles() -> tuple[float, float]:
            client = clients[kind]
            start = time.perf_counter()
            for i in range(BLOCK):
                key = f"{kind}-seq-{i}"
                assert await client.acquire(key, "owner")
                await client.release(key, "owner")
            return BLOCK, time.perf_counter() - start

        return cycles

    try:
        for kind, client in clients.items():  # warm-up: connections, prepared statements
            for i in range(20):
                await client.acquire(f"{kind}-seq-{i}", "w")
                await client.release(f"{kind}-seq-{i}", "w")
        result = await interleave({kind: block(kind) for kind in clients}, cycles // BLOCK)
        return {kind: result.rate(kind) for kind in clients}
    finally:
        for client in clients.values():
            await client.close()


def contender(url: str, schema: str, seconds: float, seed: int, start_at: float) -> Any:
    """One process: both kinds open; which one runs follows wall-clock slices shared by all."""

    async def main() -> dict[str, tuple[int, int]]:
        clients = {kind: make(kind, url, schema) for kind in ("raw", "tenure")}
        for client in clients.values():
            await client.open()
        rng = random.Random(seed)
        counts = {kind: [0, 0] for kind in clients}
        try:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            while (now := time.time()) < start_at + seconds:
                kind = "raw" if int((now - start_at) / SLICE) % 2 == 0 else "tenure"
                client, owner = clients[kind], f"{kind}-{seed}"
                key = f"{kind}-hot-{rng.randrange(100)}"
                if await client.acquire(key, owner):
                    counts[kind][1] += 1
                    await client.release(key, owner)
                    counts[kind][0] += 1
                counts[kind][0] += 1
        finally:
            for client in clients.values():
                await client.close()
        return {kind: (c[0], c[1]) for kind, c in counts.items()}

    return run(main())


def contention(url: str, schema: str, seconds: float, processes: int = 4) -> dict[str, float]:
    """Operations per second of each kind, all processes switching kind every SLICE seconds."""
    ctx = multiprocessing.get_context("spawn")
    start_at = time.time() + 3.0  # let every process import and connect first
    with ctx.Pool(processes) as pool:
        results = pool.starmap(
            contender, [(url, schema, seconds, i, start_at) for i in range(processes)]
        )
    rates = {}
    for kind in ("raw", "tenure"):
        ops = sum(r[kind][0] for r in results)
        grants = sum(r[kind][1] for r in results)
        rates[kind] = ops / (seconds / 2)  # each kind ran during half of the slices
        print(f"  {kind:6s}: {rates[kind]:8.0f} ops/s ({ops} operations, {grants} grants)")
    return rates


# -- events -----------------------------------------------------------------------

RAW_QUEUE = "CREATE TABLE IF NOT EXISTS {table} (id bigserial PRIMARY KEY, body text NOT NULL)"
RAW_SEND = "INSERT INTO {table} (body) VALUES (%(body)s)"
RAW_NOTIFY = (
    "WITH i AS (INSERT INTO {table} (body) VALUES (%(body)s) RETURNING id)"
    " SELECT pg_notify(%(channel)s, '') FROM i"
)
RAW_DRAIN = """
DELETE FROM {table} WHERE id IN (
    SELECT id FROM {table} ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED
) RETURNING body
"""


async def latency(url: str, schema: str, rounds: int) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of publish -> callback and of raw INSERT+NOTIFY -> LISTEN, alternating."""
    table = sql.Identifier(schema, "raw_latency")
    channel_name = f"bench_{schema}"
    channel = sql.Identifier(channel_name)
    sender = await psycopg.AsyncConnection.connect(url, autocommit=True)
    listener = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await sender.execute(sql.SQL(RAW_QUEUE).format(table=table))
    await listener.execute(sql.SQL("LISTEN {}").format(channel))
    send_q = sql.SQL(RAW_NOTIFY).format(table=table)
    got: asyncio.Queue[float] = asyncio.Queue()

    async def on_event(event: Event) -> None:
        got.put_nowait(time.perf_counter())

    samples: dict[str, list[float]] = {"raw": [], "tenure": []}
    publisher = PostgresPubSub.from_url(url, schema=schema)
    subscriber = PostgresPubSub.from_url(url, schema=schema)
    try:
        await subscriber.subscribe("latency", on_event, group="g")
        for i in range(20):  # warm-up
            await publisher.publish("latency", Event(type="t", data=i))
            await got.get()
        for i in range(rounds):
            start = time.perf_counter()
            await sender.execute(send_q, {"body": str(i), "channel": channel_name})
            async for _ in listener.notifies(stop_after=1):
                break
            samples["raw"].append(time.perf_counter() - start)
            start = time.perf_counter()
            await publisher.publish("latency", Event(type="t", data=i))
            samples["tenure"].append(await got.get() - start)
        await subscriber.unsubscribe("latency", on_event)
    finally:
        await publisher.aclose()
        await subscriber.aclose()
        await sender.close()
        await listener.close()
    return {k: (percentile(v, 0.5) * 1000, percentile(v, 0.99) * 1000) for k, v in samples.items()}


async def _raw_throughput(url: str, schema: str, events: int, senders: int) -> float:
    table = sql.Identifier(schema, "raw_queue")
    pool = AsyncConnectionPool(
        url, min_size=senders + 1, max_size=senders + 1, open=False, kwargs={"autocommit": True}
    )
    await pool.open()
    try:
        async with pool.connection() as conn:
            await conn.execute(sql.SQL(RAW_QUEUE).format(table=table))
        send_q = sql.SQL(RAW_SEND).format(table=table).as_string(None)
        drain_q = sql.SQL(RAW_DRAIN).format(table=table).as_string(None)
        per = events // senders

        async def send() -> None:
            async with pool.connection() as conn:
                for i in range(per):
                    await conn.execute(send_q, {"body": str(i)})

        async def drain() -> None:
            left = per * senders
            async with pool.connection() as conn:
                while left > 0:
                    cur = await conn.execute(drain_q)
                    left -= len(await cur.fetchall())

        start = time.perf_counter()
        await asyncio.gather(drain(), *(send() for _ in range(senders)))
        return per * senders / (time.perf_counter() - start)
    finally:
        await pool.close()


async def _tenure_throughput(url: str, schema: str, events: int, senders: int) -> float:
    per = events // senders
    done = asyncio.Event()
    count = 0

    async def on_event(event: Event) -> None:
        nonlocal count
        count += 1
        if count >= per * senders:
            done.set()

    publisher = PostgresPubSub.from_url(url, schema=schema, max_size=senders)
    subscriber = PostgresPubSub.from_url(url, schema=schema)
    try:
        await subscriber.subscribe("throughput", on_event, group="g")
        await publisher.get_lease_owner("warm-up")

        async def send() -> None:
            for i in range(per):
                await publisher.publish("throughput", Event(type="t", data=i))

        start = time.perf_counter()
        await asyncio.gather(*(send() for _ in range(senders)))
        await done.wait()
        rate = per * senders / (time.perf_counter() - start)
        await subscriber.unsubscribe("throughput", on_event)
        return rate
    finally:
        await publisher.aclose()
        await subscriber.aclose()


async def throughput(url: str, schema: str, events: int, rounds: int = 3) -> dict[str, float]:
    """Events per second end to end (first send to last one handled), best of alternating rounds."""
    best = {"raw": 0.0, "tenure": 0.0}
    for _ in range(rounds):
        best["raw"] = max(best["raw"], await _raw_throughput(url, schema, events, 8))
        best["tenure"] = max(best["tenure"], await _tenure_throughput(url, schema, events, 8))
    return best


def measure(
    url: str, cycles: int, seconds: float, rounds: int, events: int, only: str | None = None
) -> list[Figure]:
    found: list[Figure] = []
    schema = f"tenure_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        if only != "leases":
            print(f"publish -> handler latency, {rounds} samples of each kind", flush=True)
            lat = run(latency(url, schema, rounds))
            for kind in ("raw", "tenure"):
                p50, p99 = lat[kind]
                print(f"  {kind:6s}: p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
            print(
                f"  ratio tenure/raw: p50 {lat['tenure'][0] / lat['raw'][0]:.2f}  "
                f"p99 {lat['tenure'][1] / lat['raw'][1]:.2f}",
                flush=True,
            )
            print(f"events through one group: {events} per round, 8 senders", flush=True)
            thr = run(throughput(url, schema, events))
            for kind in ("raw", "tenure"):
                print(f"  {kind:6s}: {thr[kind]:8.0f} events/s")
            print(f"  ratio tenure/raw: {thr['tenure'] / thr['raw']:.3f}", flush=True)
            found += [
                Figure(
                    "postgres",
                    "publish -> handler p50 vs INSERT+NOTIFY -> LISTEN",
                    lat["tenure"][0],
                    lat["raw"][0],
                    "ms",
                    lat["tenure"][0] / lat["raw"][0],
                ),
                Figure(
                    "postgres",
                    "events through one group vs raw SKIP LOCKED drain",
                    thr["tenure"],
                    thr["raw"],
                    "events/s",
                    thr["tenure"] / thr["raw"],
                ),
            ]
            if only == "events":
                return found
        print(
            f"sequential acquire+release cycles: {cycles} of each kind, alternating "
            f"in blocks of {BLOCK}",
            flush=True,
        )
        seq = run(sequential(url, schema, cycles))
        for kind in ("raw", "tenure"):
            print(f"  {kind:6s}: {seq[kind]:8.0f} cycles/s")
        print(f"  ratio tenure/raw: {seq['tenure'] / seq['raw']:.3f}", flush=True)
        print(
            f"4 processes contending on 100 keys for {seconds:g} s, raw and tenure "
            f"alternating every {SLICE} s",
            flush=True,
        )
        con = contention(url, schema, seconds)
        print(f"  ratio tenure/raw: {con['tenure'] / con['raw']:.3f}")
        found += [
            Figure(
                "postgres",
                "sequential acquire+release vs raw statements",
                seq["tenure"],
                seq["raw"],
                "cycles/s",
                seq["tenure"] / seq["raw"],
                (">=", 0.8),
            ),
            Figure(
                "postgres",
                "4 processes on the same 100 keys vs raw",
                con["tenure"],
                con["raw"],
                "ops/s",
                con["tenure"] / con["raw"],
                (">=", 0.9),
            ),
        ]
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    return found


def figures(full: bool = False) -> list[Figure]:
    with stamped("postgres"):
        return measure(DEFAULT_URL, *(FULL if full else SHORT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--cycles", type=int, default=FULL[0])
    parser.add_argument("--seconds", type=float, default=FULL[1])
    parser.add_argument("--rounds", type=int, default=FULL[2], help="latency samples of each kind")
    parser.add_argument("--events", type=int, default=FULL[3], help="events per throughput round")
    parser.add_argument("--only", choices=["leases", "events"], default=None)
    args = parser.parse_args()
    with stamped("postgres"):
        found = measure(args.url, args.cycles, args.seconds, args.rounds, args.events, args.only)
    print_table(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
