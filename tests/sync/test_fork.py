"""Backends across ``fork()``, with real forks, on SQLite, Redis and PostgreSQL.

A forked child must never use (or finalise) its parent's connections, SQLite
handle or loop thread. A ``tenure.sync`` backend re-initialises in the child;
an async backend refuses with an error naming the fix. Either way the parent
carries on undisturbed.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tenure
import tenure.sync
from tests.conftest import TARGETS

from ..support.forking import in_child

KINDS = ["sqlite", "redis", "postgres"]


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    target = TARGETS[request.param]
    yield target.isolated_url(unique, tmp_path)
    if target.cleanup is not None:
        target.cleanup(unique)


def test_a_sync_backend_re_initialises_in_the_child_and_the_parent_keeps_its_own(
    url: str,
) -> None:
    with tenure.sync.from_url(url) as backend:
        assert backend.acquire_lease("parent-key", "parent", 60_000).acquired
        with tenure.sync.hold(backend, "held", "parent", 60_000) as lease:

            def child() -> dict[str, Any]:
                with tenure.sync.hold(backend, "child-held", "child", 60_000) as mine:
                    token = mine.token
                return {
                    "acquired": backend.acquire_lease("child-key", "child", 60_000).acquired,
                    "parent-key": backend.get_lease_owner("parent-key"),
                    "inherited lease held": lease.held,
                    "held by": backend.get_lease_owner("held"),
                    "own hold token": token,
                    "loop threads": [
                        t.name for t in threading.enumerate() if t.name == "tenure-sync-loop"
                    ],
                }

            seen = in_child(child)
            assert seen == {
                "result": {
                    "acquired": True,
                    "parent-key": "parent",
                    "inherited lease held": False,
                    "held by": "parent",
                    "own hold token": seen["result"]["own hold token"],
                    "loop threads": ["tenure-sync-loop"],  # its own, started in the child
                }
            }, seen
            assert isinstance(seen["result"]["own hold token"], int)
            # The parent's connections, loop thread and renewal were not disturbed.
            assert backend.get_lease_owner("child-key") == "child"
            lease.ensure_held()
            assert backend.renew_lease("parent-key", "parent", 60_000)
        assert backend.get_lease("held") is None


def test_an_async_backend_that_crossed_fork_refuses_in_the_child_naming_the_fix(
    url: str,
) -> None:
    loop = asyncio.new_event_loop()
    backend = tenure.from_url(url)
    try:
        assert loop.run_until_complete(backend.acquire_lease("key", "parent", 60_000)).acquired

        def child() -> str:
            async def use() -> None:
                await backend.acquire_lease("key", "child", 60_000)

            try:
                asyncio.run(use())
            except tenure.BackendClosed as exc:
                asyncio.run(backend.aclose())  # closing in the child touches nothing
                return str(exc)
            return "no error"

        message = in_child(child)["result"]
        assert "crossed fork()" in message and "tenure.sync.from_url()" in message, message
        assert loop.run_until_complete(backend.get_lease_owner("key")) == "parent"
        assert loop.run_until_complete(backend.renew_lease("key", "parent", 60_000))
    finally:
        loop.run_until_complete(backend.aclose())
        loop.close()


# A module-level backend, as a Celery or gunicorn app defines it before forking workers.
_shared: tenure.sync.SyncBackend | None = None


def _task(n: int) -> tuple[int, int | None]:
    assert _shared is not None
    with tenure.sync.hold(_shared, "shared-job", f"task-{n}", 30_000, wait=None) as lease:
        return os.getpid(), lease.token


def test_forked_pool_workers_share_a_module_level_sync_backend(url: str) -> None:
    global _shared
    _shared = tenure.sync.from_url(url)
    try:
        assert _shared.acquire_lease("warm", "parent", 1000).acquired  # connected before forking
        with multiprocessing.get_context("fork").Pool(2) as pool:
            results = pool.map(_task, range(12), chunksize=1)
        tokens = [token for _, token in results]
        assert all(isinstance(t, int) for t in tokens)
        assert len(set(tokens)) == 12  # a new grant, a new token, every time
        assert os.getpid() not in {pid for pid, _ in results}
        assert _shared.get_lease("shared-job") is None
    finally:
        _shared.close()
        _shared = None


def test_a_sync_runtime_refuses_to_cross_fork_and_a_backend_closed_in_the_child_stays_closed() -> (
    None
):
    async def agent(run: tenure.ThreadRun) -> None:
        async for _ in run.signals():
            pass

    with tenure.sync.from_url("memory://") as backend:
        runtime = tenure.sync.SyncThreadRuntime(backend, agent, idle_timeout=0.1)
        try:
            assert runtime.send_signal("t", {"n": 1}).outcome == "wake"

            def child() -> list[str]:
                seen = []
                try:
                    runtime.send_signal("t", {"n": 2})
                except tenure.TenureError as exc:
                    seen.append(str(exc))
                backend.close()
                try:
                    backend.get_lease_owner("k")
                except tenure.BackendClosed:
                    seen.append("closed")
                return seen

            message, closed = in_child(child)["result"]
            assert "crossed fork()" in message and "in the child" in message, message
            assert closed == "closed"
            assert runtime.send_signal("t", {"n": 3}).outcome in {"wake", "deliver"}
        finally:
            runtime.close()
