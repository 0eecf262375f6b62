"""A backend that refuses a thread's lease to everyone (a Redis quarantine) says so:
the runtime announces it, and the demo's live view shows it."""

from __future__ import annotations

import pytest

from tenure import RuntimeEvent, ThreadRun, ThreadRuntime
from tenure.backends.redis import RedisStreamsPubSub
from tenure.demo._view import DemoState
from tenure.testing import eventually

from ..support.redis_server import RedisServer


@pytest.mark.asyncio
async def test_a_quarantined_thread_is_announced_then_runs_once_it_ends() -> None:
    events: list[RuntimeEvent] = []
    handled: list[object] = []

    async def handler(run: ThreadRun) -> None:
        handled.extend([signal.payload async for signal in run.signals()])

    # A fresh server without appendfsync always: new grants wait out max_ttl_ms.
    with RedisServer() as server:
        backend = RedisStreamsPubSub.from_url(server.url, max_ttl_ms=2000)
        try:
            async with ThreadRuntime(
                backend, handler, ttl_ms=1000, idle_timeout=0.05, on_event=events.append
            ) as runtime:
                sent = await runtime.send_signal("t1", "hello")
                await eventually(lambda: handled == ["hello"])
        finally:
            await backend.aclose()
    refused = [e for e in events if e.kind == "refused"]
    assert refused and refused[0].thread_key == "t1"
    assert refused[0].detail is not None and refused[0].detail.startswith("quarantine: retry in")
    # At most once a second per thread, however often the sender tried.
    assert len(refused) <= 4
    assert sent.outcome == "wake" and handled == ["hello"]
    assert [e.kind for e in events].index("refused") < [e.kind for e in events].index("wake")


def test_the_demo_view_shows_a_refusal() -> None:
    state = DemoState(planned=1, t0=1)
    state.apply(
        {
            "k": "event",
            "w": "w1",
            "t": 2,
            "thread": "t1",
            "ev": "refused",
            "detail": "quarantine: retry in 900 ms",
        }
    )
    assert any("refuses t1 to everyone (quarantine: retry in 900 ms)" in n for n in state.notable)
