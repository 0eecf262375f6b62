"""``tenure watch``: the change detection on hand-made snapshots, and the command
run as a user runs it while leases are granted, moved, released, revoked and
left to expire."""

from __future__ import annotations

import asyncio
import os
import pty
import sys
from pathlib import Path

import pytest

import tenure
from tenure._contract import LeaseRecord
from tenure._watch import Seen, changes
from tenure.testing import eventually

SRC = str(Path(__file__).resolve().parent.parent / "src")


def _kinds(before: dict[str, Seen], now: dict[str, LeaseRecord], at: float) -> list[str]:
    found, _ = changes(before, now, at)
    return [f"{c.kind} {c.key}" for c in found]


def test_each_kind_of_change_is_told_apart() -> None:
    held = LeaseRecord("alice", 5, 3000)
    before = {
        "kept": Seen(held, 10.0, 3000),
        "moved": Seen(held, 10.0, 3000),
        "freed": Seen(held, 10.0, 3000),
        "lapsed": Seen(LeaseRecord("carol", 2, 200), 10.0, 3000),
        "retaken": Seen(LeaseRecord("dave", 3, 200), 10.0, 3000),
    }
    now = {
        "kept": LeaseRecord("alice", 5, 2900),  # renewed 100 ms before this look
        "moved": LeaseRecord("bob", 6, 3000),
        "fresh": LeaseRecord("erin", 9, 3000),
        "retaken": LeaseRecord("frank", 4, 3000),
    }
    assert sorted(_kinds(before, now, 10.5)) == [
        "expired lapsed",
        "granted fresh",
        "regranted retaken",
        "released freed",
        "transferred moved",
    ]


def test_a_slow_look_never_turns_an_expiry_into_a_release() -> None:
    # Read during a look that began at 10.0 and took 0.25 s (a loaded machine):
    # 300 ms left when read, so it expired between 10.3 and 10.55.
    short = LeaseRecord("carol", 1, 300)
    _, seen = changes({}, {"k": short}, 10.0, 10.25)
    assert seen["k"].at == 10.0  # its TTL counts from the look's start at the latest
    # Gone in a look from 10.4 to 10.45: it may have expired by then.
    found, _ = changes(seen, {}, 10.4, 10.45)
    assert [(c.kind, c.key) for c in found] == [("expired", "k")]
    # Gone in a look over by 10.29: it cannot have expired, so it was released.
    found, _ = changes(seen, {}, 10.28, 10.29)
    assert [(c.kind, c.key) for c in found] == [("released", "k")]


def test_a_lease_whose_renewals_stop_is_reported_once() -> None:
    seen = {"k": Seen(LeaseRecord("alice", 1, 3000), 0.0, 3000)}
    steps = [(0.9, 2100), (1.8, 1200), (2.5, 500), (2.8, 200)]
    reported = []
    for at, ttl in steps:
        found, seen = changes(seen, {"k": LeaseRecord("alice", 1, ttl)}, at)
        reported += [c.kind for c in found]
    assert reported == ["stalled"]
    found, seen = changes(seen, {"k": LeaseRecord("alice", 1, 3000)}, 2.9)  # renewed again
    assert found == [] and not seen["k"].stalled


def test_a_renewing_holder_is_not_reported() -> None:
    seen = {"k": Seen(LeaseRecord("alice", 1, 3000), 0.0, 3000)}
    for i in range(1, 20):
        at = i * 0.5
        ttl = 3000 - int((at % 1.0) * 1000)  # renewed every second
        found, seen = changes(seen, {"k": LeaseRecord("alice", 1, ttl)}, at)
        assert found == []


async def _next_line(stream: asyncio.StreamReader) -> str:
    line = await asyncio.wait_for(stream.readline(), 30)
    assert line, "tenure watch ended early"
    return line.decode().rstrip("\n")


@pytest.mark.asyncio
async def test_the_command_shows_what_happens_to_leases(shared_url: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    async with tenure.from_url(shared_url) as backend:
        await backend.acquire_lease("jobs/old", "zed", 60_000)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tenure",
            "watch",
            "--url",
            shared_url,
            "--prefix",
            "jobs/",
            "--interval",
            "0.1",
            "--count",
            "6",
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        try:
            assert "watching" in await _next_line(proc.stdout)
            assert "1 live lease" in await _next_line(proc.stdout)
            steps = [
                (backend.acquire_lease("jobs/a", "alice", 60_000), "granted     jobs/a"),
                (backend.transfer_lease("jobs/a", "alice", "bob", 60_000), "transferred  jobs/a"),
                (backend.release_lease("jobs/a", "bob"), "released     jobs/a"),
                (backend.revoke_lease("jobs/old"), "released     jobs/old"),
                (backend.acquire_lease("jobs/short", "carol", 300), "granted     jobs/short"),
            ]
            for action, expected in steps:
                await action
                line = await _next_line(proc.stdout)
                assert expected.split()[0] in line and expected.split()[1] in line, line
            line = await _next_line(proc.stdout)  # nobody renews jobs/short
            assert "jobs/short" in line and ("expired" in line or "stalled" in line), line
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


@pytest.mark.asyncio
async def test_on_a_terminal_the_leases_show_as_a_live_table(tmp_path: Path) -> None:
    """Run under a pseudo-terminal: a table of the live leases with the recent
    changes below it; a key that looks like rich markup is shown as it is."""
    url = f"sqlite:///{tmp_path / 'leases.db'}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    env["COLUMNS"] = "160"
    controller, terminal = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "tenure", "watch", "--url", url, "--interval", "0.1", "--count", "1"),
        env=env,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal closed: the command ended
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = asyncio.create_task(asyncio.to_thread(read))
    try:
        async with tenure.from_url(url) as backend:
            await eventually(lambda: b"live lease" in seen, timeout=30)
            await backend.acquire_lease("[bold]job[/bold]", "alice", 60_000)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await asyncio.wait_for(reader, 10)
        os.close(controller)
    text = seen.decode(errors="replace")
    assert "KEY" in text and "OWNER" in text and "1 live leases" in text  # the table
    assert "[bold]job[/bold]" in text  # shown as written, not as markup
    assert "granted" in text


@pytest.mark.asyncio
async def test_piped_keys_and_owners_with_control_characters_are_escaped(tmp_path: Path) -> None:
    """A key or owner holding an escape sequence must not reach an operator's
    terminal raw: shown escaped, as ``tenure leases list`` shows it."""
    url = f"sqlite:///{tmp_path / 'leases.db'}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    key, owner = "job\x1b[2J", "mallory\x1b]0;pwned\x07"
    async with tenure.from_url(url) as backend:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "tenure", "watch", "--url", url, "--interval", "0.1", "--count", "2"),
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        try:
            assert "watching" in await _next_line(proc.stdout)
            assert "live lease" in await _next_line(proc.stdout)
            assert (await backend.acquire_lease(key, owner, 300)).acquired
            out = await asyncio.wait_for(proc.stdout.read(), 30)  # granted, then stalled or expired
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    text = out.decode()
    assert "\x1b" not in text and "\x07" not in text
    assert "job\\x1b[2J" in text and "mallory\\x1b]0;pwned\\x07" in text
    assert "granted" in text
