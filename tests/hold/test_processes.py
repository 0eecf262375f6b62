"""Holders in real OS processes: a paused holder is fenced off; waiters wake across processes.

The holder runs in a child Python process that the test stops with SIGSTOP,
resumes with SIGCONT, or kills with SIGKILL. Memory is not here: it cannot be
shared between processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import tenure
from tenure.fencing import PostgresFencedStore

from ..conftest import POSTGRES_URL, TARGETS, drop_postgres_schema, isolated_url

KINDS = ["sqlite", "redis", "postgres"]
SRC = str(Path(tenure.__file__).resolve().parent.parent)

# The paused owner: holds the lease, writes through the fenced store, reports
# what it sees after the test resumed it.
PAUSED_OWNER = """
import asyncio, json, sys
import tenure
from tenure.fencing import PostgresFencedStore

async def main(url, key, ttl, store_url, schema):
    async with tenure.from_url(url) as backend, PostgresFencedStore(store_url, schema=schema) as store:
        async with tenure.hold(backend, key, "paused-owner", ttl, cancel_on_loss=False) as lease:
            assert await store.write(key, lease.token, "first")
            print(json.dumps({"token": lease.token}), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            held = lease.held
            await asyncio.wait_for(lease.lost.wait(), 10)
            renewed = await backend.renew_lease(key, "paused-owner", ttl)
            wrote = await store.write(key, lease.token, "late")
            print(json.dumps({"held": held, "reason": lease.lost_reason,
                              "renewed": renewed, "wrote": wrote}), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]))
"""

# A holder that releases when told to (or is killed before).
HOLDER = """
import asyncio, json, sys
import tenure

async def main(url, key, ttl):
    async with tenure.from_url(url) as backend:
        async with tenure.hold(backend, key, "child", ttl) as lease:
            print(json.dumps({"token": lease.token}), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        print(json.dumps({"released": True}), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    yield isolated_url(request.param, unique=unique, tmp_path=tmp_path)
    cleanup = TARGETS[request.param].cleanup
    if cleanup is not None:
        cleanup(unique)  # the Redis keys too, not only the schema


@pytest.fixture
def fence_schema(unique: str, postgres_url: str) -> Iterator[str]:
    schema = f"tenure_fence_{unique}"
    yield schema
    drop_postgres_schema(schema)


@pytest_asyncio.fixture
async def spawn() -> AsyncIterator[Any]:
    """Start child processes; kill any still running at the end of the test."""
    procs: list[asyncio.subprocess.Process] = []

    async def start(script: str, *args: str) -> asyncio.subprocess.Process:
        env = {**os.environ, "PYTHONPATH": SRC}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            script,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.returncode is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        await proc.wait()


async def _line(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    raw = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert raw, f"child exited early with {await proc.wait()}"
    doc: dict[str, Any] = json.loads(raw)
    return doc


async def _tell(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()


@pytest.mark.asyncio
async def test_a_paused_holder_loses_its_lease_and_its_late_write_is_rejected(
    url: str, fence_schema: str, spawn: Any
) -> None:
    ttl = 1000
    child = await spawn(PAUSED_OWNER, url, "job", str(ttl), POSTGRES_URL, fence_schema)
    first = await _line(child)
    child.send_signal(signal.SIGSTOP)  # its renewals stop: a GC pause, a frozen VM
    async with (
        tenure.from_url(url) as backend,
        PostgresFencedStore(POSTGRES_URL, schema=fence_schema) as store,
    ):
        # The successor gets the key only once the paused owner's TTL ran out.
        successor = await tenure.acquire_wait(backend, "job", "successor", 60_000, timeout=20)
        assert successor.token is not None and successor.token > first["token"]
        assert await store.write("job", successor.token, "successor's")
        child.send_signal(signal.SIGCONT)
        await _tell(child)
        seen = await _line(child)
        assert seen["held"] is False  # it knew at once on waking, before any renewal
        assert "renew deadline" in seen["reason"]
        assert seen["renewed"] is False  # its late renew fails
        assert seen["wrote"] is False  # the fenced store rejects its late write
        assert await child.wait() == 0
        stored = await store.read("job")
        assert stored is not None and (stored.token, stored.value) == (
            successor.token,
            "successor's",
        )
        record = await backend.get_lease("job")
        assert record is not None and record.owner == "successor"  # its exit released nothing
        await backend.release_lease("job", "successor")


@pytest.mark.asyncio
async def test_a_release_in_another_process_wakes_the_waiter(url: str, spawn: Any) -> None:
    child = await spawn(HOLDER, url, "job", "60000")
    held = await _line(child)
    async with tenure.from_url(url) as backend:
        waiter = asyncio.create_task(
            tenure.acquire_wait(backend, "job", "waiter", 60_000, timeout=30)
        )
        await asyncio.sleep(0.5)
        assert not waiter.done()
        await _tell(child)
        # The child's lease had 60 s left and the wait is 30 s: only a wake-up grants it.
        result = await waiter
        assert result.owner == "waiter" and result.token is not None
        assert result.token > held["token"]
        assert await _line(child) == {"released": True}
        await backend.release_lease("job", "waiter")
    assert await child.wait() == 0


@pytest.mark.asyncio
async def test_a_killed_holder_is_replaced_when_its_ttl_ends(url: str, spawn: Any) -> None:
    child = await spawn(HOLDER, url, "job", "1500")
    held = await _line(child)
    child.kill()  # no release: only expiry frees the key
    await child.wait()
    async with tenure.from_url(url) as backend:
        assert await backend.get_lease_owner("job") == "child"
        result = await tenure.acquire_wait(backend, "job", "waiter", 60_000, timeout=30)
        assert result.owner == "waiter" and result.token is not None
        assert result.token > held["token"]
        await backend.release_lease("job", "waiter")
