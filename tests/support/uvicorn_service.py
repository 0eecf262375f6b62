"""An example FastAPI app run for real under uvicorn with several worker processes,
and a Server-Sent Events client for it (shared by the example services' tests)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from .redis_server import free_port

__all__ = ["EXAMPLES", "SseEvent", "UvicornService"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: One Server-Sent Event as read: (id, event, data decoded from JSON).
SseEvent = tuple[int, str, Any]


class UvicornService:
    """``uvicorn --app-dir examples APP --workers N`` in a process group of its own,
    started with ``env`` added to this process's environment; ready once
    ``/health`` answers."""

    def __init__(self, app: str, env: Mapping[str, str], *, workers: int = 3) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--app-dir",
                str(EXAMPLES),
                app,
                "--workers",
                str(workers),
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.output()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("uvicorn did not answer within 60 s")
                time.sleep(0.1)

    def output(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.read().decode(errors="replace") if self.proc.poll() else ""

    def stop(self) -> None:
        """SIGTERM the process group (SIGKILL after 20 s) and wait for it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(20)

    def close(self) -> None:
        self.stop()
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            return json.loads(r.read())

    def stream(
        self,
        path: str,
        body: Mapping[str, Any],
        last: int | None = None,
        headers_seen: dict[str, str] | None = None,
    ) -> Iterator[SseEvent]:
        """POST ``body`` to ``path``; yield each SSE event until the body ends.

        ``last`` is sent as ``Last-Event-ID``; the response's headers are put in
        ``headers_seen`` when given.
        """
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Content-Type": "application/json"}
        if last is not None:
            headers["Last-Event-ID"] = str(last)
        try:
            conn.request("POST", path, json.dumps(body), headers)
            response = conn.getresponse()
            assert response.status == 200, response.read()
            assert response.headers["content-type"].startswith("text/event-stream")
            if headers_seen is not None:
                headers_seen.update(response.headers.items())
            event: dict[str, str] = {}
            while line := response.readline():
                text_line = line.decode().rstrip("\n")
                if not text_line:
                    if "event" in event:
                        yield int(event["id"]), event["event"], json.loads(event["data"])
                    event = {}
                elif not text_line.startswith(":"):
                    name, _, value = text_line.partition(": ")
                    event[name] = value
        finally:
            conn.close()
