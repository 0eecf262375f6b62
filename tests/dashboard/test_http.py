"""The dashboard over plain HTTP: who may act, what it refuses, what it never
shows, and its listing on every backend (served for real, in its own process)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tenure import from_url
from tenure.runtime._names import ThreadNames
from tests.conftest import TARGETS
from tests.support.redis_server import RedisServer

from .support import ROOT, Client, Dashboard, csrf_of, until

TOKEN = "s3cret-bearer-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def _revoke_fields(html: str, key: str, token: int) -> list[tuple[str, str]]:
    return [("csrf", csrf_of(html)), ("k", key), ("token", str(token)), ("owner", "w")]


@pytest.mark.asyncio
async def test_an_action_needs_authentication_and_the_csrf_token(sqlite_url: str) -> None:
    async with from_url(sqlite_url) as backend:
        token = (await backend.acquire_lease("k", "w", 60_000)).token
        assert token is not None
        with Dashboard(sqlite_url, auth=TOKEN) as dashboard:
            operator = Client(dashboard.base, BEARER)
            status, confirm = await asyncio.to_thread(operator.get, f"/revoke?k=k&token={token}")
            assert status == 200
            fields = _revoke_fields(confirm, "k", token)
            # No credentials: refused, whatever the form holds.
            anonymous = Client(dashboard.base)
            assert (await asyncio.to_thread(anonymous.get, "/leases"))[0] == 401
            assert (await asyncio.to_thread(anonymous.post, "/revoke", fields))[0] == 401
            wrong = Client(dashboard.base, {"Authorization": "Bearer not-the-token-at-all"})
            assert (await asyncio.to_thread(wrong.post, "/revoke", fields))[0] == 401
            # Credentials, but no CSRF token, or one made for another browser's cookie.
            no_csrf = [f for f in fields if f[0] != "csrf"]
            assert (await asyncio.to_thread(operator.post, "/revoke", no_csrf))[0] == 403
            other = Client(dashboard.base, BEARER)
            assert (await asyncio.to_thread(other.post, "/revoke", fields))[0] == 403
            # The right token, sent from another site's page.
            cross = Client(dashboard.base, {**BEARER, "Origin": "http://evil.example"})
            cross.opener = operator.opener
            assert (await asyncio.to_thread(cross.post, "/revoke", fields))[0] == 403
            record = await backend.get_lease("k")
            assert record is not None and record.token == token
            _, lines = await asyncio.to_thread(operator.get, "/audit.jsonl")
            assert lines == ""
            # With both, the revoke goes through.
            status, page = await asyncio.to_thread(operator.post, "/revoke", fields)
            assert status == 200 and "Revoked." in page
            assert await backend.get_lease("k") is None
            _, lines = await asyncio.to_thread(operator.get, "/audit.jsonl")
            (entry,) = [json.loads(line) for line in lines.splitlines()]
            assert (entry["who"], entry["token"], entry["outcome"]) == (
                "bearer token",
                token,
                "revoked",
            )


@pytest.mark.asyncio
async def test_read_only_refuses_actions(sqlite_url: str) -> None:
    async with from_url(sqlite_url) as backend:
        token = (await backend.acquire_lease("k", "w", 60_000)).token
        assert token is not None
        with Dashboard(sqlite_url, "--read-only") as dashboard:
            client = Client(dashboard.base)
            status, leases = await asyncio.to_thread(client.get, "/leases")
            assert status == 200 and "revoke" not in leases
            _, confirm = await asyncio.to_thread(client.get, f"/revoke?k=k&token={token}")
            assert "read-only" in confirm and 'id="confirm"' not in confirm
            fields = [("k", "k"), ("token", str(token)), ("t", "k"), ("run", "s1.1")]
            for path in ("/revoke", "/bulk", "/cancel"):
                status, text = await asyncio.to_thread(client.post, path, fields)
                assert (status, text) == (403, "this dashboard is read-only")
            assert await backend.get_lease("k") is not None


@pytest.mark.asyncio
async def test_a_cancel_needs_the_csrf_token_and_shows_no_action_read_only(
    sqlite_url: str,
) -> None:
    names = ThreadNames("app.agents")
    async with from_url(sqlite_url) as backend:
        run = await backend.acquire_lease(names.name("chat-1"), "host:1/s7.3", 60_000)
        assert run.token is not None
        thread = "/thread?ns=app.agents&t=chat-1"
        confirm_path = f"/cancel?ns=app.agents&t=chat-1&run=s7.3&token={run.token}"
        with Dashboard(sqlite_url) as dashboard:
            client = Client(dashboard.base)
            status, page = await asyncio.to_thread(client.get, thread)
            assert (
                status == 200 and 'class="run">s7.3<' in page and 'a class="action cancel"' in page
            )
            # A session still opening (phase 0) has no run: nothing to cancel.
            await backend.acquire_lease(names.name("chat-2"), "host:1/s9.0", 60_000)
            opening = ""

            async def shown() -> bool:
                nonlocal opening
                _, opening = await asyncio.to_thread(client.get, "/thread?ns=app.agents&t=chat-2")
                return "host:1/s9.0" in opening

            await until(shown)
            assert "cancel this run" not in opening
            _, confirm = await asyncio.to_thread(client.get, confirm_path)
            fields = [
                ("csrf", csrf_of(confirm)),
                ("ns", "app.agents"),
                ("t", "chat-1"),
                ("run", "s7.3"),
                ("token", str(run.token)),
                ("owner", "host:1/s7.3"),
            ]
            no_csrf = [f for f in fields if f[0] != "csrf"]
            assert (await asyncio.to_thread(client.post, "/cancel", no_csrf))[0] == 403
            assert (await asyncio.to_thread(Client(dashboard.base).post, "/cancel", fields))[
                0
            ] == 403
            bad = [(n, "" if n == "run" else v) for n, v in fields]
            status, text = await asyncio.to_thread(client.post, "/cancel", bad)
            assert status == 400 and "run" in text
            assert (await asyncio.to_thread(client.get, "/audit.jsonl"))[1] == ""
            status, _ = await asyncio.to_thread(client.post, "/cancel", fields)
            assert status == 200
            _, lines = await asyncio.to_thread(client.get, "/audit.jsonl")
            (entry,) = [json.loads(line) for line in lines.splitlines()]
            assert (entry["action"], entry["namespace"], entry["run_id"]) == (
                "cancel",
                "app.agents",
                "s7.3",
            )
            assert entry["key"] == names.name("chat-1") and entry["token"] == run.token
        with Dashboard(sqlite_url, "--read-only") as dashboard:
            client = Client(dashboard.base)
            _, page = await asyncio.to_thread(client.get, thread)
            assert 'class="run">s7.3<' in page and "cancel this run" not in page
            _, confirm = await asyncio.to_thread(client.get, confirm_path)
            assert "read-only" in confirm and 'id="confirm"' not in confirm


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "::"])
def test_refuses_a_non_loopback_address_without_authentication(sqlite_url: str, host: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tenure", "dashboard", "--url", sqlite_url, "--host", host],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "without authentication" in done.stderr and "--auth-file" in done.stderr


def test_credentials_come_from_a_file_never_the_command_line(
    sqlite_url: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tenure", "dashboard", "--url", sqlite_url, "--token", TOKEN],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "unrecognized arguments" in done.stderr
    empty = tmp_path / "auth"
    empty.write_text("\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tenure",
            "dashboard",
            "--url",
            sqlite_url,
            "--auth-file",
            str(empty),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "is empty" in done.stderr


@pytest.mark.asyncio
async def test_the_backend_password_is_never_shown(tmp_path: Path) -> None:
    password = "pw-ZX81-never-shown"
    with RedisServer(password=password) as server:
        url = server.url + "?quarantine=off"
        async with from_url(url) as backend:
            await backend.acquire_lease("k", "w", 60_000)
        with Dashboard(url) as dashboard:
            client = Client(dashboard.base)
            pages = ["/leases", "/key?k=k", "/threads", "/health", "/audit", "/stats.json"]
            for path in pages:
                status, text = await asyncio.to_thread(client.get, path)
                assert status == 200, (path, text)
                assert password not in text, path
            _, leases = await asyncio.to_thread(client.get, "/leases")
            assert "redis://:***@127.0.0.1" in leases
        assert password not in dashboard.output()


@pytest.mark.asyncio
async def test_threads_health_and_the_audit_file(sqlite_url: str, tmp_path: Path) -> None:
    names = ThreadNames("app.agents")
    audit = tmp_path / "audit.jsonl"
    async with from_url(sqlite_url) as backend:
        run = await backend.acquire_lease(names.name("chat-42"), "host:1/s7.0", 60_000)
        with Dashboard(sqlite_url, "--audit-log", str(audit)) as dashboard:
            client = Client(dashboard.base)
            status, threads = await asyncio.to_thread(client.get, "/threads?ns=app.agents")
            assert status == 200
            assert 'data-thread="chat-42"' in threads and "host:1" in threads
            assert str(run.token) in threads
            _, health = await asyncio.to_thread(client.get, "/health")
            assert "tenure doctor" in health and "level-" in health
            key = names.name("chat-42")
            _, confirm = await asyncio.to_thread(client.get, f"/revoke?k={key}&token={run.token}")
            assert run.token is not None
            fields = _revoke_fields(confirm, key, run.token)
            assert (await asyncio.to_thread(client.post, "/revoke", fields))[0] == 200
            # Another process takes the thread: the page shows the hand-over it saw.
            await backend.acquire_lease(key, "host:2/s8.0", 60_000)

            async def handed_over() -> bool:
                _, page = await asyncio.to_thread(client.get, "/threads?ns=app.agents")
                return "host:2/s8.0" in page and "s without owner" in page

            await until(handed_over)
    (entry,) = [json.loads(line) for line in audit.read_text().splitlines()]
    assert (entry["key"], entry["token"], entry["who"]) == (key, run.token, "local")


@pytest.mark.parametrize("kind", ["postgres", "etcd"])
@pytest.mark.asyncio
async def test_listing_and_revoking_on(kind: str, unique: str, tmp_path: Path) -> None:
    target = TARGETS[kind]
    url = target.isolated_url(unique, tmp_path)
    try:
        async with from_url(url) as backend:
            tokens = {}
            for i in range(3):
                result = await backend.acquire_lease(f"svc/{i}", f"node-{i}", 60_000)
                assert result.acquired and result.token is not None
                tokens[f"svc/{i}"] = result.token
            with Dashboard(url) as dashboard:
                client = Client(dashboard.base)
                status, leases = await asyncio.to_thread(client.get, "/leases?prefix=svc%2F")
                assert status == 200 and "3 of 3 live leases" in leases
                for key, token in tokens.items():
                    assert f'data-key="{key}"' in leases and f">{token}<" in leases
                path = f"/revoke?k=svc/1&token={tokens['svc/1']}"
                _, confirm = await asyncio.to_thread(client.get, path)
                fields = _revoke_fields(confirm, "svc/1", tokens["svc/1"])
                assert (await asyncio.to_thread(client.post, "/revoke", fields))[0] == 200
                assert await backend.get_lease("svc/1") is None
                assert await backend.get_lease("svc/0") is not None
                assert (await asyncio.to_thread(client.get, "/health"))[0] == 200
                # A run's cancel needs a backend that keeps thread output (not etcd).
                names = ThreadNames("tenure.thread")
                held = await backend.acquire_lease(names.name("t1"), "h/s1.1", 60_000)
                cancel = [("csrf", csrf_of(confirm)), ("t", "t1"), ("run", "s1.1")]
                cancel.append(("token", str(held.token)))
                status, text = await asyncio.to_thread(client.post, "/cancel", cancel)
                _, page = await asyncio.to_thread(client.get, "/thread?t=t1")
                if kind == "etcd":
                    assert status == 409 and "cannot cancel a thread's run" in text
                    assert 'id="no-output"' in page
                else:
                    assert status == 200
                    assert "no output kept" in page
    finally:
        if target.cleanup is not None:
            target.cleanup(unique)


@pytest.mark.asyncio
async def test_a_key_with_a_carriage_return_keeps_the_live_updates_whole(sqlite_url: str) -> None:
    async with from_url(sqlite_url) as backend:
        with Dashboard(sqlite_url) as dashboard:
            reader, writer = await asyncio.open_connection("127.0.0.1", dashboard.port)
            writer.write(b"GET /events?view=leases HTTP/1.0\r\n\r\n")  # no chunks
            await writer.drain()
            await backend.acquire_lease("odd\revent: other\rkey", "w", 60_000)
            lines: list[bytes] = []
            try:
                while b"odd" not in b"".join(lines):
                    lines.append(await asyncio.wait_for(reader.readline(), 30))
                while (line := await asyncio.wait_for(reader.readline(), 30)) not in (b"\n", b""):
                    lines.append(line)
            finally:
                writer.close()
            event = b"".join(lines).split(b"event: update\n")[-1]
            # Every line of the event is data (a CR would have started a field of its own).
            assert b"\r" not in event
            assert all(line.startswith(b"data: ") for line in event.splitlines())
            assert b"odd&#13;event: other&#13;key" in event


def _dashboard_exit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tenure", "dashboard", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_unreachable_backend_is_one_line_without_its_password() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens on it: bound, never listening
        done = _dashboard_exit("--url", f"redis://:pw-never-printed@127.0.0.1:{port}/0")
    assert done.returncode == 69, done.stderr
    assert done.stderr.startswith("tenure dashboard: ") and "Traceback" not in done.stderr
    assert "pw-never-printed" not in done.stderr + done.stdout
    assert "redis://:***@127.0.0.1" in done.stderr


@pytest.mark.parametrize("interval", ["nan", "0", "-1", "inf"])
def test_a_bad_interval_is_refused(sqlite_url: str, interval: str) -> None:
    done = _dashboard_exit("--url", sqlite_url, "--interval", interval)
    assert done.returncode == 2 and "interval must be above 0" in done.stderr


@pytest.mark.asyncio
async def test_health_lists_the_telemetry_of_the_dashboard_with_telemetry(
    sqlite_url: str,
) -> None:
    async with from_url(sqlite_url) as backend:
        token = (await backend.acquire_lease("k", "w", 60_000)).token
        assert token is not None
        with Dashboard(sqlite_url) as dashboard:
            _, health = await asyncio.to_thread(Client(dashboard.base).get, "/health")
            assert 'id="no-telemetry"' in health and "data-metric" not in health
            # Said once, in the page; its title is only the page's name.
            assert health.count('id="no-telemetry"') == 1
            assert "<title>Health · tenure dashboard</title>" in health
        with Dashboard(sqlite_url, "--telemetry") as dashboard:
            client = Client(dashboard.base)
            _, confirm = await asyncio.to_thread(client.get, f"/revoke?k=k&token={token}")
            fields = _revoke_fields(confirm, "k", token)
            assert (await asyncio.to_thread(client.post, "/revoke", fields))[0] == 200
            # The same token again: the lease is gone, the call answers False.
            assert (await asyncio.to_thread(client.post, "/revoke", fields))[0] == 200
            _, health = await asyncio.to_thread(client.get, "/health")
    rows = {
        (name, attributes): value
        for name, attributes, value in re.findall(
            r'<tr data-metric="([^"]+)"><td>[^<]*</td><td>([^<]*)</td><td class="value">([^<]*)</td>',
            health,
        )
    }
    assert rows[("tenure.lease.revocations", "")] == "1"
    # Each lease call the dashboard made: the confirmation's read, the two revokes.
    calls = {
        attributes.partition(", ")[2]: value
        for (name, attributes), value in rows.items()
        if name == "tenure.lease.operation.duration"
    }
    assert calls.keys() == {
        "operation=get_lease, outcome=ok",
        "operation=revoke_lease, outcome=ok",
        "operation=revoke_lease, outcome=refused",
    }
    assert all(value.startswith("1 (mean ") for value in calls.values())


async def _first_update(port: int, since: str, timeout: float) -> bool:
    """Whether a live-update stream from look ``since`` sends an update within ``timeout`` s."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /events?view=leases&since={since} HTTP/1.0\r\n\r\n".encode())
    await writer.drain()
    try:
        async with asyncio.timeout(timeout):
            while b"event: update" not in await reader.readline():
                pass
        return True
    except TimeoutError:
        return False
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_a_live_page_gets_at_once_a_look_newer_than_the_page(sqlite_url: str) -> None:
    async with from_url(sqlite_url) as backend:
        await backend.acquire_lease("k/1", "w", 60_000)
    # Looks 30 s apart: the first at start, one more woken by the first page.
    with Dashboard(sqlite_url, interval=30) as dashboard:
        client = Client(dashboard.base)
        await asyncio.to_thread(client.get, "/leases")

        async def looked_twice() -> bool:
            _, text = await asyncio.to_thread(client.get, "/stats.json")
            return bool(json.loads(text)["scans"] >= 2)

        await until(looked_twice, timeout=30)
        _, page = await asyncio.to_thread(client.get, "/leases")
        since = re.search(r"since=(\d+)", page)
        assert since is not None
        # A stream from the page's look waits for the next look; one from an older
        # look (a look ended between the page and its stream) gets the newer at once.
        assert not await _first_update(dashboard.port, since.group(1), 1.0)
        assert await _first_update(dashboard.port, str(int(since.group(1)) - 1), 10.0)
