"""Real child processes for the SQLite tests, killed and reaped at teardown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

CHILD = str(Path(__file__).with_name("_child.py"))


class Child:
    """One ``_child.py`` process; its stdout is read as JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid

    async def line(self, timeout: float = 30.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
            pytest.fail(f"child {self.pid} exited ({code}) without the expected output")
        doc: dict[str, Any] = json.loads(raw)
        return doc

    async def until(self, field: str, timeout: float = 30.0) -> dict[str, Any]:
        """Read lines until one has ``field``; return it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            doc = await self.line(max(0.1, deadline - loop.time()))
            if field in doc:
                return doc

    async def rest(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Every remaining line, until the child exits; asserts it exited cleanly."""
        assert self.proc.stdout is not None
        out, _ = await asyncio.wait_for(self.proc.communicate(), timeout)
        assert self.proc.returncode == 0, self.proc.returncode
        return [json.loads(x) for x in out.decode().splitlines() if x.strip()]

    def send(self, sig: int) -> None:
        os.kill(self.pid, sig)

    async def write(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        await self.proc.stdin.drain()

    async def wait(self, timeout: float = 30.0) -> int:
        return await asyncio.wait_for(self.proc.wait(), timeout)


class Spawner:
    def __init__(self) -> None:
        self.children: list[Child] = []

    async def __call__(self, *args: str) -> Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            CHILD,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        child = Child(proc)
        self.children.append(child)
        return child

    async def cleanup(self) -> None:
        for child in self.children:
            if child.proc.returncode is None:
                try:
                    os.kill(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            await child.proc.wait()
            if child.proc.stdin is not None:
                child.proc.stdin.close()
            await child.proc.communicate()


@pytest_asyncio.fixture
async def spawn() -> AsyncIterator[Spawner]:
    spawner = Spawner()
    try:
        yield spawner
    finally:
        await spawner.cleanup()


@pytest.fixture
def db(short_tmp: Path) -> str:
    # Short: the wake-up sockets beside it must fit in 107 bytes.
    return str(short_tmp / "shared.db")
