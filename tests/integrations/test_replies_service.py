"""``examples/replies_service.py`` for real: uvicorn with 3 workers on Redis, an SSE client,
and the worker that owns the thread SIGKILLed in the middle of the reply.

The client reads the reply as Server-Sent Events; when its connection breaks it
POSTs the same message again (same id) with ``Last-Event-ID``, as an
``EventSource`` would. It gets the partial reply, the cut (``run_lost``), then
the whole reply from another worker, each event once.
"""

from __future__ import annotations

import http.client
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.uvicorn_service import UvicornService

WORDS = " ".join(f"w{i}" for i in range(40))


class Service(UvicornService):
    def __init__(self, url: str) -> None:
        env = {"TENURE_URL": url, "TENURE_EXAMPLE_TTL_MS": "1500", "TENURE_EXAMPLE_DELAY": "0.05"}
        super().__init__("replies_service:app", env, workers=3)

    def post(self, thread: str, text: str, message_id: str, last: int | None) -> Iterator[Any]:
        """POST the message; yield ``(id, event, data)`` for each SSE event until the body ends."""
        body = {"text": text, "message_id": message_id}
        return self.stream(f"/threads/{thread}/messages", body, last)


@pytest.fixture
def service(isolated_redis_url: str) -> Iterator[Service]:
    service = Service(isolated_redis_url)
    try:
        yield service
    finally:
        service.close()


def test_the_reply_arrives_when_the_owning_worker_is_killed_mid_reply(service: Service) -> None:
    events: list[tuple[int, str, Any]] = []
    killed: int | None = None
    last: int | None = None
    deadline = time.monotonic() + 120
    while not any(kind == "signal_finished" for _, kind, _ in events):
        assert time.monotonic() < deadline, events
        try:
            for position, kind, data in service.post("chat-1", WORDS, "m-1", last):
                last = position
                if kind == "accepted":
                    continue
                events.append((position, kind, data))
                tokens = [d for _, k, d in events if k == "token"]
                if killed is None and len(tokens) == 3:
                    killed = tokens[0]["data"]["worker"]
                    os.kill(killed, signal.SIGKILL)
        except (OSError, http.client.HTTPException):
            time.sleep(0.1)  # the worker that served us was killed: reconnect
    positions = [p for p, _, _ in events]
    assert positions == sorted(set(positions)), positions  # each event once, in order
    kinds = [k for _, k, _ in events]
    assert "run_lost" in kinds
    cut = kinds.index("run_lost")
    assert all(d["data"]["worker"] == killed for _, k, d in events[:cut] if k == "token")
    after = [d for _, k, d in events[cut:] if k in ("token", "final")]
    assert {d["data"]["worker"] for d in after} - {killed} and killed not in {
        d["data"]["worker"] for d in after
    }
    assert after[-1]["data"]["text"] == f"you said: {WORDS}"
    assert [d["data"]["text"] for d in after[:-1]] == f"you said: {WORDS}".split()
