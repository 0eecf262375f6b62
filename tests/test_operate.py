"""Operating leases: ``scan_leases`` and ``revoke_lease`` under load and races, and
``tenure leases list|get|revoke`` run as a user runs them, on SQLite, Redis and
PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tenure
from tenure._operate import EXIT_UNAVAILABLE

SRC = str(Path(__file__).resolve().parent.parent / "src")


def _cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return _tenure("leases", *args, url=url)


def _tenure(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    env["TENURE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "tenure", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.mark.asyncio
async def test_the_cli_lists_shows_and_revokes(shared_url: str) -> None:
    async with tenure.from_url(shared_url) as backend:
        grants = {}
        for i in range(3):
            grants[f"thread/{i}"] = await backend.acquire_lease(f"thread/{i}", f"w{i}", 60_000)
        await backend.acquire_lease("invoice\0odd", "billing", 60_000)

        listed = await asyncio.to_thread(
            _cli, "list", "--prefix", "thread/", "--json", url=shared_url
        )
        assert listed.returncode == 0, listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert sorted((r["key"], r["owner"], r["token"]) for r in rows) == [
            (k, g.owner, g.token) for k, g in sorted(grants.items())
        ]
        assert all(0 < r["ttl_ms"] <= 60_000 for r in rows)

        table = await asyncio.to_thread(_cli, "list", url=shared_url)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split() == ["KEY", "OWNER", "TOKEN", "TTL"]
        assert "invoice\\x00odd" in table.stdout  # unprintable characters escaped
        assert lines[-1] == "(4 leases)"
        limited = await asyncio.to_thread(_cli, "list", "--limit", "2", url=shared_url)
        assert limited.stdout.splitlines()[-1] == "(2 leases)"

        shown = await asyncio.to_thread(_cli, "get", "thread/1", "--json", url=shared_url)
        assert shown.returncode == 0
        assert json.loads(shown.stdout)["token"] == grants["thread/1"].token
        missing = await asyncio.to_thread(_cli, "get", "thread/9", url=shared_url)
        assert missing.returncode == 1 and "no live lease" in missing.stderr

        token = grants["thread/1"].token
        assert token is not None
        stale = str(token + 100)
        refused = await asyncio.to_thread(
            _cli, "revoke", "thread/1", "--token", stale, url=shared_url
        )
        assert refused.returncode == 1 and "nothing revoked" in refused.stderr
        assert await backend.get_lease_owner("thread/1") == "w1"
        done = await asyncio.to_thread(
            _cli, "revoke", "thread/1", "--token", str(grants["thread/1"].token), url=shared_url
        )
        assert done.returncode == 0, done.stderr
        assert await backend.get_lease_owner("thread/1") is None
        assert not await backend.renew_lease("thread/1", "w1", 60_000)
        again = await asyncio.to_thread(_cli, "revoke", "thread/1", url=shared_url)
        assert again.returncode == 1


def test_every_listing_shows_nothing_as_an_empty_table(shared_url: str, unique: str) -> None:
    """A fresh install, an idle runtime, an empty namespace, ``memory://``: a
    header and a count of 0, never a traceback."""
    for url in (shared_url, "memory://"):
        threads = _tenure("threads", "--namespace", f"{unique}.none", url=url)
        assert threads.returncode == 0, threads.stderr
        assert threads.stdout.splitlines() == [
            "THREAD  OWNER  TOKEN  TTL  PENDING",
            f"(0 threads in '{unique}.none')",
        ]
        assert _tenure("threads", "--json", "--namespace", f"{unique}.none", url=url).stdout == ""
        listed = _cli("list", "--prefix", f"{unique}/", url=url)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines() == ["KEY  OWNER  TOKEN  TTL", "(0 leases)"]


def test_an_unreachable_backend_exits_69_without_its_password() -> None:
    done = _cli("list", url="redis://:hunter2-secret@127.0.0.1:1/0")
    assert done.returncode == EXIT_UNAVAILABLE
    assert "hunter2-secret" not in done.stderr + done.stdout


@pytest.mark.asyncio
async def test_revoke_racing_a_renewing_holder_ends_its_hold(backend_url: str) -> None:
    """The holder renews every 20 ms while an operator revokes: its next renewal
    fails, ``hold`` declares the lease lost, and no renewal brings it back."""
    async with contextlib.AsyncExitStack() as stack:
        holder_side = await stack.enter_async_context(tenure.from_url(backend_url))
        # Another client, as an operator's would be (memory:// lives in one object).
        operator = holder_side
        if not backend_url.startswith("memory:"):
            operator = await stack.enter_async_context(tenure.from_url(backend_url))
        for round_ in range(5):
            key = f"job-{round_}"
            async with tenure.hold(
                holder_side, key, "holder", 3000, renew_every_ms=20, cancel_on_loss=False
            ) as lease:
                await asyncio.sleep(random.uniform(0, 0.05))
                assert await operator.revoke_lease(key, token=lease.token)
                await asyncio.wait_for(lease.lost.wait(), 10)
                assert not lease.held
                assert await operator.get_lease(key) is None  # nothing renewed it back
                successor = await operator.acquire_lease(key, "next", 3000)
                assert successor.acquired and lease.token is not None
                assert successor.token is not None and successor.token > lease.token


# -- scanning many leases while they change ------------------------------------------------

TOTAL = 100_000
CHURN = 2_000  # keys re-granted to another owner during the scan
SHORT = 2_000  # keys whose leases expire during the scan


async def _bulk_grant(url: str, backend: Any, keys: list[str], owner: str, ttl_ms: int) -> None:
    """Grant ``keys`` fast: raw rows on the SQL backends (the scan reads the table),
    raw records in 100-key transactions on etcd, many concurrent acquires elsewhere."""
    scheme = url.split("://", 1)[0]
    if scheme == "sqlite":
        path = url.split("://", 1)[1].split("?", 1)[0]
        deadline = time.time() + ttl_ms / 1000

        def insert() -> None:
            conn = sqlite3.connect(path[1:] if path.startswith("//") else path)
            try:
                with conn:
                    start = conn.execute("SELECT value FROM tenure_meta WHERE name = 'token'")
                    first = start.fetchone()[0] + 1
                    conn.executemany(
                        "INSERT INTO tenure_leases (key, owner, token, deadline) VALUES (?, ?, ?, ?)",
                        [
                            (k.encode(), owner.encode(), first + i, deadline)
                            for i, k in enumerate(keys)
                        ],
                    )
                    conn.execute(
                        "UPDATE tenure_meta SET value = ? WHERE name = 'token'",
                        (first + len(keys),),
                    )
            finally:
                conn.close()

        await asyncio.to_thread(insert)
    elif scheme.startswith("postgres"):
        conninfo = url.split("?", 1)[0]
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            table = f'"{backend.schema}"."{backend.table}"'
            async with conn.cursor() as cur:
                await cur.execute(
                    f"INSERT INTO {table} (key, owner, token, deadline) "
                    "SELECT convert_to(k, 'UTF8'), convert_to(%s, 'UTF8'), 1, "
                    "clock_timestamp() + %s * interval '1 millisecond' FROM unnest(%s::text[]) AS k",
                    (owner, ttl_ms, keys),
                )
    elif scheme.startswith("etcd"):
        from aetcd import rpc

        # The records as the backend writes them (see backends/etcd/_leases.py),
        # 100 puts per transaction, attached to one of its clean-up leases.
        gc_lease = await backend._keys.gc_lease(ttl_ms)
        value = b"0:%d:" % (time.time_ns() // 1_000_000 + ttl_ms) + owner.encode()
        for start in range(0, len(keys), 100):
            puts = [
                rpc.RequestOp(
                    request_put=rpc.PutRequest(key=backend._name(k), value=value, lease=gc_lease)
                )
                for k in keys[start : start + 100]
            ]
            await backend._ch.kv.Txn(rpc.TxnRequest(success=puts), timeout=30)
    else:
        for start in range(0, len(keys), 2000):
            chunk = keys[start : start + 2000]
            results = await asyncio.gather(
                *(backend.acquire_lease(k, owner, ttl_ms) for k in chunk)
            )
            assert all(r.acquired for r in results)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_scan_of_100_000_leases_while_they_expire_and_change_hands(
    backend_url: str,
) -> None:
    async with tenure.from_url(backend_url) as backend:
        await backend.acquire_lease("warm-up", "w", 1000)  # creates the tables
        keys = [f"k/{i:06d}" for i in range(TOTAL)]
        rng = random.Random(7)
        changing = set(rng.sample(keys, CHURN + SHORT))
        churn = sorted(changing)[:CHURN]
        short = sorted(changing)[CHURN:]
        stable = [k for k in keys if k not in changing]
        await _bulk_grant(backend_url, backend, stable + churn, "first", 60_000)
        await _bulk_grant(backend_url, backend, short, "brief", 300)

        async def regrant() -> None:
            for key in churn:
                record = await backend.get_lease(key)
                if record is not None:
                    assert await backend.revoke_lease(key, record.token)
                assert (await backend.acquire_lease(key, "second", 60_000)).acquired

        listed: dict[str, list[tuple[str, int]]] = {}
        churner = asyncio.create_task(regrant())
        try:
            async for key, record in backend.scan_leases("k/"):
                listed.setdefault(key, []).append((record.owner, record.token))
                assert record.ttl_ms > 0
        finally:
            await churner
        assert all(len(v) == 1 for v in listed.values()), "a lease was listed twice"
        missing = [k for k in stable if k not in listed]
        assert not missing, missing[:5]
        owners = {"first", "second", "brief"}
        assert {owner for values in listed.values() for owner, _ in values} <= owners
        assert len(listed) <= TOTAL
        after = {k async for k, _ in backend.scan_leases("k/", limit=10)}
        assert len(after) == 10
