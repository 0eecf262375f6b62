"""The dashboard's parts without a server: credentials, CSRF tokens, the shared
watcher's listing and history, shared reads and the audit log."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tenure import ConfigurationError, LeaseRecord, ThreadRun, ThreadRuntime, from_url
from tenure.dashboard._audit import AuditLog
from tenure.dashboard._context import recent_output
from tenure.dashboard._security import Credentials, Csrf, is_loopback, load_credentials
from tenure.dashboard._watcher import (
    Event,
    Handover,
    LeaseFilter,
    LeaseWatcher,
    Shared,
    last_handover,
)
from tenure.runtime import Retention


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_credentials_check_bearer_and_basic() -> None:
    token = Credentials(None, "t" * 20)
    assert token.check("Bearer " + "t" * 20) == "bearer token"
    assert token.check(_basic("alice", "t" * 20)) == "alice"
    assert token.check("Bearer " + "t" * 19) is None
    assert token.check(None) is None
    assert token.check("Basic !!!") is None
    basic = Credentials("ops", "pw")
    assert basic.check(_basic("ops", "pw")) == "ops"
    assert basic.check(_basic("eve", "pw")) is None
    assert basic.check("Bearer pw") is None
    assert "pw" not in repr(basic) and "t" * 20 not in repr(token)


def test_credentials_from_a_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "auth"
    path.write_text("ops:pw with spaces\nignored\n")
    assert load_credentials(path, {}) == Credentials("ops", "pw with spaces")
    assert load_credentials(None, {"TENURE_DASHBOARD_AUTH": "x" * 16}) == Credentials(
        None, "x" * 16
    )
    assert load_credentials(None, {}) is None
    for text, message in [("", "is empty"), ("short", "too short"), (":pw", "empty user")]:
        path.write_text(text)
        with pytest.raises(ConfigurationError, match=message):
            load_credentials(path, {})
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_credentials(tmp_path / "missing", {})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("example.org", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_csrf_tokens_belong_to_one_cookie() -> None:
    csrf = Csrf()
    cookie = csrf.new_cookie()
    token = csrf.token_for(cookie)
    assert csrf.check(cookie, token)
    assert not csrf.check(csrf.new_cookie(), token)
    assert not csrf.check(None, token) and not csrf.check(cookie, None)
    assert not Csrf().check(cookie, token)  # another process's key


@pytest.mark.asyncio
async def test_the_watcher_pages_filters_and_remembers() -> None:
    async with from_url("memory://") as backend:
        for i in range(7):
            await backend.acquire_lease(f"a/{i}", "alpha" if i % 2 else "beta", 60_000)
        await backend.acquire_lease("b/0", "alpha", 60_000)
        watcher = LeaseWatcher(backend, interval=0.1)
        await watcher.look()
        rows, total = watcher.select(LeaseFilter(prefix="a/", page=2), size=3)
        assert total == 7 and [r.key for r in rows] == ["a/3", "a/4", "a/5"]
        rows, total = watcher.select(LeaseFilter(owner="alp"), size=10)
        assert total == 4 and [r.key for r in rows] == ["a/1", "a/3", "a/5", "b/0"]
        rows, total = watcher.select(LeaseFilter(state="stalled"), size=10)
        assert (rows, total) == ([], 0)
        assert watcher.select(LeaseFilter(prefix="zz"), size=10) == ([], 0)
        assert [e.kind for e in watcher.history("a/1")] == ["seen"]
        record = await backend.get_lease("a/1")
        assert record is not None
        await backend.revoke_lease("a/1", record.token)
        await backend.acquire_lease("c/0", "gamma", 60_000)
        version = watcher.version
        woken = asyncio.ensure_future(watcher.wait_change(version, 10))
        await watcher.look()
        assert await woken == version + 1
        assert [e.kind for e in watcher.history("a/1")] == ["released", "seen"]
        assert [e.kind for e in watcher.history("c/0")] == ["granted"]
        assert watcher.row("a/1") is None


def test_a_filter_is_its_query_string() -> None:
    assert LeaseFilter().query() == {}
    chosen = LeaseFilter(prefix="a/", owner="", state="stalled", page=3)
    assert chosen.query() == {"prefix": "a/", "state": "stalled", "page": "3"}
    assert chosen.query(page=1) == {"prefix": "a/", "state": "stalled"}


@pytest.mark.asyncio
async def test_a_shared_read_is_made_once_for_many_readers() -> None:
    calls = 0

    async def read() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return calls

    shared = Shared(read, max_age=60)
    assert await asyncio.gather(*(shared.get() for _ in range(10))) == [1] * 10
    assert calls == 1


def test_the_audit_log_appends_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    log.write(who="ops", action="revoke", key="k", token=7)
    log.write(who="ops", action="revoke", key="k2", token=8)
    again = AuditLog(path)
    assert [e["key"] for e in again.recent()] == ["k2", "k"]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["who"], e["key"], e["token"]) for e in lines] == [("ops", "k", 7), ("ops", "k2", 8)]
    assert AuditLog(None).lines() == ""
    with pytest.raises(ConfigurationError, match="cannot append"):
        AuditLog(tmp_path / "missing" / "audit.jsonl")


@pytest.mark.asyncio
async def test_a_revoke_made_here_leaves_the_pages_at_once() -> None:
    async with from_url("memory://") as backend:
        first = await backend.acquire_lease("k", "w", 60_000)
        assert first.token is not None
        watcher = LeaseWatcher(backend)
        await watcher.look()
        version = watcher.version
        watcher.revoked("k", first.token + 1, "revoked by ops (token 2)")  # not the lease shown
        assert watcher.row("k") is not None
        watcher.revoked("k", first.token, "revoked by ops (token 1)")
        assert watcher.row("k") is None and watcher.select(LeaseFilter(), 10) == ([], 0)
        assert watcher.version == version + 2
        assert [e.kind for e in watcher.history("k")] == ["revoked", "revoked", "seen"]


def test_the_last_handover_seen() -> None:
    def events(*kinds: tuple[float, str]) -> list[Event]:
        return [Event(at, kind, "") for at, kind in reversed(kinds)]

    assert last_handover(events((1, "seen"))) is None
    assert last_handover(events((1, "seen"), (5, "expired"), (7.5, "granted"))) == Handover(
        7.5, "granted", 2.5
    )
    assert last_handover(events((1, "seen"), (3, "transferred"), (4, "stalled"))) == Handover(
        3, "transferred", 0.0
    )
    assert last_handover(events((1, "granted"), (2, "regranted"))) == Handover(2, "regranted", None)


class _BrokenScan:
    """A user's own backend whose scan fails with an error of its driver."""

    def scan_leases(self, prefix: str = "", limit: int | None = None) -> object:
        raise RuntimeError("driver says: password=hunter2 rejected")


@pytest.mark.asyncio
async def test_a_failing_look_keeps_the_watcher_running_and_shows_no_driver_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watcher = LeaseWatcher(_BrokenScan(), interval=0.01, idle_interval=0.01)
    task = asyncio.create_task(watcher.run())
    try:
        await watcher.ready.wait()
        version = watcher.version
        assert await watcher.wait_change(version, 10) > version  # it looked again
        assert watcher.error == "a look at the leases failed (RuntimeError); see the log"
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert "a look at the leases failed" in caplog.text


class _GatedScan:
    """A user's backend over a real one whose scan stops after ``first`` leases until
    ``gate`` is set: the first look of a large key space, caught in the middle."""

    def __init__(self, inner: Any, first: int) -> None:
        self.inner = inner
        self.first = first
        self.gate = asyncio.Event()

    async def _scan(self, prefix: str) -> AsyncIterator[tuple[str, LeaseRecord]]:
        count = 0
        async for pair in self.inner.scan_leases(prefix):
            if count == self.first:
                await self.gate.wait()
            count += 1
            yield pair

    def scan_leases(
        self, prefix: str = "", limit: int | None = None
    ) -> AsyncIterator[tuple[str, LeaseRecord]]:
        return self._scan(prefix)


@pytest.mark.asyncio
async def test_a_page_is_shown_from_the_first_leases_of_the_first_look(tmp_path: Path) -> None:
    async with from_url(f"sqlite:///{tmp_path / 'leases.db'}") as backend:
        for i in range(120):
            await backend.acquire_lease(f"k/{i:03d}", f"w{i % 3}", 60_000)
        gated = _GatedScan(backend, first=60)
        watcher = LeaseWatcher(gated)
        task = asyncio.create_task(watcher.run())
        try:
            async with asyncio.timeout(30):
                read = await watcher.first_leases(50)
            assert read is not None and not watcher.ready.is_set()
            # SQLite lists by key: the first 50 read are the first page.
            rows = watcher.preview(read, LeaseFilter(), 50)
            assert [r.key for r in rows] == [f"k/{i:03d}" for i in range(50)]
            assert all(r.owner == f"w{i % 3}" and r.ttl_ms > 0 for i, r in enumerate(rows))
            assert [r.key for r in watcher.preview(read, LeaseFilter(owner="w1"), 5)] == [
                f"k/{i:03d}" for i in (1, 4, 7, 10, 13)
            ]
            version = watcher.version
            gated.gate.set()
            async with asyncio.timeout(30):
                await watcher.wait_change(version, 30)
            assert await watcher.first_leases(50) is None
            assert watcher.select(LeaseFilter(), 50)[1] == 120
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.mark.asyncio
async def test_a_threads_newest_output_also_past_its_retention(tmp_path: Path) -> None:
    async def replies(run: ThreadRun) -> None:
        async for _signal in run.signals():
            for i in range(30):
                await run.append({"i": i})

    async def nothing(run: ThreadRun) -> None:
        pass

    async with from_url(f"sqlite:///{tmp_path / 'out.db'}") as backend:
        async with ThreadRuntime(backend, replies, output=Retention(max_items=5)) as owner:
            sent = await owner.send_signal("t", "go")
            await owner.wait_reply(sent, timeout=30)
        reader = ThreadRuntime(backend, nothing, output=True)
        try:
            head = await reader.last_position("t")
            assert head > 30
            # Twenty asked, five kept: the five, without waiting for more.
            kept = await recent_output(reader, "t", 20)
            assert [i.position for i in kept] == list(range(head - 4, head + 1))
            assert [i.position for i in await recent_output(reader, "t", 2)] == [head - 1, head]
            assert await recent_output(reader, "other", 20) == []
        finally:
            await reader.aclose()
