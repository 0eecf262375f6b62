"""Flask under gunicorn ``--preload`` (3 workers of 4 threads), running ``examples/flask_counter.py``.

The backend is made and used in gunicorn's master before it forks the
workers; concurrent requests increment counters under ``tenure.sync.hold``:
every count is exact, no fenced write is rejected, and the workers' grants
have distinct tokens.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import redis

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REQUESTS = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_counts_are_exact_across_forked_workers_and_threads(redis_url: str, unique: str) -> None:
    prefix = f"tenure-test-{unique}:"
    port = free_port()
    env = {**os.environ, "TENURE_URL": redis_url, "TENURE_EXAMPLE_PREFIX": prefix}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--preload",
            "-w",
            "3",
            "-k",
            "gthread",
            "--threads",
            "4",
            "--chdir",
            str(EXAMPLES),
            "-b",
            f"127.0.0.1:{port}",
            "flask_counter:app",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    client = redis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 60
        while True:  # gunicorn is starting
            assert proc.poll() is None
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("gunicorn did not listen within 60 s")
                time.sleep(0.1)

        def post(i: int) -> dict[str, Any]:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/increment/c{i % 3}", b"", method="POST"
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(post, range(REQUESTS)))
        assert all(a["applied"] for a in answers)
        assert len({a["pid"] for a in answers}) >= 2, Counter(a["pid"] for a in answers)
        for n in range(3):
            key = f"{prefix}counter:c{n}".encode()
            assert client.hget(key, "value") == str(REQUESTS // 3).encode()
        tokens = [a["token"] for a in answers]
        assert len(set(tokens)) == REQUESTS
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(20)
        assert proc.stdout is not None
        output = proc.stdout.read().decode(errors="replace")
        proc.stdout.close()
        keys = list(client.scan_iter(match=prefix.replace(":", "\\:") + "*"))
        if keys:
            client.delete(*keys)
        client.close()
    assert "Traceback" not in output, output
