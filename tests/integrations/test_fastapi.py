"""FastAPI under uvicorn with 3 worker processes, running ``examples/fastapi_threads.py`` for real.

Concurrent webhook POSTs for several conversation threads hit whichever worker
uvicorn picks; one worker is SIGKILLed while it runs a thread. Every message is
handled (none lost), per thread by one run at a time, in send order, with
fencing tokens increasing from run to run.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.example_process import ExampleProcess
from tests.support.uvicorn_service import UvicornService

THREADS = [("C1", "1700000000.000100"), ("C1", "1700000000.000200"), ("C2", "1.5"), ("C3", "9")]
MESSAGES = 12


class Server(ExampleProcess):
    def __init__(self, redis_url: str, prefix: str) -> None:
        super().__init__(redis_url, prefix)
        env = {
            "TENURE_URL": redis_url,
            "TENURE_EXAMPLE_LOG_URL": redis_url,
            "TENURE_EXAMPLE_PREFIX": prefix,
            "TENURE_EXAMPLE_TTL_MS": "2000",
            "TENURE_EXAMPLE_WORK": "0.05",
        }
        self.service = UvicornService("fastapi_threads:app", env, workers=3)
        self.proc = self.service.proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.service.port}"

    def post(self, channel: str, thread_ts: str, text: str, msg_id: str) -> dict[str, str]:
        """POST one message event, retrying (same id) as the platform does until it is taken."""
        body = json.dumps(
            {
                "event": {
                    "type": "message",
                    "channel": channel,
                    "thread_ts": thread_ts,
                    "text": text,
                    "client_msg_id": msg_id,
                }
            }
        ).encode()
        deadline = time.monotonic() + 60
        while True:
            request = urllib.request.Request(
                f"{self.url}/events", body, {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    answer: dict[str, str] = json.loads(response.read())
                    return answer
            # A killed worker: a refused or reset connection, or an answer cut off
            # after its headers (IncompleteRead, an HTTPException but no OSError).
            except (OSError, http.client.HTTPException):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        self.service.stop()

    def close(self) -> None:
        self.service.close()
        keys = list(self.redis.scan_iter(match=self.prefix.replace(":", "\\:") + "*"))
        if keys:
            self.redis.delete(*keys)
        self.redis.close()


@pytest.fixture
def server(redis_url: str, unique: str) -> Iterator[Server]:
    server = Server(redis_url, f"tenure-test-{unique}:")
    try:
        yield server
    finally:
        server.close()


def test_every_message_is_handled_once_at_a_time_in_order_with_a_worker_killed(
    server: Server,
) -> None:
    def send_thread(thread: tuple[str, str]) -> list[str]:
        channel, ts = thread
        return [
            server.post(channel, ts, f"{i}", f"{channel}-{ts}-{i}")["outcome"]
            for i in range(MESSAGES)
        ]

    with ThreadPoolExecutor(len(THREADS)) as pool:
        sending = [pool.submit(send_thread, thread) for thread in THREADS]
        # Kill a worker in the middle of a run: one that started a run not ended yet.
        server.wait_for(lambda log: sum(e["step"] == "handled" for e in log) >= 8)
        log = server.log()
        ended = {e["run"] for e in log if e["step"] == "run-end"}
        running = [e for e in log if e["step"] == "run-start" and e["run"] not in ended]
        assert running, log
        killed = running[0]["pid"]
        os.kill(killed, signal.SIGKILL)
        outcomes = [f.result() for f in sending]
    assert all(set(o) <= {"wake", "deliver"} for o in outcomes)

    expected = {f"{c}/{ts}": [f"{c}-{ts}-{i}" for i in range(MESSAGES)] for c, ts in THREADS}

    def all_handled(log: list[dict[str, Any]]) -> bool:
        done = {e["id"] for e in log if e["step"] == "handled"}
        return all(set(ids) <= done for ids in expected.values())

    server.wait_for(all_handled)
    log = server.log()
    assert any(e["pid"] == killed for e in log if e["step"] == "handled")
    for thread, ids in expected.items():
        events = [e for e in log if e["thread"] == thread]
        # One run at a time: the events of each run form one block.
        runs = [
            e["run"] for i, e in enumerate(events) if i == 0 or events[i - 1]["run"] != e["run"]
        ]
        assert len(runs) == len(set(runs)), events
        tokens = [e["token"] for e in events]
        assert tokens == sorted(tokens) and len(set(tokens)) == len(runs), events
        # In order: first handlings follow send order; each run reads in order.
        handled = [e["id"] for e in events if e["step"] == "handled"]
        assert list(dict.fromkeys(handled)) == ids, handled
        for run in runs:
            mine = [ids.index(e["id"]) for e in events if e["run"] == run and "id" in e]
            assert mine == sorted(mine), (run, mine)
