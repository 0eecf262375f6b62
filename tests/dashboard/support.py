"""The dashboard served for real (``python -m tenure dashboard`` in a process of its
own, on a free loopback port), a lease holder in another process, and a plain
HTTP client with cookies (for the actions a test posts without a browser)."""

from __future__ import annotations

import asyncio
import http.cookiejar
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest

from tests.support.redis_server import free_port

__all__ = ["ROOT", "Client", "Dashboard", "Holder", "Runner", "csrf_of", "until"]

ROOT = Path(__file__).resolve().parents[2]
AUTH_ENV = "TENURE_DASHBOARD_AUTH"


class Dashboard:
    """``tenure dashboard --url URL`` on a free port, stopped on exit."""

    def __init__(
        self, url: str, *args: str, auth: str | None = None, interval: float = 0.2
    ) -> None:
        self.said: str | None = None
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != AUTH_ENV}
        if auth is not None:
            env[AUTH_ENV] = auth
        command = [sys.executable, "-m", "tenure", "dashboard", "--url", url]
        command += ["--port", str(self.port), "--interval", str(interval), *args]
        self.proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"the dashboard exited {self.proc.returncode}: {self.output()}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                pytest.fail(f"the dashboard did not listen within {timeout} s: {self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        """What the dashboard printed, once it has stopped."""
        if self.said is None and self.proc.poll() is not None and self.proc.stdout is not None:
            self.said = self.proc.stdout.read().decode(errors="replace")
        return "(still running)" if self.said is None else self.said

    def __enter__(self) -> Self:
        self.wait_ready()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.said = self.proc.stdout.read().decode(errors="replace")
            self.proc.stdout.close()


class Holder:
    """``tests.dashboard.holder``: holds ``key`` in a process of its own."""

    def __init__(self, url: str, key: str, owner: str, ttl_ms: int = 3000) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.dashboard.holder", url, key, owner, str(ttl_ms)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []

    async def line(self, timeout: float = 30.0) -> str:
        """The holder's next line of output."""
        assert self.proc.stdout is not None
        text = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        self.lines.append(text.strip())
        return text.strip()

    async def held(self) -> int:
        said = await self.line()
        assert said.startswith("held "), said
        return int(said.split()[1])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Runner:
    """``tests.dashboard.runner``: a runtime worker whose runs block, in a process of its own."""

    def __init__(self, url: str, thread: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.dashboard.runner", url, thread],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    async def line(self, timeout: float = 30.0) -> str:
        """The worker's next line of output."""
        assert self.proc.stdout is not None
        text = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        return text.strip()

    def send(self, payload: str) -> None:
        """Send ``payload`` as a signal to the worker's thread (from the worker)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(payload + "\n")
        self.proc.stdin.flush()

    async def run(self) -> tuple[str, int]:
        """The run id and token of the next run that has its signal."""
        said = await self.line()
        assert said.startswith("run "), said
        _, run_id, token = said.split()
        return run_id, int(token)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class Client:
    """A blocking HTTP client that keeps cookies; ``status`` and ``text`` of each answer."""

    def __init__(self, base: str, headers: dict[str, str] | None = None) -> None:
        self.base = base
        self.headers = dict(headers or {})
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def get(self, path: str) -> tuple[int, str]:
        return self._send(urllib.request.Request(self.base + path, headers=self.headers))

    def post(self, path: str, fields: Sequence[tuple[str, str]]) -> tuple[int, str]:
        body = urllib.parse.urlencode(list(fields)).encode()
        request = urllib.request.Request(
            self.base + path, data=body, headers=self.headers, method="POST"
        )
        return self._send(request)

    def _send(self, request: urllib.request.Request) -> tuple[int, str]:
        try:
            with self.opener.open(request, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()


def csrf_of(html: str) -> str:
    """The CSRF token of the form in ``html``."""
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None, html
    return found.group(1)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """``tenure.testing.eventually`` for a check that must be awaited."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        await asyncio.sleep(0.05)
