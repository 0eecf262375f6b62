"""Several real OS processes sharing one SQLite file: races, wake-ups, cross-process delivery."""

from __future__ import annotations

import asyncio
import itertools
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tenure import Event
from tenure.backends.sqlite import SqlitePubSub
from tenure.testing import eventually

from ..support.waiting import until_parked
from .conftest import Child, Spawner

PROCESSES = 4


async def start_together(
    spawn: Spawner, db: str, *args_per_child: list[str], fresh: bool = False
) -> list[Child]:
    if not fresh:
        async with SqlitePubSub(db) as backend:  # create the schema once, before the race
            await backend.get_lease_owner("warm-up")
    children = [await spawn(*args) for args in args_per_child]
    for child in children:
        assert await child.line() == {"ready": True}
    Path(db + ".go").touch()  # noqa: ASYNC240 - a single tiny file, nothing to wait for
    return children


@pytest.mark.asyncio
@pytest.mark.parametrize("fresh", [False, True], ids=["existing-file", "fresh-file"])
async def test_every_round_has_exactly_one_winner_across_processes(
    spawn: Spawner, db: str, fresh: bool
) -> None:
    # fresh-file: the processes also race to create the file, switch it to WAL
    # and create the schema.
    rounds = 150
    children = await start_together(
        spawn, db, *[["rounds", db, f"p{i}", str(rounds)] for i in range(PROCESSES)], fresh=fresh
    )
    outcomes = [await child.rest() for child in children]
    by_round: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for i, docs in enumerate(outcomes):
        assert len(docs) == rounds
        for doc in docs:
            by_round.setdefault(doc["round"], []).append((f"p{i}", doc))
    assert sorted(by_round) == list(range(rounds))
    tokens = []
    for r, results in by_round.items():
        winners = [(name, doc) for name, doc in results if doc["acquired"]]
        assert len(winners) == 1, (r, results)
        winner, grant = winners[0]
        assert grant["owner"] == winner
        assert all(doc["owner"] == winner for _, doc in results), (r, results)
        assert all(doc["token"] is None for _, doc in results if not doc["acquired"])
        tokens.append(grant["token"])
    assert len(set(tokens)) == rounds  # one counter: no token is ever issued twice


@pytest.mark.asyncio
async def test_one_key_contended_by_processes_is_exclusive_and_tokens_increase(
    spawn: Spawner, db: str
) -> None:
    children = await start_together(
        spawn, db, *[["mutex", db, f"p{i}", "2.0"] for i in range(PROCESSES)]
    )
    grants = [doc for child in children for doc in await child.rest()]
    assert len(grants) >= 20, "too few grants to say anything"
    assert len({g["token"] for g in grants}) == len(grants)
    grants.sort(key=lambda g: g["token"])
    for before, after in itertools.pairwise(grants):
        # Windows measured on one host-wide monotonic clock never overlap, and a
        # higher token always starts after the lower one's holder was done.
        assert before["end"] < after["start"], (before, after)


@pytest.mark.asyncio
async def test_release_in_another_process_wakes_a_local_waiter(spawn: Spawner, db: str) -> None:
    holder = await spawn("holder", db, "shared-key")
    assert (await holder.line())["held"] is True
    async with SqlitePubSub(db) as backend:
        assert await backend.wait_lease_released("shared-key", timeout=0.2) is False
        waiter = asyncio.create_task(backend.wait_lease_released("shared-key", timeout=30))
        await until_parked(backend, "shared-key")  # looked, saw the child's lease, asleep
        assert not waiter.done()
        await holder.write("release\n")
        assert await holder.line() == {"released": True}
        assert await waiter is True
        assert (await backend.acquire_lease("shared-key", "parent", 1000)).acquired


@pytest.mark.asyncio
async def test_events_cross_processes_fan_out_and_groups(spawn: Spawner, db: str) -> None:
    topic = "jobs"
    async with SqlitePubSub(db) as backend:
        await backend.get_lease_owner("warm-up")
        fan = [await spawn("subscriber", db, topic, "-", "ack", "30") for _ in range(2)]
        workers = [await spawn("subscriber", db, topic, "workers", "ack", "30") for _ in range(2)]
        for child in fan + workers:
            assert await child.line() == {"ready": True}
        sent = [await backend.publish(topic, Event(type="job", data=i)) for i in range(30)]
        ids = [str(e.id) for e in sent]

        async def collect(child: Child, stop: asyncio.Event, into: list[dict[str, Any]]) -> None:
            while not stop.is_set():
                try:
                    into.append(await child.line(timeout=0.2))
                except TimeoutError:
                    pass

        got: dict[int, list[dict[str, Any]]] = {c.pid: [] for c in fan + workers}
        stop = asyncio.Event()
        readers = [asyncio.create_task(collect(c, stop, got[c.pid])) for c in fan + workers]
        await eventually(
            lambda: (
                all(len(got[c.pid]) >= 30 for c in fan)
                and sum(len(got[c.pid]) for c in workers) >= 30
            ),
            timeout=30,
        )
        await asyncio.sleep(0.5)  # room for a duplicate to show up
        stop.set()
        await asyncio.gather(*readers)
    for child in fan:
        assert [d["id"] for d in got[child.pid]] == ids
    delivered = sorted(d["id"] for c in workers for d in got[c.pid])
    assert delivered == sorted(ids)
    assert all(d["attempt"] == 1 for c in fan + workers for d in got[c.pid])


@pytest.mark.asyncio
async def test_events_of_a_killed_subscriber_are_redelivered_to_the_group(
    spawn: Spawner, db: str
) -> None:
    topic = "work"
    got: list[Event] = []

    async def survivor(event: Event) -> None:
        got.append(event)

    async with SqlitePubSub(db, visibility_timeout=1.0) as backend:
        await backend.get_lease_owner("warm-up")
        doomed = await spawn("subscriber", db, topic, "g", "hang", "1.0")
        assert await doomed.line() == {"ready": True}
        sent = await backend.publish(topic, Event(type="t", data="precious"))
        claimed = await doomed.line()
        assert (claimed["id"], claimed["attempt"]) == (sent.id, 1)
        doomed.send(signal.SIGKILL)
        await doomed.wait()
        await backend.subscribe(topic, survivor, group="g")
        await eventually(lambda: len(got) == 1, timeout=20)
        assert (got[0].id, got[0].data, got[0].attempt) == (sent.id, "precious", 2)
        await backend.flush()
        await asyncio.sleep(1.5)  # past the visibility timeout: no third delivery
        assert len(got) == 1
        await backend.unsubscribe(topic, survivor)


@pytest.mark.asyncio
async def test_the_private_group_of_a_killed_fan_out_subscriber_is_cleaned_up(
    spawn: Spawner, db: str
) -> None:
    def rows(table: str) -> int:
        conn = sqlite3.connect(db)
        try:
            value: int = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            return value
        finally:
            conn.close()

    async with SqlitePubSub(db, prune_interval=0.1) as backend:
        await backend.get_lease_owner("warm-up")
        # visibility_timeout=0.2: its group is stale 1 s after its last heartbeat.
        child = await spawn("subscriber", db, "news", "-", "ack", "0.2")
        assert await child.line() == {"ready": True}
        await backend.publish("news", Event(type="t", data=0))
        assert (await child.line())["data"] == 0
        child.send(signal.SIGKILL)
        await child.wait()
        await backend.publish("news", Event(type="t", data=1))
        assert rows("tenure_groups") == 1
        assert rows("tenure_events") >= 1  # kept for the (dead) group

        async def publish_until_clean() -> None:
            while rows("tenure_groups") or rows("tenure_events"):
                await backend.publish("news", Event(type="t"))  # publishing prunes when due
                await asyncio.sleep(0.1)

        await asyncio.wait_for(publish_until_clean(), 30)
