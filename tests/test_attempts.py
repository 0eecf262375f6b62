"""Attempts count the deliveries a callback got, not the events a dead reader took.

A group member takes events in batches and dies (a poison event that kills its
reader, or owners killed in a row): the events it took and never reached must
not spend an attempt each time, or innocent events behind the poison one reach
``max_attempts`` and are dropped with it. Real processes, SIGKILLed, on the
shared SQLite file, Redis and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tenure
from tenure import Event, LeaseFence
from tenure.testing import eventually
from tests.conftest import TARGETS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def shared_url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    """An isolated URL of each backend with consumer groups that processes can share."""
    target = TARGETS[request.param]
    yield target.isolated_url(unique, tmp_path)
    if target.cleanup is not None:
        target.cleanup(unique)


@pytest.mark.asyncio
@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "plain"])
async def test_readers_killed_in_a_row_spend_no_attempt_of_the_events_behind(
    shared_url: str, tmp_path: Path, fenced: bool
) -> None:
    """Five readers in a row are SIGKILLed while handling the first of ten events,
    each successor reclaiming what the last left (as a runtime's next owner does).
    The first event is spent (five deliveries, ``max_attempts`` 5); the nine
    behind it were never handed to a callback: each counted at most the one
    delivery of the take that first took them, fenced (a runtime's thread) or not."""
    async with tenure.from_url(shared_url) as opened:
        owner: Any = opened  # a backend that carries events
        created: list[Event] = []

        async def creator(event: Event) -> None:
            created.append(event)

        await owner.subscribe("work", creator, group="g")  # the group, at the log's end
        await owner.unsubscribe("work", creator)
        sent = [await owner.publish("work", Event(type="t", data=i)) for i in range(10)]
        for n in range(5):
            where = tmp_path / str(n)
            where.mkdir()
            fence: list[str] = []
            if fenced:
                assert (await owner.acquire_lease("lease", f"reader-{n}/1", 60_000)).acquired
                fence = ["lease", f"reader-{n}/"]
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.support.hanging_subscriber",
                shared_url,
                "work",
                "g",
                str(where),
                *fence,
                cwd=ROOT,
                stdin=asyncio.subprocess.DEVNULL,
            )
            try:
                got = where / "got"
                await eventually(lambda g=got: g.exists() and g.read_text() != "", timeout=30)  # type: ignore[misc]
                assert got.read_text() == "0"
            finally:
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
            if fenced:
                await owner.release_lease("lease", f"reader-{n}/1")
            assert await owner.reclaim("work", "g") >= 1
        got_last: list[Event] = []

        async def last(event: Event) -> None:
            got_last.append(event)

        if fenced:
            assert (await owner.acquire_lease("lease", "last/1", 60_000)).acquired
        await owner.subscribe(
            "work", last, group="g", fence=LeaseFence("lease", "last/") if fenced else None
        )
        await eventually(lambda: len(got_last) >= 9, timeout=30)
        await asyncio.sleep(0.3)
        await owner.unsubscribe("work", last)
    assert [e.data for e in got_last] == list(range(1, 10))  # the first spent, none of the rest
    assert {e.id for e in got_last} == {e.id for e in sent[1:]}
    assert all(e.attempt <= 2 for e in got_last), [e.attempt for e in got_last]
