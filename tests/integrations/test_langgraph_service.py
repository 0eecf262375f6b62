"""``examples/langgraph_service.py`` for real: uvicorn with 3 workers, the runtime on
an isolated Redis, the checkpoints in a PostgreSQL schema of their own.

Messages of one thread are POSTed on fresh connections, so to whichever worker
the kernel hands them; every reply streams back whole, also when the worker that
took the POST is not the one running the thread, and a ``/confirm`` message's
``interrupt()`` is resumed by a POST to any worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.postgres.helpers import drop_schema, new_schema
from tests.support.uvicorn_service import SseEvent, UvicornService

from .langgraph_support import create_schema, schema_url

THREAD = "chat-1"
MESSAGES = 12
MAX_MESSAGES = 60


@pytest.fixture
def service(isolated_redis_url: str, postgres_url: str) -> Iterator[UvicornService]:
    schema = new_schema()
    create_schema(postgres_url, schema)
    env = {
        "TENURE_URL": isolated_redis_url,
        "LANGGRAPH_CHECKPOINTS": schema_url(postgres_url, schema),
        "TENURE_EXAMPLE_TTL_MS": "3000",
        "TENURE_EXAMPLE_IDLE": "10",
    }
    service = UvicornService("langgraph_service:app", env, workers=3)
    try:
        yield service
    finally:
        service.close()
        drop_schema(postgres_url, schema)


def post(service: UvicornService, path: str, body: dict[str, Any]) -> tuple[str, list[SseEvent]]:
    """The worker that took the POST, and the reply's events."""
    headers: dict[str, str] = {}
    events = list(service.stream(path, body, headers_seen=headers))
    return headers["x-worker"], events


def ran_by(events: list[SseEvent]) -> set[str]:
    """The workers that ran the graph for the reply (its model step says so)."""
    return {item["data"]["worker"] for _, kind, item in events if kind == "custom"}


def answer(events: list[SseEvent]) -> str:
    return "".join(item["data"]["content"] for _, kind, item in events if kind == "messages")


@pytest.mark.slow
def test_replies_arrive_whichever_worker_takes_the_message(service: UvicornService) -> None:
    receivers: set[str] = set()
    crossed = 0
    sent = 0
    while sent < MESSAGES or not (crossed and len(receivers) > 1):
        # The kernel hands connections to workers unevenly: post until both were seen.
        assert sent < MAX_MESSAGES, receivers
        n, sent = sent, sent + 1
        body = {"text": f"message {n}", "message_id": f"m-{n}"}
        receiver, events = post(service, f"/threads/{THREAD}/messages", body)
        assert events[-1][1] == "signal_finished", events
        assert answer(events) == f"you said: message {n}"
        runners = ran_by(events)
        assert len(runners) == 1  # one worker runs the thread
        receivers.add(receiver)
        crossed += receiver not in runners

    receiver, events = post(service, f"/threads/{THREAD}/messages", {"text": "/confirm pay"})
    (question,) = [item["data"] for _, kind, item in events if kind == "interrupt"]
    assert question[0]["value"] == {"question": "go ahead?"}
    _, events = post(service, f"/threads/{THREAD}/resume", {"value": "yes"})
    # The step's message whole, then the model's answer token by token.
    assert answer(events) == "confirmed: yes" + "you said: confirmed: yes"

    thread = service.get(f"/threads/{THREAD}")["messages"]
    expected = []
    for n in range(sent):
        expected += [("human", f"message {n}"), ("ai", f"you said: message {n}")]
    expected += [
        ("human", "/confirm pay"),
        ("ai", "confirmed: yes"),
        ("ai", "you said: confirmed: yes"),
    ]
    assert [(m["type"], m["content"]) for m in thread] == expected
