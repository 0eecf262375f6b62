"""What an operator sees of the runtime's threads: ``ThreadRuntime.threads()``,
``thread_status()`` and ``tenure threads``, on every backend that carries signals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import tenure
from tenure.runtime import ThreadRun, ThreadRuntime
from tenure.testing import eventually

SRC = str(Path(__file__).resolve().parents[2] / "src")


async def _until(check: Callable[[], Awaitable[bool]], timeout: float) -> None:
    give_up = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < give_up, "condition not met in time"
        await asyncio.sleep(0.02)


async def _idle(run: ThreadRun) -> None:
    async for _ in run.signals():
        pass


@pytest.mark.asyncio
async def test_threads_show_owner_token_and_unfinished_signals(
    backend_url: str, unique: str
) -> None:
    namespace = f"status-{unique}"
    async with tenure.from_url(backend_url) as probe:
        if tenure.Capability.EVENTS not in tenure.capabilities_of(probe):
            # A lease-only backend (etcd://) carries no signals: the runtime refuses it.
            with pytest.raises(tenure.ConfigurationError, match=r"Capability\.EVENTS"):
                ThreadRuntime(probe, _idle, namespace=namespace)
            return
    release = asyncio.Event()
    handled: list[object] = []

    async def slow(run: ThreadRun) -> None:
        async for signal in run.signals():
            await release.wait()
            handled.append(signal.payload)

    async with contextlib.AsyncExitStack() as stack:
        owner_side = await stack.enter_async_context(tenure.from_url(backend_url))
        observer_side = owner_side
        if not backend_url.startswith("memory:"):
            observer_side = await stack.enter_async_context(tenure.from_url(backend_url))
        a = await stack.enter_async_context(
            ThreadRuntime(owner_side, slow, namespace=namespace, ttl_ms=3000)
        )
        b = await stack.enter_async_context(
            ThreadRuntime(observer_side, _idle, namespace=namespace, ttl_ms=3000)
        )
        assert await b.threads() == []
        first = await a.send_signal("t1", 1)
        assert first.outcome == "wake"
        await a.send_signal("t1", 2)

        async def seen_with_work() -> bool:
            s = await a.thread_status("t1")
            return s.in_flight == 1

        await _until(seen_with_work, timeout=15)
        mine = await a.thread_status("t1")
        assert mine.local and mine.owner is not None
        assert mine.process_id == a.process_id and mine.run_id == first.run_id
        assert mine.token is not None and mine.ttl_ms is not None and 0 < mine.ttl_ms <= 3000
        assert mine.pending
        assert mine.held_ms is not None and mine.held_ms >= 0

        seen = await b.thread_status("t1")
        assert not seen.local and seen.queued is None and seen.held_ms is None
        assert (seen.owner, seen.token, seen.pending) == (mine.owner, mine.token, True)
        assert [s.thread_key for s in await b.threads()] == ["t1"]
        assert (await b.thread_status("t2")).owner is None  # an idle thread

        if not backend_url.startswith("memory:"):
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
            args = ["threads", "--url", backend_url, "--namespace", namespace, "--json"]
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "tenure", *args],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            rows = [json.loads(line) for line in done.stdout.splitlines()]
            assert [(r["thread_key"], r["owner"], r["token"]) for r in rows] == [
                ("t1", mine.owner, mine.token)
            ]

        release.set()
        await eventually(lambda: handled == [1, 2], timeout=15)

        async def all_done() -> bool:
            return await b.threads() == []

        await _until(all_done, timeout=30)  # the run ended, its lease was released
