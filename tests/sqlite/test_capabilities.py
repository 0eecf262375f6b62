"""DEDUPE, RECLAIM and BACKLOG on real SQLite files, across instances (connections),
and the migration of a file made by the version before them."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tenure import ConfigurationError, Event, InvalidArgument
from tenure.backends.sqlite import SqlitePubSub
from tenure.backends.sqlite._connection import _MIGRATIONS, load_sql
from tenure.testing import eventually


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def noop(event: Event) -> None:
    pass


# -- DEDUPE ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_concurrent_publishes_of_one_id_from_two_instances_store_one_event(
    tmp_path: Path,
) -> None:
    db = tmp_path / "d.db"
    async with SqlitePubSub(db) as a, SqlitePubSub(db) as b:
        await a.subscribe("t", noop, group="g")
        await a.unsubscribe("t", noop)
        sent = [Event(type="t", data=n, id=f"id-{n % 5}") for n in range(40)]
        results = await asyncio.gather(
            *((a if n % 2 else b).publish("t", e) for n, e in enumerate(sent))
        )
        stored = rows(
            db, "SELECT json_extract(body, '$.id'), json_extract(body, '$.data') FROM tenure_events"
        )
        assert sorted(i for i, _ in stored) == [f"id-{n}" for n in range(5)]
        first = dict(stored)
        for result in results:
            assert result.data == first[result.id]  # every caller got the stored event


@pytest.mark.asyncio
async def test_a_retry_after_the_event_was_handled_and_pruned_is_still_recognised(
    tmp_path: Path,
) -> None:
    db = tmp_path / "d.db"
    got: list[Event] = []

    async def handle(event: Event) -> None:
        got.append(event)

    async with SqlitePubSub(db, prune_interval=0.05) as backend:
        await backend.subscribe("t", handle, group="g")
        first = await backend.publish("t", Event(type="t", data="once", id="signal"))
        plain = await backend.publish("t", Event(type="t", data="plain"))
        await eventually(lambda: len(got) == 2)
        await backend.flush()
        await asyncio.sleep(0.2)
        await backend.publish("other", Event(type="t"))  # publishing prunes when due
        # The acknowledged event without an id is pruned, the one with an id is kept.
        ids = [r[0] for r in rows(db, "SELECT json_extract(body, '$.id') FROM tenure_events")]
        assert ids == ["signal"] and plain.id not in ids
        again = await backend.publish("t", Event(type="t", data="twice", id="signal"))
        assert (again.id, again.created_at, again.data) == (first.id, first.created_at, "once")
        await asyncio.sleep(0.3)
        assert [e.data for e in got] == ["once", "plain"]
        await backend.unsubscribe("t", handle)


@pytest.mark.asyncio
async def test_an_id_is_stored_again_after_the_dedupe_window(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    async with SqlitePubSub(db, prune_interval=0.05, dedupe_window=0.2) as backend:
        await backend.subscribe("t", noop, group="g")
        first = await backend.publish("t", Event(type="t", data=1, id="x"))
        await backend.flush()
        await asyncio.sleep(0.4)
        await backend.publish("other", Event(type="t"))  # prunes
        assert rows(db, "SELECT count(*) FROM tenure_events") == [(0,)]
        later = await backend.publish("t", Event(type="t", data=2, id="x"))
        assert later.data == 2 and later.created_at != first.created_at
        await backend.unsubscribe("t", noop)


@pytest.mark.asyncio
async def test_the_same_id_on_two_topics_is_two_events(tmp_path: Path) -> None:
    got: list[tuple[str, object]] = []

    async def on_a(event: Event) -> None:
        got.append(("a", event.data))

    async def on_b(event: Event) -> None:
        got.append(("b", event.data))

    async with SqlitePubSub(tmp_path / "d.db") as backend:
        await backend.subscribe("a", on_a, group="g")
        await backend.subscribe("b", on_b, group="g")
        await backend.publish("a", Event(type="t", data=1, id="same"))
        await backend.publish("b", Event(type="t", data=2, id="same"))
        await eventually(lambda: len(got) == 2)
        assert sorted(got) == [("a", 1), ("b", 2)]
        await backend.unsubscribe("a", on_a)
        await backend.unsubscribe("b", on_b)


# -- RECLAIM -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_late_ack_of_a_reclaimed_delivery_neither_loses_nor_repeats_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "r.db"
    got: list[tuple[str | None, int]] = []
    release = asyncio.Event()

    async def slow(event: Event) -> None:
        got.append((event.id, event.attempt))
        await release.wait()

    async with (
        SqlitePubSub(db, visibility_timeout=0.6) as member,
        SqlitePubSub(db) as other,
    ):
        await member.subscribe("t", slow, group="g")
        sent = await member.publish("t", Event(type="t"))
        await eventually(lambda: len(got) == 1)
        assert await other.reclaim("t", "g") == 1
        # (The member may take the event again at once: that is the point.)
        release.set()  # the old delivery ends; its acknowledgement changes nothing
        await eventually(lambda: len(got) == 2, timeout=10)
        assert got == [(sent.id, 1), (sent.id, 2)]
        await member.flush()
        await asyncio.sleep(1.5)  # past the visibility timeout: no third delivery
        assert len(got) == 2
        assert rows(db, "SELECT count(*) FROM tenure_pending") == [(0,)]
        await member.unsubscribe("t", slow)


@pytest.mark.asyncio
async def test_reclaim_needs_an_existing_group_and_checks_its_arguments(tmp_path: Path) -> None:
    async with SqlitePubSub(tmp_path / "r.db") as backend:
        assert await backend.reclaim("nothing", "g") == 0
        await backend.subscribe("t", noop, group="g")
        await backend.publish("t", Event(type="t"))
        await backend.flush()
        assert await backend.reclaim("t", "other") == 0
        with pytest.raises(InvalidArgument):
            await backend.reclaim("", "g")
        with pytest.raises(InvalidArgument):
            await backend.reclaim("t", "")
        await backend.unsubscribe("t", noop)


@pytest.mark.asyncio
async def test_a_live_member_does_not_deliver_again_what_was_reclaimed_from_it(
    tmp_path: Path,
) -> None:
    """The old holder skips the events it had queued once they are reclaimed: it learns
    from its heartbeat (another member took them) or from taking them again itself."""
    db = tmp_path / "r.db"
    old: list[Any] = []
    new: list[Any] = []
    release = asyncio.Event()

    async def stuck(event: Event) -> None:
        old.append(event.data)
        await release.wait()

    async def successor(event: Event) -> None:
        new.append(event.data)

    async with (
        SqlitePubSub(db, visibility_timeout=1.5) as holder,
        SqlitePubSub(db) as taker,
    ):
        await holder.subscribe("t", stuck, group="g")
        for n in range(3):
            await holder.publish("t", Event(type="t", data=n))
        await eventually(lambda: old == [0])
        await eventually(lambda: rows(db, "SELECT count(*) FROM tenure_pending") == [(3,)])
        assert await taker.reclaim("t", "g") == 3
        await taker.subscribe("t", successor, group="g")
        await asyncio.sleep(1.0)  # past the holder's next heartbeat
        release.set()
        await eventually(lambda: len(old) + len(new) >= 4, timeout=10)
        await asyncio.sleep(0.5)
        await holder.flush()
        await taker.flush()
        # 0 was being handled when reclaimed: delivered once more; 1 and 2 only once.
        assert sorted(old[1:] + new) == [0, 1, 2], (old, new)
        await holder.unsubscribe("t", stuck)
        await taker.unsubscribe("t", successor)


# -- BACKLOG -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_backlog_matches_the_prefix_exactly(tmp_path: Path) -> None:
    topics = ["ns/a", "ns/b%", "ns_c", "nsX", "ns/", "ns/\u00e9t\u00e9", "ns/\U0001f600", "ns0"]
    async with SqlitePubSub(tmp_path / "b.db") as backend:
        for topic in topics:
            await backend.subscribe(topic, noop, group="g")
            await backend.unsubscribe(topic, noop)
            await backend.publish(topic, Event(type="t"))
        assert sorted(await backend.backlog("ns/", "g")) == sorted(
            t for t in topics if t.startswith("ns/")
        )
        assert await backend.backlog("ns_", "g") == ["ns_c"]
        assert await backend.backlog("ns%", "g") == []
        assert await backend.backlog("ns/\u00e9", "g") == ["ns/\u00e9t\u00e9"]
        assert sorted(await backend.backlog("", "g")) == sorted(topics)
        assert await backend.backlog("ns/", "h") == []
        with pytest.raises(InvalidArgument):
            await backend.backlog(b"ns/", "g")  # type: ignore[arg-type]  # checked at run time
        with pytest.raises(InvalidArgument):
            await backend.backlog("ns/", "")


@pytest.mark.asyncio
async def test_backlog_sees_other_processes_and_ignores_idle_groups(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    async with SqlitePubSub(db) as reader, SqlitePubSub(db) as writer:
        for n in range(200):  # idle threads: a group, every event acknowledged
            await reader.subscribe(f"ns/idle-{n}", noop, group="g")
        await writer.publish("ns/idle-7", Event(type="t"))
        await reader.flush()
        for n in range(200):
            await reader.unsubscribe(f"ns/idle-{n}", noop)
        await eventually(lambda: rows(db, "SELECT count(*) FROM tenure_pending") == [(0,)])
        assert await writer.backlog("ns/", "g") == []
        await writer.publish("ns/idle-3", Event(type="t"))
        assert await writer.backlog("ns/", "g") == ["ns/idle-3"]
        # Only groups with unread events are in the index the query searches.
        plan = rows(
            db,
            "EXPLAIN QUERY PLAN "
            + load_sql("group_backlog")
            .replace("?1", "x'67'")
            .replace("?2", "x''")
            .replace("?3", "x'ff'"),
        )
        assert any("tenure_groups_unread" in str(step) for step in plan), plan


# -- migration ---------------------------------------------------------------------------


def old_file(db: Path) -> None:
    """A file as the version before DEDUPE/RECLAIM/BACKLOG left it: a group ``g`` on
    topic ``t`` with one event taken and one unread."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(load_sql("schema"))
        conn.execute(
            "INSERT INTO tenure_groups (topic, name, cursor, private, alive_until) "
            "VALUES (x'74', x'67', 1, 0, 0)"
        )
        for n in (1, 2):
            body = Event(type="t", data=n, id=f"old-{n}", created_at=1e10).to_json()
            conn.execute(
                "INSERT INTO tenure_events (id, topic, body, created_at) VALUES (?, x'74', ?, 1e10)",
                (n, body),
            )
        conn.execute(
            "INSERT INTO tenure_pending (group_id, event_id, attempt, visible_at, consumer) "
            "VALUES (1, 1, 1, 1e10, 'dead')"
        )
        assert conn.execute("PRAGMA user_version").fetchone() == (0,)
    finally:
        conn.close()


@pytest.mark.asyncio
async def test_a_file_of_the_previous_version_is_migrated_once_and_keeps_its_events(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    old_file(db)
    got: list[tuple[object, int]] = []

    async def handle(event: Event) -> None:
        got.append((event.data, event.attempt))

    # Several instances open the old file at once: one migrates, none fails.
    backends = [SqlitePubSub(db) for _ in range(4)]
    try:
        await asyncio.gather(*(b.get_lease_owner("warm-up") for b in backends))
        first = backends[0]
        assert rows(db, "PRAGMA user_version") == [(len(_MIGRATIONS),)]
        assert await first.backlog("", "g") == ["t"]
        assert await first.reclaim("t", "g") == 1
        await first.subscribe("t", handle, group="g")
        await eventually(lambda: len(got) == 2, timeout=10)
        assert got == [(1, 2), (2, 1)]
        new = await first.publish("t", Event(type="t", data=3, id="new"))
        assert (await first.publish("t", Event(type="t", data=4, id="new"))).data == 3
        await eventually(lambda: len(got) == 3)
        await first.flush()
        await eventually(lambda: rows(db, "SELECT count(*) FROM tenure_pending") == [(0,)])
        assert await first.backlog("", "g") == []
        assert new.data == 3
        await first.unsubscribe("t", handle)
    finally:
        for b in backends:
            await b.aclose()


def test_the_dedupe_window_is_an_option(tmp_path: Path) -> None:
    backend = SqlitePubSub.from_url(f"sqlite:///{tmp_path}/o.db?dedupe_window=60")
    assert backend._opts.dedupe_window == 60.0
    with pytest.raises(ConfigurationError, match="dedupe_window"):
        SqlitePubSub(tmp_path / "o.db", dedupe_window=0)


@pytest.mark.asyncio
async def test_live_leases_are_readable_with_plain_sql(tmp_path: Path) -> None:
    db = tmp_path / "plain.db"
    async with SqlitePubSub(db) as backend:
        granted = await backend.acquire_lease("thread/é-1", "worker a", 60_000)
        await backend.acquire_lease("gone", "b", 1)
        await asyncio.sleep(0.01)
        await backend.acquire_lease("k\0nul", "c", 60_000)
    found = rows(db, "SELECT key, owner, token, ttl_ms, expires_at FROM tenure_leases_live")
    by_key = {row[0]: row for row in found}
    assert set(by_key) == {"thread/é-1", "k\0nul"}
    _, owner, token, ttl_ms, expires_at = by_key["thread/é-1"]
    assert (owner, token) == ("worker a", granted.token)
    assert 0 < ttl_ms <= 60_000
    assert str(expires_at).endswith("Z")
