"""A process writing one thread's checkpoints through a fenced saver, with the
tokens of a real tenure lease (``python -m tests.integrations.langgraph_worker``).

``writer``: takes the lease whenever it can (short TTL, no renewal, so it
expires under the others), writes a few checkpoints with its token, sometimes
hands the lease to another writer, and keeps writing with its old token after
losing it, as a stale holder does. ``paused``: takes the lease, writes once,
says so, then waits for a line on stdin (the test stops it there with
SIGSTOP) and writes again with its old token. Each prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from typing import Any

import tenure
from tenure.fencing import FenceRefused

from .langgraph_support import checkpoint, config, open_saver, put

THREAD = "thread-1"
TTL_MS = 150


async def _write(saver: Any, token: int, counts: dict[str, int]) -> None:
    try:
        await put(saver, config(THREAD, token), checkpoint(token))
    except FenceRefused:
        counts["refused"] += 1
    else:
        counts["accepted"] += 1


async def writer(kind: str, where: str, lease_url: str, name: str, rounds: int) -> None:
    counts = {"accepted": 0, "refused": 0, "grants": 0, "transfers": 0, "stale_attempts": 0}
    peers = [f"w{i}" for i in range(6) if f"w{i}" != name]
    old: int | None = None
    async with (
        tenure.from_url(lease_url) as provider,
        open_saver(kind, where, fenced=True) as saver,
    ):
        for _ in range(rounds):
            grant = await provider.acquire_lease(THREAD, name, TTL_MS)
            if not grant.acquired or grant.token is None:
                if old is not None:  # a stale holder keeps writing
                    counts["stale_attempts"] += 1
                    await _write(saver, old, counts)
                await asyncio.sleep(random.uniform(0.005, 0.03))
                continue
            counts["grants"] += 1
            old = grant.token
            for _ in range(random.randint(1, 3)):
                await _write(saver, grant.token, counts)
            if random.random() < 0.3 and await provider.transfer_lease(
                THREAD, name, random.choice(peers), TTL_MS
            ):
                counts["transfers"] += 1
                counts["stale_attempts"] += 1
                await _write(saver, grant.token, counts)  # after handing it over
    print(json.dumps(counts), flush=True)


async def paused(kind: str, where: str, lease_url: str) -> None:
    async with (
        tenure.from_url(lease_url) as provider,
        open_saver(kind, where, fenced=True) as saver,
    ):
        grant = await tenure.acquire_wait(provider, THREAD, "paused", TTL_MS, timeout=30)
        assert grant.token is not None
        await put(saver, config(THREAD, grant.token), checkpoint(grant.token))
        print(json.dumps({"token": grant.token}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        counts = {"accepted": 0, "refused": 0}
        for _ in range(5):
            await _write(saver, grant.token, counts)
        print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    role, kind, where, lease_url, *rest = sys.argv[1:]
    if role == "writer":
        asyncio.run(writer(kind, where, lease_url, rest[0], int(rest[1])))
    else:
        asyncio.run(paused(kind, where, lease_url))
