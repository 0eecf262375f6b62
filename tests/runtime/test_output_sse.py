"""The SSE adapter (``tenure.runtime.sse``): events, Last-Event-ID, heartbeats, the end, a client leaving.

The adapter under uvicorn workers, with a worker killed, is in
``tests/integrations/test_replies_service.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from starlette.requests import Request

from tenure import InvalidArgument, MemoryPubSub
from tenure.runtime import ThreadRun, ThreadRuntime
from tenure.runtime.sse import last_event_id, reply_events, reply_response


async def slow_echo(run: ThreadRun) -> None:
    async for signal in run.signals():
        for word in signal.payload["words"]:
            await asyncio.sleep(signal.payload.get("pause", 0.0))
            await run.append(word)


@pytest_asyncio.fixture
async def runtime() -> AsyncIterator[ThreadRuntime]:
    async with (
        MemoryPubSub() as backend,
        ThreadRuntime(backend, slow_echo, output=True, idle_timeout=0.05) as rt,
    ):
        yield rt


def parse(chunk: str) -> dict[str, str]:
    fields = {}
    for line in chunk.strip("\n").splitlines():
        if not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value
    return fields


def request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


@pytest.mark.asyncio
async def test_events_resume_after_the_last_id_and_end_with_the_reply(
    runtime: ThreadRuntime,
) -> None:
    sent = await runtime.send_signal("t1", {"words": ["a", "b", "c"]})
    chunks = [c async for c in reply_events(runtime, sent)]
    events = [parse(c) for c in chunks]
    assert events[0]["event"] == "accepted" and events[0]["id"] == "0"
    assert [e["event"] for e in events[1:]] == ["signal_taken"] + ["token"] * 3 + [
        "signal_finished"
    ]
    words = [json.loads(e["data"])["data"] for e in events if e["event"] == "token"]
    assert words == ["a", "b", "c"]
    second_token = next(
        int(e["id"]) for e in events if json.loads(e.get("data", "{}")).get("data") == "b"
    )
    resumed = [parse(c) async for c in reply_events(runtime, sent, after=second_token)]
    assert [json.loads(e["data"]).get("data") for e in resumed if e["event"] == "token"] == ["c"]
    assert all(int(e["id"]) > second_token for e in resumed[1:])


@pytest.mark.asyncio
async def test_heartbeats_while_the_run_is_quiet(runtime: ThreadRuntime) -> None:
    sent = await runtime.send_signal("t1", {"words": ["slow"], "pause": 0.5})
    chunks = [c async for c in reply_events(runtime, sent, heartbeat=0.05)]
    assert ": heartbeat\n\n" in chunks
    assert parse(chunks[-1])["event"] == "signal_finished"


@pytest.mark.asyncio
async def test_a_client_that_leaves_stops_the_reading(runtime: ThreadRuntime) -> None:
    sent = await runtime.send_signal("t1", {"words": ["x"] * 10, "pause": 60})
    events = reply_events(runtime, sent, heartbeat=0.05)
    async for chunk in events:
        if chunk.startswith(": heartbeat"):
            break  # suspended while its read of the output waits
    assert [t for t in asyncio.all_tasks() if t.get_name() == "tenure-sse-read"]
    # What Starlette does when the client disconnects: it must not wait for the next item.
    await asyncio.wait_for(events.aclose(), 30)
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "tenure-sse-read"]


def test_last_event_id_is_read_and_checked() -> None:
    assert last_event_id(request({})) is None
    assert last_event_id(request({"Last-Event-ID": "42"})) == 42
    for bad in ("x", "-1"):
        with pytest.raises(InvalidArgument):
            last_event_id(request({"Last-Event-ID": bad}))


@pytest.mark.asyncio
async def test_the_response_is_an_event_stream(runtime: ThreadRuntime) -> None:
    sent = await runtime.send_signal("t1", {"words": ["a"]})
    response = reply_response(runtime, sent, request({"Last-Event-ID": "3"}))
    assert response.media_type == "text/event-stream"
    assert response.headers["cache-control"] == "no-cache"
    chunks = [c async for c in response.body_iterator]
    assert parse(str(chunks[0]))["id"] == "3"
