"""What idle subscribers cost the SQLite file: the statements the backend's connections
run, counted by a trace callback set on each connection as it is opened."""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tenure import Event
from tenure.backends.sqlite import SqlitePubSub
from tenure.testing import eventually

GROUPS = 40


@pytest.mark.asyncio
async def test_idle_subscribers_are_looked_at_together_each_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The maintenance tick asks once which of the subscribed groups have
    something to fetch, rather than three reads per group per tick; a group that has
    something (a redelivery falling due) is still woken by it."""
    seen: Counter[str] = Counter()
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **kwargs)
        conn.set_trace_callback(lambda statement: seen.update([statement.split()[0].upper()]))
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)
    got: list[int] = []
    fail_once = [True]

    async def noop(event: Event) -> None:
        pass

    async def flaky(event: Event) -> None:
        if fail_once.pop() if fail_once else False:
            raise RuntimeError("redeliver me")
        got.append(1)

    async with SqlitePubSub(tmp_path / "idle.db", visibility_timeout=1.0) as backend:
        for n in range(GROUPS):
            await backend.subscribe(f"idle-{n}", noop, group="g")
        await backend.subscribe("busy", flaky, group="g")
        await backend.publish("busy", Event(type="t"))
        # The failed delivery comes back only once due: found by a tick's look.
        await eventually(lambda: got == [1], timeout=10)
        seen.clear()
        await asyncio.sleep(2.2)  # eight ticks, every subscriber idle
    # Three reads per group per tick would be about 3 * 41 * 8 (a tick every 0.25 s
    # with this visibility_timeout); the transactions of the process's own upkeep
    # (and of its polling, where a long tmp_path rules out wake-up sockets) do not
    # grow with the groups and are not counted.
    assert seen["SELECT"] + seen["UPDATE"] < GROUPS, seen
