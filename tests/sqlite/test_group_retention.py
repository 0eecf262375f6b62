"""SQLite ``group_retention``: idle named groups forgotten, never one with work left."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from tenure import ConfigurationError, Event, from_url
from tenure.backends.sqlite import SqlitePubSub
from tenure.testing import eventually

# A member keeps its group alive for 5 * visibility_timeout after each heartbeat
# or join: 0.5 s here. Then the group is idle; the retention counts from there.
_VT = 0.1
_IDLE_AFTER = 5 * _VT + 0.2


def named_groups(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT topic, name FROM tenure_groups WHERE private = 0").fetchall()
    return sorted((bytes(t).decode(), bytes(n).decode()) for t, n in rows)


@pytest.mark.parametrize("bad", [-1, "-0.5", "soon", float("inf"), True])
def test_group_retention_is_checked(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ConfigurationError, match="group_retention"):
        SqlitePubSub(tmp_path / "t.db", group_retention=bad)


def test_group_retention_is_an_url_option_and_off_by_default(tmp_path: Path) -> None:
    assert SqlitePubSub(tmp_path / "a.db").forgets_idle_groups is False
    assert SqlitePubSub(tmp_path / "b.db", group_retention=0).forgets_idle_groups is False
    backend = from_url(f"sqlite:///{tmp_path / 'c.db'}?group_retention=2.5")
    assert isinstance(backend, SqlitePubSub)
    assert backend.forgets_idle_groups is True


@pytest.mark.asyncio
async def test_an_idle_group_goes_but_not_one_with_unread_or_claimed_events(
    short_tmp: Path,
) -> None:
    """Three idle named groups: one drained (forgotten), one with an event published
    after its member left (kept), one with an event its member had taken when it
    closed (kept); the kept ones deliver their events to the next member."""
    db = short_tmp / "t.db"
    got: list[str] = []
    taken = asyncio.Event()

    async def record(event: Event) -> None:
        got.append(event.type)

    async def stuck(event: Event) -> None:
        taken.set()
        await asyncio.Event().wait()

    async with SqlitePubSub(db, visibility_timeout=_VT) as member:
        for topic in ("drained", "unread"):
            await member.subscribe(topic, record, group="g")
            await member.unsubscribe(topic, record)
        await member.publish("unread", Event(type="unread"))
        await member.subscribe("claimed", stuck, group="g")
        await member.publish("claimed", Event(type="claimed"))
        await asyncio.wait_for(taken.wait(), 5)  # never returns: handed back at close
    assert len(named_groups(db)) == 3
    await asyncio.sleep(_IDLE_AFTER + 0.1)
    async with SqlitePubSub(
        db, visibility_timeout=_VT, group_retention=0.1, prune_interval=0.1
    ) as pruner:
        await pruner.subscribe("other", record)  # its upkeep prunes
        await eventually(lambda: ("drained", "g") not in named_groups(db), timeout=5)
        assert named_groups(db) == [("claimed", "g"), ("unread", "g")]
        for topic in ("unread", "claimed"):
            await pruner.subscribe(topic, record, group="g")
        await eventually(lambda: sorted(got) == ["claimed", "unread"], timeout=5)
        for topic in ("unread", "claimed"):
            await pruner.unsubscribe(topic, record)
        await eventually(lambda: named_groups(db) == [], timeout=5)


@pytest.mark.asyncio
async def test_a_group_joined_again_is_alive_before_its_first_heartbeat(short_tmp: Path) -> None:
    """A member that joins an idle group makes it alive at once: a prune by another
    instance between the join and the member's first heartbeat must not delete it,
    or the event published next would not be stored (its topic had no group)."""
    db = short_tmp / "t.db"
    got: list[Event] = []

    async def record(event: Event) -> None:
        got.append(event)

    # The member heart-beats every visibility_timeout / 3 = 0.1 s: the prune
    # below runs well before its first heartbeat after the join.
    vt = 0.3
    async with (
        SqlitePubSub(db, visibility_timeout=vt) as member,
        SqlitePubSub(db, group_retention=0.1, prune_interval=1.0) as pruner,
    ):
        await pruner.publish("warm", Event(type="x"))  # its first prune, before the test
        await member.subscribe("t", record, group="g")
        await member.unsubscribe("t", record)
        await asyncio.sleep(5 * vt + 0.2)  # idle for longer than the retention
        await member.subscribe("t", record, group="g")
        await pruner.publish("warm", Event(type="x"))  # prunes: over a second since the last
        assert named_groups(db) == [("t", "g")]
        await member.publish("t", Event(type="after"))
        await eventually(lambda: [e.type for e in got] == ["after"], timeout=5)
