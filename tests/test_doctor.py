"""``tenure doctor`` against real deployments, safe and unsafe: private Redis
servers configured as users misconfigure them, PostgreSQL sessions with unsafe
settings, SQLite files with loose permissions."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

import tenure
from tenure._doctor import EXIT_UNAVAILABLE, Finding, clock_finding
from tenure.backends.sqlite import _doctor as sqlite_doctor

from .support.redis_server import RedisServer
from .support.servers import drop_postgres_schema

SRC = str(Path(__file__).resolve().parent.parent / "src")


def _doctor(url: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "tenure", "doctor", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


async def _findings(url: str) -> dict[str, Finding]:
    async with tenure.from_url(url) as backend:
        found: list[Finding] = await backend.diagnose()  # type: ignore[attr-defined]
    return {f.check: f for f in found}


# -- Redis ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_safely_configured_redis_passes() -> None:
    with RedisServer(persistence=True, args=["--maxmemory-policy", "noeviction"]) as server:
        found = await _findings(f"{server.url}?quarantine=off")
        assert found["eviction"].level == "ok"
        assert found["persistence"].level == "ok"
        assert found["replication"].level == "ok"
        assert found["clock"].level == "ok"
        assert found["quarantine"].level == "warn"  # off in this URL: said, with the fix
        done = _doctor(server.url)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "verdict: ok" in done.stdout
        # New (appendfsync always, no marker): no quarantine.
        assert "quarantine   none" in done.stdout


@pytest.mark.asyncio
async def test_an_evicting_redis_without_persistence_is_unsafe() -> None:
    args = ["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]
    with RedisServer(args=args) as server:
        found = await _findings(f"{server.url}?quarantine=off")
        assert found["eviction"].level == "unsafe"
        assert "allkeys-lru" in found["eviction"].detail
        assert found["persistence"].level == "unsafe"  # and no quarantine to cover it
        done = _doctor(f"{server.url}?quarantine=off")
        assert done.returncode == 1
        assert "verdict: UNSAFE (2 unsafe" in done.stdout
        assert "fix: CONFIG SET maxmemory-policy noeviction" in done.stdout


@pytest.mark.asyncio
async def test_a_replica_is_unsafe_and_a_replicated_primary_is_a_warning() -> None:
    with RedisServer() as primary, RedisServer() as replica:
        replica.command("REPLICAOF", "127.0.0.1", primary.port)
        assert (await _findings(replica.url))["replication"].level == "unsafe"
        for _ in range(200):
            if primary.command("INFO", "replication").get("connected_slaves"):
                break
            await asyncio.sleep(0.05)
        found = await _findings(primary.url)
        assert found["replication"].level == "warn"
        assert "1 replica" in found["replication"].detail


# -- PostgreSQL ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_postgres_settings_that_lose_grants_are_found(postgres_url: str, unique: str) -> None:
    schema = f"tenure_test_{unique}"
    base = f"{postgres_url}{'&' if '?' in postgres_url else '?'}schema={schema}"
    try:
        found = await _findings(base)
        assert found["tables"].level == "warn"  # nothing created by looking
        assert found["durability"].level == "ok"
        assert found["pooling"].level == "ok"
        options = "-c synchronous_commit=off -c statement_timeout=50"
        unsafe_url = f"{base}&options={quote(options)}"
        found = await _findings(unsafe_url)
        assert found["durability"].level == "unsafe"
        assert found["statement_timeout"].level == "warn"
        done = _doctor(unsafe_url)
        assert done.returncode == 1 and "synchronous_commit off" in done.stdout
    finally:
        drop_postgres_schema(schema)


# -- SQLite --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_sqlite_permissions_and_durability(tmp_path: Path) -> None:
    file = tmp_path / "leases.db"
    found = await _findings(f"sqlite:///{file}")
    assert found["file"].level == "warn"
    assert not file.exists()  # not created by looking
    async with tenure.from_url(f"sqlite:///{file}") as backend:
        await backend.acquire_lease("k", "a", 1000)
    found = await _findings(f"sqlite:///{file}")
    assert found["durability"].level == "warn"
    assert found["permissions"].level == "ok"
    assert found["filesystem"].level == "ok"
    file.chmod(0o666)
    found = await _findings(f"sqlite:///{file}?synchronous=full")
    assert found["permissions"].level == "warn"
    assert found["durability"].level == "ok"
    missing_dir = tmp_path / "nowhere" / "leases.db"
    done = _doctor(f"sqlite:///{missing_dir}")
    assert done.returncode == 1 and "does not exist" in done.stdout
    assert "UNSAFE" in done.stdout and "create_dirs=1" in done.stdout
    assert not missing_dir.parent.exists()
    # Told to create it, the directory is expected to be missing: a warning only.
    done = _doctor(f"sqlite:///{missing_dir}?create_dirs=1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "does not exist yet (create_dirs=1)" in done.stdout
    assert not missing_dir.parent.exists()


@pytest.mark.asyncio
async def test_sqlite_wake_up_sockets_are_checked(short_tmp: Path) -> None:
    deep = short_tmp / ("d" * max(1, 110 - len(str(short_tmp))))
    for file, level in ((short_tmp / "leases.db", "ok"), (deep / "leases.db", "warn")):
        async with tenure.from_url(f"sqlite:///{file}?create_dirs=1") as backend:
            await backend.get_lease_owner("k")  # creates the file
        found = await _findings(f"sqlite:///{file}")
        assert found["wake-ups"].level == level
    assert "107 bytes" in found["wake-ups"].detail


def test_the_filesystem_is_read_from_the_mount_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sqlite_doctor.filesystem_of(str(tmp_path)) is not None
    # No network file system can be mounted here, so the verdict on one is
    # checked with the mount table's answer replaced.
    monkeypatch.setattr(sqlite_doctor, "filesystem_of", lambda path: "nfs4")
    finding = sqlite_doctor._filesystem(str(tmp_path / "leases.db"))
    assert finding.level == "unsafe" and "nfs4" in finding.detail


def test_an_unreachable_backend_exits_69() -> None:
    done = _doctor("redis://:hunter2-secret@127.0.0.1:1/0")
    assert done.returncode == EXIT_UNAVAILABLE
    assert "hunter2-secret" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("skew_s", "shown", "level"),
    [
        (-0.0004, "+0 ms", "ok"),
        (0.0004, "+0 ms", "ok"),
        (-0.012, "-12 ms", "ok"),
        (2.5, "+2500 ms", "warn"),
    ],
)
def test_a_clock_skew_reads_as_a_signed_whole_number_of_ms_never_minus_zero(
    skew_s: float, shown: str, level: str
) -> None:
    found = clock_finding(skew_s)
    assert f"is {shown} from" in found.detail and found.level == level
