"""etcd lease figures against raw etcd transactions, measured in the same run.

Not a test: prints rates, latencies and ratios. Starts its own etcd (one
member, or ``--members 3`` for the cost of consensus) on free loopback
ports, with ``tests/support/etcd_server.py``. Two workloads, each with
tenure's ``EtcdLeases`` and with raw transactions sent through the same
client (aetcd's generated stubs on one gRPC channel of the same kind):

1. sequential acquire + release cycles, one task. Raw: a ``Txn`` that puts the
   key if its ``create_revision`` is 0 (attached to one etcd lease granted up
   front), then a ``Txn`` that deletes it if its value is still ours;
2. hand-off: a holder releases, a waiter blocked on the key takes it. tenure:
   ``release_lease`` and ``tenure.acquire_wait`` (its etcd watch). Raw: a
   delete, and a waiter that has a watch on the key and sends the put ``Txn``
   when the delete event arrives. Measured from just before the release to
   the waiter's grant.

With ``--compare``, the same tenure cycle on a private ``redis-server`` and on
the shared PostgreSQL (a schema of its own, dropped at the end), in blocks
alternating with etcd's, so that the cost of consensus shows beside them.

The machine is usually shared, so raw and tenure take turns (blocks of
cycles, alternating hand-offs) and see the same conditions. Goal: tenure at
least 0.8 of the raw rate.

    .venv/bin/python benchmarks/etcd.py [--members 1] [--cycles 2000] [--handoffs 100]
        [--compare]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: the repository root first (benchmarks/redis.py shadows redis)
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import tenure
from benchmarks._common import Figure, interleave, percentile, print_table, run, stamped
from tenure.backends.etcd import EtcdLeases
from tenure.backends.etcd._connection import EtcdChannel, rpc
from tests.support.etcd_server import EtcdCluster
from tests.support.redis_server import RedisServer
from tests.support.servers import drop_postgres_schema

TTL_MS = 30_000
BLOCK = 25
# (cycles, hand-offs)
FULL = (2000, 100)
SHORT = (500, 30)
_CREATE = rpc.Compare.CompareTarget.CREATE
_VALUE = rpc.Compare.CompareTarget.VALUE
_EQUAL = rpc.Compare.CompareResult.EQUAL


class Raw:
    """The baseline: one conditional transaction per step, no checks, no translation."""

    def __init__(self, cluster: EtcdCluster) -> None:
        hosts = [(h, int(p)) for h, p in (e.split(":") for e in cluster.endpoints)]
        self.channel = EtcdChannel(hosts, timeout=5.0)
        self.lease = 0

    async def open(self) -> None:
        reply = await self.channel.lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=600), timeout=5)
        self.lease = reply.ID

    async def acquire(self, key: bytes, owner: bytes) -> bool:
        request = rpc.TxnRequest(
            compare=[rpc.Compare(key=key, target=_CREATE, result=_EQUAL, create_revision=0)],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=owner, lease=self.lease))
            ],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key))],
        )
        reply = await self.channel.kv.Txn(request, timeout=5)
        return bool(reply.succeeded)

    async def release(self, key: bytes, owner: bytes) -> None:
        request = rpc.TxnRequest(
            compare=[rpc.Compare(key=key, target=_VALUE, result=_EQUAL, value=owner)],
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))],
        )
        await self.channel.kv.Txn(request, timeout=5)

    async def close(self) -> None:
        await self.channel.aclose()


Cycle = Callable[[int], Awaitable[None]]


async def alternate(cycles: dict[str, Cycle], count: int) -> dict[str, float]:
    """Cycles per second of each kind: 20 to warm up (connections, the clean-up
    lease, tables), then ``BLOCK`` cycles at a time, the kinds in rotating order."""
    for i in range(20):
        for cycle in cycles.values():
            await cycle(i)

    def block(cycle: Cycle) -> Callable[[], Awaitable[tuple[float, float]]]:
        async def run_block() -> tuple[float, float]:
            start = time.perf_counter()
            for i in range(BLOCK):
                await cycle(i)
            return BLOCK, time.perf_counter() - start

        return run_block

    result = await interleave({name: block(c) for name, c in cycles.items()}, count // BLOCK)
    return {name: result.rate(name) for name in cycles}


def tenure_cycle(backend: Any, prefix: str) -> Cycle:
    async def cycle(i: int) -> None:
        assert (await backend.acquire_lease(f"{prefix}{i}", "owner", TTL_MS)).acquired
        await backend.release_lease(f"{prefix}{i}", "owner")

    return cycle


async def cycles(cluster: EtcdCluster, count: int) -> dict[str, float]:
    raw = Raw(cluster)
    await raw.open()
    made = tenure.from_url(cluster.url, prefix="bench/")

    async def raw_cycle(i: int) -> None:
        assert await raw.acquire(b"raw/%d" % i, b"owner")
        await raw.release(b"raw/%d" % i, b"owner")

    try:
        return await alternate({"raw": raw_cycle, "tenure": tenure_cycle(made, "t")}, count)
    finally:
        await raw.close()
        await made.aclose()


async def raw_handoff(holder: Raw, waiter: Raw, key: bytes) -> float:
    assert await holder.acquire(key, b"holder")
    call: Any = waiter.channel.watch.Watch()
    await call.write(rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=key)))
    assert (await call.read()).created

    async def take() -> float:
        while True:
            reply = await call.read()
            freed = any(e.type == rpc.Event.EventType.DELETE for e in reply.events)
            if freed and await waiter.acquire(key, b"waiter"):
                return time.perf_counter()

    taking = asyncio.ensure_future(take())
    await asyncio.sleep(0.02)
    start = time.perf_counter()
    await holder.release(key, b"holder")
    done = await taking
    call.cancel()
    await waiter.release(key, b"waiter")
    return done - start


async def tenure_handoff(holder: EtcdLeases, waiter: EtcdLeases, key: str) -> float:
    assert (await holder.acquire_lease(key, "holder", TTL_MS)).acquired

    async def take() -> float:
        await tenure.acquire_wait(waiter, key, "waiter", TTL_MS, timeout=10)
        return time.perf_counter()

    taking = asyncio.ensure_future(take())
    await asyncio.sleep(0.02)
    start = time.perf_counter()
    await holder.release_lease(key, "holder")
    done = await taking
    await waiter.release_lease(key, "waiter")
    return done - start


async def handoffs(cluster: EtcdCluster, rounds: int) -> dict[str, list[float]]:
    raws = [Raw(cluster), Raw(cluster)]
    for raw in raws:
        await raw.open()
    holder = tenure.from_url(cluster.url, prefix="bench/")
    waiter = tenure.from_url(cluster.url, prefix="bench/")
    assert isinstance(holder, EtcdLeases) and isinstance(waiter, EtcdLeases)
    samples: dict[str, list[float]] = {"raw": [], "tenure": []}
    try:
        for i in range(rounds + 5):
            first = i % 2 == 0
            for kind in ("raw", "tenure") if first else ("tenure", "raw"):
                if kind == "raw":
                    took = await raw_handoff(raws[0], raws[1], b"raw/handoff")
                else:
                    took = await tenure_handoff(holder, waiter, "handoff")
                if i >= 5:  # the first rounds warm up
                    samples[kind].append(took * 1000)
        return samples
    finally:
        for raw in raws:
            await raw.close()
        await holder.aclose()
        await waiter.aclose()


async def side_by_side(cluster: EtcdCluster, redis_url: str, count: int) -> dict[str, float]:
    """tenure's acquire+release cycles/s on etcd, Redis and PostgreSQL, in alternating blocks."""
    from tests.support.servers import POSTGRES_URL

    schema = f"tenure_bench_{uuid.uuid4().hex[:10]}"
    backends = {
        "etcd": tenure.from_url(cluster.url, prefix="compare/"),
        "redis": tenure.from_url(redis_url, prefix="compare:", quarantine=False),
        "postgres": tenure.from_url(POSTGRES_URL, schema=schema),
    }
    try:
        cycles = {name: tenure_cycle(backend, "c") for name, backend in backends.items()}
        return await alternate(cycles, count)
    finally:
        for backend in backends.values():
            await backend.aclose()
        drop_postgres_schema(schema)


def measure(members: int, count: int, rounds: int, compare: bool = False) -> list[Figure]:
    with EtcdCluster(size=members) as cluster:
        print(f"etcd, {members} member(s)")
        rates = run(cycles(cluster, count))
        print(
            f"acquire+release cycles/s: raw {rates['raw']:.0f}, tenure {rates['tenure']:.0f}, "
            f"ratio {rates['tenure'] / rates['raw']:.2f} (goal >= 0.8)"
        )
        samples = run(handoffs(cluster, rounds))
        med = {kind: statistics.median(v) for kind, v in samples.items()}
        p99 = {kind: percentile(v, 0.99) for kind, v in samples.items()}
        print(
            f"hand-off ms, median (p99): raw {med['raw']:.2f} ({p99['raw']:.2f}), "
            f"tenure {med['tenure']:.2f} ({p99['tenure']:.2f}), "
            f"speed ratio raw/tenure {med['raw'] / med['tenure']:.2f} (goal >= 0.8)"
        )
        if compare:
            with RedisServer(persistence=True) as redis:
                side = run(side_by_side(cluster, redis.url, count))
            print(
                "tenure acquire+release cycles/s, side by side: "
                + ", ".join(f"{name} {rate:.0f}" for name, rate in side.items())
                + " (Redis with appendfsync always; PostgreSQL the shared server)"
            )
    return [
        Figure(
            "etcd",
            "sequential acquire+release vs raw transactions",
            rates["tenure"],
            rates["raw"],
            "cycles/s",
            rates["tenure"] / rates["raw"],
            (">=", 0.8),
        ),
        Figure(
            "etcd",
            "hand-off median, speed vs a raw watch + transaction",
            med["tenure"],
            med["raw"],
            "ms",
            med["raw"] / med["tenure"],
            (">=", 0.8),
        ),
    ]


def figures(full: bool = False) -> list[Figure]:
    with stamped("etcd"):
        return measure(1, *(FULL if full else SHORT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=1, choices=[1, 3])
    parser.add_argument("--cycles", type=int, default=FULL[0])
    parser.add_argument("--handoffs", type=int, default=FULL[1])
    parser.add_argument("--compare", action="store_true", help="also Redis and PostgreSQL")
    ns = parser.parse_args()
    with stamped("etcd"):
        found = measure(ns.members, ns.cycles, ns.handoffs, ns.compare)
    print_table(found)


if __name__ == "__main__":
    main()
