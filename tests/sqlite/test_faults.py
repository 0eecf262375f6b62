"""Process faults against the SQLite file: SIGKILL inside a write, a stopped lock holder."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from tenure import BackendUnavailable, Event
from tenure.backends.sqlite import SqlitePubSub
from tenure.testing import eventually

from .conftest import Spawner


def integrity(db: str) -> str:
    conn = sqlite3.connect(db)
    try:
        result: str = conn.execute("PRAGMA integrity_check").fetchone()[0]
        return result
    finally:
        conn.close()


def process_state(pid: int) -> str:
    # /proc/PID/stat: "pid (comm) S ..."; comm may contain spaces, so split after ')'.
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()[0]


@pytest.mark.asyncio
@pytest.mark.parametrize("round_", range(3))
async def test_sigkill_inside_a_write_keeps_the_file_intact_and_loses_nothing_committed(
    spawn: Spawner, db: str, round_: int
) -> None:
    topic = "log"

    async def audit(event: Event) -> None:
        pass

    async with SqlitePubSub(db) as backend:
        # A durable named group keeps every published event in the log for the check below.
        await backend.subscribe(topic, audit, group="audit")
        await backend.unsubscribe(topic, audit)
    setup = sqlite3.connect(db, isolation_level=None)
    setup.execute("CREATE TABLE scratch (batch INTEGER, n INTEGER, pad BLOB)")
    setup.close()

    child = await spawn("writer", db, topic)
    leases: dict[str, int] = {}
    events: list[str] = []
    raw_committed = 0
    in_txn = 0
    # Kill once enough was committed and the raw writer is inside a transaction.
    while len(leases) < 20 + 15 * round_ or in_txn <= raw_committed:
        doc = await child.line()
        if "lease" in doc:
            leases[doc["lease"]] = doc["token"]
        elif "event" in doc:
            events.append(doc["event"])
        elif "raw_committed" in doc:
            raw_committed = doc["raw_committed"]
        elif "raw_in_txn" in doc:
            in_txn = doc["raw_in_txn"]
    child.send(signal.SIGKILL)
    assert await child.wait() == -signal.SIGKILL

    assert integrity(db) == "ok"
    async with SqlitePubSub(db) as backend:
        for key, token in leases.items():
            record = await backend.get_lease(key)
            assert record is not None, key
            assert (record.owner, record.token) == ("writer", token)
    conn = sqlite3.connect(db)
    try:
        stored = {
            row[0] for row in conn.execute("SELECT json_extract(body, '$.id') FROM tenure_events")
        }
        assert set(events) <= stored
        batches = dict(conn.execute("SELECT batch, count(*) FROM scratch GROUP BY batch"))
    finally:
        conn.close()
    assert all(batches.get(b) == 200 for b in range(1, raw_committed + 1))
    assert all(count == 200 for count in batches.values())  # no half-written transaction
    assert raw_committed >= 1


@pytest.mark.asyncio
@pytest.mark.parametrize("ending", ["resumed", "killed"])
async def test_a_stopped_lock_holder_gives_a_clear_error_then_recovery(
    spawn: Spawner, db: str, ending: str
) -> None:
    async with SqlitePubSub(db, busy_timeout_ms=300) as backend:
        assert (await backend.acquire_lease("k", "alice", 60_000)).acquired
        child = await spawn("lock-and-stop", db)
        assert await child.line() == {"locked": True}
        for _ in range(500):
            if process_state(child.pid) == "T":
                break
            await asyncio.sleep(0.01)
        assert process_state(child.pid) == "T"

        with pytest.raises(BackendUnavailable, match="locked") as info:
            await asyncio.wait_for(backend.acquire_lease("k2", "bob", 60_000), 30)
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        with pytest.raises(BackendUnavailable, match="busy_timeout_ms=300"):
            await asyncio.wait_for(backend.release_lease("k", "alice"), 30)
        # WAL readers are not blocked by the writer's lock.
        assert await backend.get_lease_owner("k") == "alice"

        if ending == "resumed":
            child.send(signal.SIGCONT)
            assert await child.line() == {"committed": True}
            assert await child.wait() == 0
        else:
            child.send(signal.SIGKILL)
            assert await child.wait() == -signal.SIGKILL
        granted = await asyncio.wait_for(backend.acquire_lease("k2", "bob", 60_000), 30)
        assert granted.acquired
        assert await backend.get_lease_owner("k") == "alice"
    assert integrity(db) == "ok"


@pytest.mark.asyncio
async def test_reclaim_takes_back_at_once_what_a_killed_member_held_first_and_in_order(
    spawn: Spawner, db: str
) -> None:
    """A group member is SIGKILLed while handling events (the default 30 s redelivery
    timeout): a new member that reclaims gets them at once, before a newer event, in
    publish order, and ``backlog`` lists the topic until they are acknowledged."""
    topic = "thread/one"
    got: list[Event] = []
    gate = asyncio.Event()

    async def successor(event: Event) -> None:
        got.append(event)
        await gate.wait()

    def taken_by_child() -> int:
        conn = sqlite3.connect(db)
        try:
            value: int = conn.execute(
                "SELECT count(*) FROM tenure_pending WHERE consumer IS NOT NULL"
            ).fetchone()[0]
            return value
        finally:
            conn.close()

    async with SqlitePubSub(db) as backend:
        await backend.get_lease_owner("warm-up")
        doomed = await spawn("subscriber", db, topic, "g", "hang", "30")
        assert await doomed.line() == {"ready": True}
        sent = [await backend.publish(topic, Event(type="t", data=n)) for n in range(3)]
        claimed = await doomed.line()  # handling the first; the others wait in its queue
        assert (claimed["id"], claimed["attempt"]) == (sent[0].id, 1)
        for _ in range(500):
            if taken_by_child() == 3:
                break
            await asyncio.sleep(0.01)
        assert taken_by_child() == 3
        doomed.send(signal.SIGKILL)
        assert await doomed.wait() == -signal.SIGKILL
        newer = await backend.publish(topic, Event(type="t", data=3))
        assert await backend.backlog("thread/", "g") == [topic]

        started = time.monotonic()
        assert await backend.reclaim(topic, "g") == 3
        await backend.subscribe(topic, successor, group="g")
        await eventually(lambda: len(got) == 1, timeout=20)
        assert await backend.backlog("thread/", "g") == [topic]  # not acknowledged yet
        gate.set()
        await eventually(lambda: len(got) == 4, timeout=20)
        elapsed = time.monotonic() - started
        assert elapsed < 5, elapsed  # not after the 30 s visibility timeout
        assert [e.id for e in got] == [e.id for e in [*sent, newer]]
        assert [e.attempt for e in got] == [2, 2, 2, 1]
        await backend.flush()
        for _ in range(100):
            if await backend.backlog("thread/", "g") == []:
                break
            await asyncio.sleep(0.05)
        assert await backend.backlog("thread/", "g") == []
        await backend.unsubscribe(topic, successor)
