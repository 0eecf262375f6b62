"""Six processes write one thread's checkpoints through the fenced savers, with
tokens from a real tenure lease that they take, hand over and lose, stale
holders writing on; a seventh owner is stopped (SIGSTOP) while its lease is
taken over, then resumed. In the order the writes were committed, the token
never goes backwards, and every write of the resumed owner is refused.

The commit order: SQLite's rowid (one writer at a time, from its first write
to its commit); on PostgreSQL a deferred trigger numbering each checkpoint at
its transaction's commit.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.postgres.helpers import drop_schema, new_schema

from .langgraph_support import create_schema, open_saver, schema_url

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 6
ROUNDS = 60

AUDIT = """
CREATE TABLE commit_order (n bigserial PRIMARY KEY, token bigint NOT NULL);
CREATE FUNCTION commit_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO commit_order (token) VALUES ((NEW.metadata->>'fencing_token')::bigint);
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER commit_order AFTER INSERT ON checkpoints
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION commit_order();
"""


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(saver kind, where the checkpoints go, the lease backend's URL)."""
    if request.param == "sqlite":
        yield "sqlite-async", str(tmp_path / "checkpoints.db"), f"sqlite:///{tmp_path}/leases.db"
        return
    url: str = request.getfixturevalue("postgres_url")
    checkpoints, leases = new_schema(), new_schema()
    create_schema(url, checkpoints)
    yield "postgres-async", schema_url(url, checkpoints), f"{url}?schema={leases}"
    drop_schema(url, checkpoints)
    drop_schema(url, leases)


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integrations.langgraph_worker", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"worker exited with {proc.wait()}"
    result: dict[str, Any] = json.loads(line)
    return result


def _committed_tokens(kind: str, where: str) -> list[int]:
    if kind.startswith("sqlite"):
        with sqlite3.connect(where) as conn:
            rows = conn.execute(
                "SELECT metadata FROM checkpoints WHERE thread_id = 'thread-1' ORDER BY rowid"
            ).fetchall()
        conn.close()
        return [int(json.loads(m)["fencing_token"]) for (m,) in rows]
    with psycopg.connect(where) as pg:
        return [t for (t,) in pg.execute("SELECT token FROM commit_order ORDER BY n")]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_tokens_never_go_backwards_and_a_resumed_owner_is_refused(
    stores: tuple[str, str, str],
) -> None:
    kind, where, lease_url = stores
    async with open_saver(kind, where, fenced=True):
        pass  # the tables exist before anyone writes
    if kind.startswith("postgres"):
        with psycopg.connect(where, autocommit=True) as pg:
            pg.execute(AUDIT)

    owner = _spawn("paused", kind, where, lease_url)
    writers: list[subprocess.Popen[str]] = []
    try:
        first = await asyncio.to_thread(_line, owner)
        owner.send_signal(signal.SIGSTOP)
        writers = [
            _spawn("writer", kind, where, lease_url, f"w{i}", str(ROUNDS)) for i in range(WORKERS)
        ]
        results = [await asyncio.to_thread(_line, w) for w in writers]
        assert [w.wait(timeout=60) for w in writers] == [0] * WORKERS
        owner.send_signal(signal.SIGCONT)
        assert owner.stdin is not None
        owner.stdin.write("go\n")
        owner.stdin.flush()
        late = await asyncio.to_thread(_line, owner)
        assert owner.wait(timeout=60) == 0
    finally:
        owner.send_signal(signal.SIGCONT)
        for proc in [owner, *writers]:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()

    assert late == {"accepted": 0, "refused": 5}
    accepted = sum(r["accepted"] for r in results)
    assert sum(r["grants"] for r in results) > WORKERS  # the lease changed hands often
    assert sum(r["refused"] for r in results) > 0  # stale holders did write, and were refused
    tokens = _committed_tokens(kind, where)
    assert len(tokens) == accepted + 1
    assert tokens[0] == first["token"]
    backwards = [(a, b) for a, b in itertools.pairwise(tokens) if b < a]
    assert backwards == []
    assert tokens[-1] > first["token"]
