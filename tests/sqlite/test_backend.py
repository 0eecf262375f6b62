"""SQLite backend specifics on real files: URLs, the default file, pruning, batches, errors."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

import pytest

from tenure import BackendClosed, BackendUnavailable, ConfigurationError, Event, from_url
from tenure.backends.sqlite import SqlitePubSub
from tenure.testing import ManualClock, eventually

from ..support.waiting import asleep, until_parked


def count(db: Path | str, table: str) -> int:
    conn = sqlite3.connect(db)
    try:
        value: int = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        return value
    finally:
        conn.close()


def sqlite_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tenure-sqlite")]


# -- URLs and the default file ---------------------------------------------------------


@pytest.mark.asyncio
async def test_three_slashes_is_relative_four_is_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    relative = from_url("sqlite:///rel/dir/a.db?create_dirs=1")
    absolute = from_url(f"sqlite:///{tmp_path / 'abs' / 'b.db'}?create_dirs=1")
    four = from_url(f"sqlite:////{str(tmp_path).lstrip('/')}/c.db")
    assert isinstance(relative, SqlitePubSub) and isinstance(absolute, SqlitePubSub)
    assert isinstance(four, SqlitePubSub)
    assert relative.path == "rel/dir/a.db"
    assert absolute.path == str(tmp_path / "abs" / "b.db")
    assert four.path == str(tmp_path / "c.db")
    for backend in (relative, absolute):
        async with backend:
            assert (await backend.acquire_lease("k", "o", 1000)).acquired
    assert (tmp_path / "rel" / "dir" / "a.db").is_file()
    assert (tmp_path / "abs" / "b.db").is_file()


def test_query_parameters_and_keywords_set_options(tmp_path: Path) -> None:
    backend = from_url(
        f"sqlite:///{tmp_path}/x.db?busy_timeout_ms=250&visibility_timeout=2.5&synchronous=FULL",
        max_attempts=3,
    )
    assert isinstance(backend, SqlitePubSub)
    assert backend._opts.busy_timeout_ms == 250
    assert backend._opts.visibility_timeout == 2.5
    assert backend._opts.synchronous == "full"
    assert backend._opts.max_attempts == 3


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("sqlite:///x.db?colour=blue", {}, "unknown sqlite option 'colour'"),
        ("sqlite:///x.db", {"colour": "blue"}, "unknown sqlite option(s) colour"),
        ("sqlite:///x.db?max_attempts=0", {}, "max_attempts must be an int >= 1"),
        ("sqlite:///x.db?busy_timeout_ms=soon", {}, "busy_timeout_ms must be"),
        ("sqlite:///x.db?visibility_timeout=-1", {}, "visibility_timeout must be"),
        ("sqlite:///x.db?poll_interval=inf", {}, "poll_interval must be"),
        ("sqlite:///x.db?synchronous=off", {}, "synchronous must be"),
        ("sqlite:///x.db?max_attempts=2&max_attempts=3", {}, "given twice"),
        ("sqlite:///x.db?max_attempts=2", {"max_attempts": 3}, "in the URL and as a keyword"),
        ("sqlite:///x.db", {"max_attempts": True}, "max_attempts must be"),
        ("sqlite://host/x.db", {}, "take no host"),
        ("sqlite://", {}, "names no database file"),
        ("sqlite:///", {}, "names no database file"),
        ("sqlite:///:memory:", {}, "use memory://"),
    ],
)
def test_bad_configuration_is_rejected(url: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        from_url(url, **options)
    assert message in str(info.value)


@pytest.mark.asyncio
async def test_default_url_is_a_file_in_the_data_directory_created_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TENURE_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    backend = from_url()
    assert isinstance(backend, SqlitePubSub)
    expected = tmp_path / "xdg" / "tenure" / "tenure.db"
    assert backend.path == str(expected)
    assert not expected.parent.exists()  # nothing happens until first use
    async with backend:
        assert (await backend.acquire_lease("k", "o", 1000)).acquired
    assert expected.is_file()


@pytest.mark.asyncio
async def test_tenure_url_overrides_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "from-env" / "nested" / "t.db"
    monkeypatch.setenv("TENURE_URL", f"sqlite:///{target}?create_dirs=1")
    async with from_url() as backend:
        assert isinstance(backend, SqlitePubSub)
        assert backend.path == str(target)
        await backend.publish("t", Event(type="x"))
    assert target.is_file()


# -- leases -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_batch_renew_in_one_transaction(tmp_path: Path) -> None:
    clock = ManualClock()
    async with SqlitePubSub(tmp_path / "b.db", clock=clock) as backend:
        keys = [f"k{i}\0x" for i in range(2000)]
        for key in keys[:1500]:
            assert (await backend.acquire_lease(key, "me", 1000)).acquired
        for key in keys[1500:1700]:
            assert (await backend.acquire_lease(key, "other", 1000)).acquired
        clock.advance_ms(900)
        result = await backend.renew_leases([*keys, keys[0]], "me", 1000)
        assert result == [True] * 1500 + [False] * 500 + [True]
        clock.advance_ms(900)  # past the first deadline: only the renewed ones live
        assert await backend.get_lease_owner(keys[0]) == "me"
        assert await backend.get_lease_owner(keys[1499]) == "me"
        assert await backend.get_lease_owner(keys[1500]) is None
        assert await backend.renew_leases([], "me", 1000) == []


@pytest.mark.asyncio
async def test_renew_owned_over_more_pairs_than_one_statement_takes(tmp_path: Path) -> None:
    clock = ManualClock()
    async with SqlitePubSub(tmp_path / "b.db", clock=clock) as backend:
        held = [(f"k{i}", "me" if i % 3 else "other") for i in range(700)]
        for key, owner in held:
            assert (await backend.acquire_lease(key, owner, 1000)).acquired
        clock.advance_ms(900)
        asked = [(key, "me") for key, _ in held]
        assert await backend.renew_owned(asked, 1000) == [owner == "me" for _, owner in held]
        clock.advance_ms(900)  # past the first deadline: only the renewed ones live
        assert await backend.get_lease_owner("k699") is None
        assert await backend.get_lease_owner("k698") == "me"


@pytest.mark.asyncio
async def test_tokens_survive_the_clean_up_of_expired_rows(tmp_path: Path) -> None:
    clock = ManualClock()
    db = tmp_path / "t.db"
    async with SqlitePubSub(db, clock=clock) as backend:
        first = await backend.acquire_lease("k", "a", 100)
        clock.advance_ms(120_000)  # past the sweep interval: the next acquire deletes expired rows
        other = await backend.acquire_lease("other", "b", 100)
        assert count(db, "tenure_leases") == 1
        second = await backend.acquire_lease("k", "c", 100)
        assert first.token is not None and other.token is not None and second.token is not None
        assert first.token < other.token < second.token
    async with SqlitePubSub(db, clock=clock) as reopened:  # and across reopening the file
        clock.advance_ms(1000)
        third = await reopened.acquire_lease("k", "d", 100)
        assert third.token is not None and third.token > second.token


@pytest.mark.asyncio
async def test_local_release_wakes_one_waiter_per_release(tmp_path: Path) -> None:
    async with SqlitePubSub(tmp_path / "w.db") as backend:
        await backend.acquire_lease("k", "a", 60_000)
        waiters = [asyncio.create_task(backend.wait_lease_released("k", 30)) for _ in range(2)]
        await until_parked(backend, "k", 2)
        await backend.release_lease("k", "a")
        await eventually(lambda: sum(w.done() for w in waiters) == 1)
        assert asleep(backend) == 1  # the other was not woken
        assert sum(w.done() for w in waiters) == 1
        await backend.acquire_lease("k", "b", 60_000)
        assert await backend.transfer_lease("k", "b", "c", 60_000)
        assert all(await asyncio.gather(*waiters))
        assert await backend.wait_lease_released("free-key", 0) is True


@pytest.mark.asyncio
async def test_a_file_that_is_not_a_database_gives_backend_unavailable(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"this is not a database" * 100)
    async with SqlitePubSub(bad) as backend:
        with pytest.raises(BackendUnavailable) as info:
            await backend.acquire_lease("k", "o", 1000)
        assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
        assert str(bad) in str(info.value)


@pytest.mark.asyncio
async def test_aclose_stops_everything(tmp_path: Path) -> None:
    before = len(sqlite_threads())
    backend = SqlitePubSub(tmp_path / "c.db")

    async def callback(event: Event) -> None:
        pass

    await backend.subscribe("t", callback)
    await backend.subscribe("t", lambda e: asyncio.sleep(0), group="g")
    waiter = asyncio.create_task(backend.wait_lease_released("held", 30))
    await backend.acquire_lease("held", "x", 60_000)
    assert len(sqlite_threads()) == before + 1
    await backend.aclose()
    assert await asyncio.wait_for(waiter, 5) is True  # woken, not left hanging
    assert len(sqlite_threads()) == before
    for call in (
        backend.acquire_lease("k", "o", 1000),
        backend.publish("t", Event(type="x")),
        backend.subscribe("t", callback),
        backend.flush(),
        backend.renew_leases(["k"], "o", 1000),
    ):
        with pytest.raises(BackendClosed):
            await call
    await backend.aclose()  # idempotent
    assert count(tmp_path / "c.db", "tenure_groups") == 1  # the named group is durable


# -- pub/sub --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_acknowledged_events_are_pruned(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    got: list[int] = []

    async def callback(event: Event) -> None:
        got.append(event.data)

    async with SqlitePubSub(db, prune_interval=0.2) as backend:
        await backend.publish("nobody-listens", Event(type="x"))
        assert count(db, "tenure_events") == 0  # no group: nothing is stored
        await backend.subscribe("t", callback, group="g")
        await backend.subscribe("t", lambda e: asyncio.sleep(0))
        for i in range(300):
            await backend.publish("t", Event(type="x", data=i))
        await backend.flush()
        assert sorted(got) == list(range(300))
        await eventually(lambda: count(db, "tenure_events") == 0, timeout=20)
        assert count(db, "tenure_pending") == 0


@pytest.mark.asyncio
async def test_unacknowledged_events_are_kept_until_a_member_handles_them(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    got: list[int] = []

    async def callback(event: Event) -> None:
        got.append(event.data)

    async with SqlitePubSub(db, prune_interval=0.1) as backend:
        await backend.subscribe("t", callback, group="g")
        await backend.unsubscribe("t", callback)  # the group stays, with no member
        for i in range(5):
            await backend.publish("t", Event(type="x", data=i))
        await asyncio.sleep(0.5)
        await backend.publish("t", Event(type="x", data=5))  # publishing prunes when due
        assert count(db, "tenure_events") == 6
        await backend.subscribe("t", callback, group="g")
        await backend.flush()
        assert got == [0, 1, 2, 3, 4, 5]


@pytest.mark.asyncio
async def test_retention_counts_from_when_an_event_was_stored(tmp_path: Path) -> None:
    # An unread event stored longer than retention ago goes; one published with an
    # old created_at (a replay) stays until it has been kept that long here.
    db = tmp_path / "r.db"
    got: list[int] = []

    async def callback(event: Event) -> None:
        got.append(event.data)

    async with SqlitePubSub(db, prune_interval=0.05, retention=1, dedupe_window=1) as backend:
        await backend.subscribe("t", callback, group="g")
        await backend.unsubscribe("t", callback)  # the group stays, with no member
        await backend.publish("t", Event(type="x", data=0))
        await backend.publish("t", Event(type="x", data=1, created_at=0.0))
        assert count(db, "tenure_events") == 2

        async def pruned() -> bool:
            await backend.publish("other", Event(type="x"))  # publishing prunes when due
            return count(db, "tenure_events") == 0

        for _ in range(200):
            if await pruned():
                break
            await asyncio.sleep(0.05)
        assert count(db, "tenure_events") == 0
        await backend.publish("t", Event(type="x", data=2, created_at=0.0))
        await backend.subscribe("t", callback, group="g")
        await backend.flush()
        assert got == [2]


@pytest.mark.asyncio
async def test_an_event_that_always_fails_is_dropped_after_max_attempts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "m.db"
    attempts: list[int] = []

    async def always_fails(event: Event) -> None:
        attempts.append(event.attempt)
        raise RuntimeError("permanent failure (expected by the test)")

    caplog.set_level(logging.ERROR, logger="tenure.sqlite")
    async with SqlitePubSub(db, max_attempts=3) as backend:
        await backend.subscribe("t", always_fails, group="g")
        await backend.publish("t", Event(type="x"))
        await backend.flush()
        assert attempts == [1, 2, 3]
        await eventually(lambda: count(db, "tenure_pending") == 0)
        assert any("dropping it" in r.getMessage() for r in caplog.records)
        await backend.unsubscribe("t", always_fails)


@pytest.mark.asyncio
async def test_an_unclosed_backend_warns_when_collected_and_its_thread_stops(
    tmp_path: Path,
) -> None:
    before = set(sqlite_threads())
    holder = [SqlitePubSub(tmp_path / "u.db")]
    await holder[0].acquire_lease("k", "o", 1000)
    (thread,) = set(sqlite_threads()) - before

    def forget() -> None:
        holder.clear()
        gc.collect()  # the thread holds no strong reference to the backend

    with pytest.warns(ResourceWarning, match="unclosed SqlitePubSub"):
        forget()
    thread.join(timeout=10)
    assert not thread.is_alive()


@pytest.mark.asyncio
async def test_a_fetch_writes_the_queued_acknowledgements_in_its_own_transaction(
    tmp_path: Path,
) -> None:
    # One write-lock turn per fetch instead of two: the acknowledgements queued
    # when a fetch takes new events are written by the fetch's transaction.
    db = tmp_path / "acks.db"
    backend = SqlitePubSub(db)
    log = backend._log
    watcher = sqlite3.connect(db)
    try:
        gid, _ = await backend._run(log.join, b"t", b"g")
        await backend.publish("t", Event("x", 1))
        fetched = await backend._run(log.fetch, gid, b"t", ([], []), deque())
        assert fetched is not None
        first = fetched[0]
        assert [(attempt, body.count('"data":1')) for _, attempt, body in first] == [(1, 1)]
        await backend.publish("t", Event("x", 2))
        acks: deque[tuple[int, int, int, bool]] = deque([(gid, first[0][0], 1, False)])
        commits = watcher.execute("PRAGMA data_version").fetchone()[0]
        fetched = await backend._run(log.fetch, gid, b"t", ([], []), acks)
        assert fetched is not None
        second = fetched[0]
        assert not acks
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == commits + 1
        pending = watcher.execute("SELECT event_id FROM tenure_pending").fetchall()
        assert pending == [(second[0][0],)]  # the first one's claim is gone, the second is held
    finally:
        watcher.close()
        await backend.aclose()


@pytest.mark.asyncio
async def test_an_acquire_of_a_key_seen_held_is_refused_by_a_read_without_the_write_lock(
    tmp_path: Path,
) -> None:
    """Once an acquire here found a key held by another owner, the next ones are
    refused by a read while that lease lasts: the answer comes while another
    connection holds the file's write lock (WAL readers are not blocked). A
    write transaction would wait for that lock and fail after busy_timeout_ms,
    as a grant still does, and as the first try of a key does."""
    db = tmp_path / "t.db"
    async with SqlitePubSub(str(db), busy_timeout_ms=300) as backend:
        assert (await backend.acquire_lease("k", "alice", 60_000)).acquired
        assert not (await backend.acquire_lease("k", "bob", 60_000)).acquired  # seen held
        locker = sqlite3.connect(db, isolation_level=None)
        try:
            locker.execute("BEGIN IMMEDIATE")
            refused = await asyncio.wait_for(backend.acquire_lease("k", "bob", 60_000), 30)
            assert (refused.acquired, refused.owner, refused.token) == (False, "alice", None)
            with pytest.raises(BackendUnavailable, match="locked"):
                await asyncio.wait_for(backend.acquire_lease("k2", "bob", 60_000), 30)
            with pytest.raises(BackendUnavailable, match="locked"):  # the holder extends: a write
                await asyncio.wait_for(backend.acquire_lease("k", "alice", 60_000), 30)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert (await backend.acquire_lease("k2", "bob", 60_000)).acquired
        assert await backend.get_lease_owner("k") == "alice"
        await backend.release_lease("k", "alice")
        assert (await backend.acquire_lease("k", "bob", 60_000)).acquired  # free: the read sees it


# -- a typo in the path ---------------------------------------------------------------


def test_a_file_in_a_missing_directory_is_refused_unless_create_dirs(tmp_path: Path) -> None:
    """A typo in a path used to give a new, private database (and its leases)."""
    typo = tmp_path / "jobs" / "tneure.db"
    for build in (
        lambda: from_url(f"sqlite:///{typo}"),
        lambda: from_url(f"sqlite:///{typo}?create_dirs=0"),
        lambda: SqlitePubSub(typo),
    ):
        with pytest.raises(ConfigurationError, match="does not exist") as caught:
            build()
        assert "create_dirs=1" in str(caught.value) and str(typo.parent) in str(caught.value)
    in_a_file = tmp_path / "a-file"
    in_a_file.write_text("")
    with pytest.raises(ConfigurationError, match="is not a directory"):
        from_url(f"sqlite:///{in_a_file}/x.db")
    with pytest.raises(ConfigurationError, match="create_dirs must be true or false"):
        from_url(f"sqlite:///{typo}?create_dirs=maybe")
    assert not typo.parent.exists()


@pytest.mark.asyncio
async def test_create_dirs_creates_the_directory_at_first_use(tmp_path: Path) -> None:
    by_url, by_keyword = tmp_path / "u" / "deeper" / "a.db", tmp_path / "k" / "deeper" / "b.db"
    for file, backend in (
        (by_url, from_url(f"sqlite:///{by_url}?create_dirs=1")),
        (by_keyword, SqlitePubSub(by_keyword, create_dirs=True)),
    ):
        assert not file.parent.exists()  # nothing before first use
        async with backend:
            assert (await backend.acquire_lease("k", "o", 1000)).acquired
        assert file.is_file()


@pytest.mark.asyncio
async def test_a_directory_removed_after_construction_is_refused_at_first_use(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "gone"
    folder.mkdir()
    backend = from_url(f"sqlite:///{folder / 'leases.db'}")
    folder.rmdir()
    async with backend:
        with pytest.raises(ConfigurationError, match="does not exist"):
            await backend.acquire_lease("k", "o", 1000)
    assert not folder.exists()


def test_the_cli_refuses_a_missing_directory_too(tmp_path: Path) -> None:
    typo = tmp_path / "jobs" / "tneure.db"
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "tenure", "run", "--url", f"sqlite:///{typo}", "job", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode != 0
    assert "does not exist" in done.stderr and "create_dirs=1" in done.stderr, done.stderr
    assert not typo.parent.exists()
