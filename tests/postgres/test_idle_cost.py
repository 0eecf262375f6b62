"""What an idle subscriber costs PostgreSQL: counted in a private server's statement log."""

from __future__ import annotations

import asyncio

import pytest

import tenure
from tenure import Event
from tenure.testing import eventually

from ..support.pg_server import PgServer

GROUPS = 20


@pytest.mark.asyncio
async def test_the_fallback_poll_takes_only_in_groups_with_something_due() -> None:
    """Members each holding their event (a run waiting): the fallback poll asks once
    for all of them which have claims due, and takes in none, rather than one take
    per group per poll."""
    holding = 0
    release = asyncio.Event()

    async def hold(event: Event) -> None:
        nonlocal holding
        holding += 1
        await release.wait()

    with PgServer(settings={"log_statement": "all"}) as server:
        backend = tenure.events_of(tenure.from_url(f"{server.url}?poll_interval=0.02"))

        def counted() -> tuple[int, int]:
            text = server.log.read_text(errors="replace")
            return text.count("FOR UPDATE SKIP LOCKED"), text.count("SELECT DISTINCT group_id")

        try:
            for i in range(GROUPS):
                await backend.subscribe(f"topic-{i}", hold, group="g")
                await backend.publish(f"topic-{i}", Event(type="t"))
            await eventually(lambda: holding == GROUPS)
            # A group takes once more right after its first batch (a publish may
            # have found its claims still waiting): let those settle first.
            settled = counted()[1]
            await eventually(lambda: counted()[1] >= settled + 3, timeout=30)
            takes, polls = counted()
            await eventually(lambda: counted()[1] >= polls + 10, timeout=30)
            # Without it, each of the 10 polls takes in each of the groups.
            assert counted()[0] - takes < GROUPS
            release.set()
        finally:
            release.set()
            await backend.aclose()
