"""A callback that raises gets its event again before any newer event of its group.

A group's member takes events in batches; one whose callback raised goes back to
the front of what the member holds, not behind the events taken with it: the
thread runtime reads a thread's signals through such a group, and a signal
retried after the newer ones would run out of order (a PostgreSQL thread soak
found it: a run that failed before reading its signal had it retried behind the
next one). The memory backend is not here: it runs a member's callbacks several
at once, in publish order but not one after the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tenure
from tenure import Event
from tenure.testing import eventually
from tests.conftest import TARGETS


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    target = TARGETS[request.param]
    yield target.isolated_url(unique, tmp_path)
    if target.cleanup is not None:
        target.cleanup(unique)


@pytest.mark.asyncio
async def test_a_retried_event_comes_before_the_newer_ones_taken_with_it(url: str) -> None:
    async with tenure.from_url(url) as opened:
        backend: Any = opened  # a backend that carries events
        seen: list[tuple[int, int]] = []

        async def creator(event: Event) -> None:
            pass

        await backend.subscribe("work", creator, group="g")  # the group, at the log's end
        await backend.unsubscribe("work", creator)
        for i in range(6):  # all waiting when the member comes: taken together
            await backend.publish("work", Event(type="t", data=i))

        async def member(event: Event) -> None:
            seen.append((event.data, event.attempt))
            if event.data in (0, 3) and event.attempt == 1:
                raise RuntimeError("fails once")

        await backend.subscribe("work", member, group="g")
        try:
            await eventually(lambda: len(seen) == 8, timeout=20)
        finally:
            await backend.unsubscribe("work", member)
        assert seen == [(0, 1), (0, 2), (1, 1), (2, 1), (3, 1), (3, 2), (4, 1), (5, 1)]
