"""``tenure run KEY -- CMD``, run as a user runs it: a real ``tenure`` process and
a real command, on SQLite, Redis and PostgreSQL, with real pauses, kills and a
black-holed connection."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import pytest_asyncio

import tenure
from safety.proxy import Proxy
from tenure._run import EXIT_BUSY, EXIT_LOST, EXIT_UNAVAILABLE

from .conftest import TARGETS
from .support.redis_server import RedisServer

SRC = str(Path(__file__).resolve().parent.parent / "src")

# The command most tests run: says it started, writes what it got, then sleeps
# (until SIGTERM, which it reports) or exits with the status it was given.
COMMAND = """\
import os, signal, sys, time
out = sys.argv[1]
def on_term(*_):
    with open(out, "a") as f:
        f.write("term\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(out, "a") as f:
    f.write(f"pid {os.getpid()}\\n")
    for name in ("TENURE_LEASE_KEY", "TENURE_LEASE_OWNER", "TENURE_FENCING_TOKEN"):
        f.write(f"{name} {os.environ[name]}\\n")
    f.write("started\\n")
if sys.argv[2] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def url(shared_url: str) -> str:
    return shared_url


@pytest_asyncio.fixture
async def backend(url: str) -> AsyncIterator[tenure.Backend]:
    async with tenure.from_url(url) as b:
        yield b


async def _start(*args: str, url: str | None) -> asyncio.subprocess.Process:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    env.pop("TENURE_URL", None)
    if url is not None:
        env["TENURE_URL"] = url
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tenure",
        "run",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _finish(proc: asyncio.subprocess.Process, timeout: float = 60) -> tuple[int, str]:
    """The exit status and what was written to stderr (stdout joined in)."""
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, err.decode() + out.decode()


def _record(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return {name: value for name, _, value in (line.partition(" ") for line in lines)}


async def _until(condition: object, timeout: float = 30) -> None:
    assert callable(condition)
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, "condition not reached in time"
        await asyncio.sleep(0.02)


def _dead(pid: int) -> bool:
    """Exited: gone, or a zombie that nobody reaped (its parent was killed)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in {"Z", "X"}
    except FileNotFoundError:
        return True


@pytest.mark.asyncio
async def test_the_command_runs_under_the_lease_and_its_status_passes_through(
    url: str, backend: tenure.Backend, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = await _start("job", "--", sys.executable, "-c", COMMAND, str(out), "sleep", url=url)
    await _until(lambda: "started" in _record(out))
    got = _record(out)
    record = await backend.get_lease("job")
    assert record is not None
    assert record.owner == got["TENURE_LEASE_OWNER"]
    assert record.token == int(got["TENURE_FENCING_TOKEN"])
    assert got["TENURE_LEASE_KEY"] == "job"
    proc.send_signal(signal.SIGTERM)  # passed on to the command, which exits 0
    code, err = await _finish(proc)
    assert code == 0, err
    assert "term" in _record(out)
    assert await backend.get_lease("job") is None  # released once the command exited

    out.unlink()
    proc = await _start("job", "--", sys.executable, "-c", COMMAND, str(out), "7", url=url)
    code, err = await _finish(proc)
    assert code == 7, err
    assert int(_record(out)["TENURE_FENCING_TOKEN"]) > record.token


@pytest.mark.asyncio
async def test_a_busy_key_exits_73_naming_the_holder(
    url: str, backend: tenure.Backend, tmp_path: Path
) -> None:
    assert (await backend.acquire_lease("job", "someone-else", 60_000)).acquired
    proc = await _start("job", "--", sys.executable, "-c", "print('ran')", url=url)
    code, err = await _finish(proc)
    assert code == EXIT_BUSY
    assert "'someone-else'" in err and "refused: held" in err
    assert "ran" not in err  # the command did not run


@pytest.mark.asyncio
async def test_a_quarantined_redis_exits_73_saying_why_and_for_how_long() -> None:
    """A fresh Redis without appendfsync always refuses grants for max_ttl_ms: the
    refusal names the quarantine, not a holder nobody can find."""
    with RedisServer() as server:
        proc = await _start(
            "job",
            "--",
            sys.executable,
            "-c",
            "print('the-command-ran')",
            url=f"{server.url}?max_ttl_ms=30000",
        )
        code, err = await _finish(proc)
    assert code == EXIT_BUSY, err
    assert "refused: quarantine" in err and "refuses new grants for" in err
    assert "the-command-ran" not in err


@pytest.mark.asyncio
async def test_wait_takes_the_key_when_its_holder_releases(
    url: str, backend: tenure.Backend, tmp_path: Path
) -> None:
    first = await backend.acquire_lease("job", "someone-else", 60_000)
    assert first.acquired and first.token is not None
    out = tmp_path / "out"
    proc = await _start(
        "--wait", "30", "job", "--", sys.executable, "-c", COMMAND, str(out), "0", url=url
    )
    await asyncio.sleep(1.0)  # it is waiting: the command has not started
    assert not out.exists()
    await backend.release_lease("job", "someone-else")
    code, err = await _finish(proc)
    assert code == 0, err
    assert int(_record(out)["TENURE_FENCING_TOKEN"]) > first.token


@pytest.mark.asyncio
async def test_a_paused_holder_loses_the_lease_and_its_command_is_stopped(
    url: str, backend: tenure.Backend, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = await _start(
        "--ttl-ms", "1000", "job", "--", sys.executable, "-c", COMMAND, str(out), "sleep", url=url
    )
    await _until(lambda: "started" in _record(out))
    proc.send_signal(signal.SIGSTOP)
    try:
        # Past the TTL another owner takes the key: the paused one must not go on.
        await asyncio.sleep(1.2)
        taken = await tenure.acquire_wait(backend, "job", "next-owner", 60_000, timeout=10)
        assert taken.acquired
    finally:
        proc.send_signal(signal.SIGCONT)
    code, err = await _finish(proc)
    assert code == EXIT_LOST, err
    assert "lost the lease" in err
    assert "term" in _record(out)  # the command was told
    assert _dead(int(_record(out)["pid"]))
    record = await backend.get_lease("job")
    assert record is not None and record.owner == "next-owner"  # nothing released it


@pytest.mark.asyncio
async def test_a_command_that_ignores_sigterm_is_killed_after_the_grace(
    url: str, backend: tenure.Backend, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    ignore = (
        "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    )
    proc = await _start(
        "--ttl-ms",
        "1000",
        "--grace",
        "0.5",
        "job",
        "--",
        sys.executable,
        "-c",
        ignore,
        str(pid_file),
        url=url,
    )
    await _until(lambda: pid_file.exists() and pid_file.read_text() != "")
    proc.send_signal(signal.SIGSTOP)
    await asyncio.sleep(1.2)
    proc.send_signal(signal.SIGCONT)
    code, err = await _finish(proc)
    assert code == EXIT_LOST, err
    assert "SIGKILL" in err
    assert _dead(int(pid_file.read_text()))


@pytest.mark.asyncio
async def test_a_blackholed_renewal_loses_the_lease(unique: str, tmp_path: Path) -> None:
    """Redis through a proxy that swallows every byte: the renewals hang, the
    renew deadline passes, the command is stopped and ``tenure run`` exits 75."""
    direct = TARGETS["redis"].isolated_url(unique, tmp_path)
    parts = urlsplit(direct)
    assert parts.hostname is not None and parts.port is not None
    out = tmp_path / "out"
    try:
        async with Proxy(parts.hostname, parts.port) as proxy:
            via = urlunsplit(parts._replace(netloc=f"127.0.0.1:{proxy.port}"))
            proc = await _start(
                "--ttl-ms",
                "1500",
                "job",
                "--",
                sys.executable,
                "-c",
                COMMAND,
                str(out),
                "sleep",
                url=via,
            )
            await _until(lambda: "started" in _record(out))
            started = time.monotonic()
            proxy.set_mode("blackhole")
            code, err = await _finish(proc)
            proxy.set_mode("pass")
        assert code == EXIT_LOST, err
        assert "term" in _record(out)
        assert time.monotonic() - started < 15
    finally:
        cleanup = TARGETS["redis"].cleanup
        assert cleanup is not None
        await asyncio.to_thread(cleanup, unique)


@pytest.mark.asyncio
async def test_a_killed_supervisor_takes_its_command_along(
    url: str, backend: tenure.Backend, tmp_path: Path
) -> None:
    """Without ``tenure run`` nobody renews the lease; the command must not outlive it."""
    out = tmp_path / "out"
    proc = await _start("job", "--", sys.executable, "-c", COMMAND, str(out), "sleep", url=url)
    await _until(lambda: "started" in _record(out))
    proc.kill()
    await proc.wait()
    pid = int(_record(out)["pid"])
    await _until(lambda: _dead(pid), timeout=10)


@pytest.mark.asyncio
async def test_bad_invocations_say_why(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tenure.db'}"
    code, err = await _finish(await _start("job", "--", "no-such-command-here", url=url))
    assert code == 127 and "command not found" in err
    code, err = await _finish(await _start("job", url=url))
    assert code == 2 and "no command" in err
    code, err = await _finish(await _start("job", "--", "true", url="memory://"))
    assert code == 2 and "memory://" in err
    code, err = await _finish(
        await _start("job", "--", "true", url="redis://:hunter2-secret@127.0.0.1:1/0")
    )
    assert code == EXIT_UNAVAILABLE
    assert "hunter2-secret" not in err
    code, err = await _finish(await _start("--ttl-ms", "5", "job", "--", "true", url=url))
    assert code == 2 and "--ttl-ms" in err


# ``tenure run`` in a process of its own whose process start is wrapped: a
# SIGTERM reaches it right after its command was started, before the start has
# returned. No outside signal can be timed into that window (it is under a
# millisecond, unless the machine is loaded), so the process sends it to itself.
EARLY_SIGTERM = """\
import asyncio, os, signal, sys
from tenure._run import RunSettings, run_command

real = asyncio.create_subprocess_exec

async def start_then_sigterm(*args, **kwargs):
    proc = await real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.sleep(0.05)  # its handler, if any, runs before the start returns
    return proc

asyncio.create_subprocess_exec = start_then_sigterm
sys.exit(run_command(RunSettings(key="job", command=sys.argv[2:], url=sys.argv[1])))
"""


@pytest.mark.asyncio
async def test_a_sigterm_while_the_command_starts_is_passed_on_once_it_started(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'tenure.db'}"
    out = tmp_path / "out"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        EARLY_SIGTERM,
        url,
        sys.executable,
        "-c",
        COMMAND,
        str(out),
        "sleep",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    code, err = await _finish(proc)
    # The command got the SIGTERM: it exited 0 if its handler was in place, or
    # was ended by it (128 + 15) if it was still starting. tenure run itself was
    # not ended by it (-15), and released the lease.
    assert code in (0, 128 + signal.SIGTERM), (code, err)
    async with tenure.from_url(url) as backend:
        assert await backend.get_lease("job") is None


# A worker that ignores SIGTERM, writes its pid, and runs on.
STUBBORN = (
    "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
)


def _pid(path: Path) -> int | None:
    text = path.read_text() if path.exists() else ""
    return int(text) if text else None


@pytest.mark.asyncio
async def test_a_lost_lease_kills_the_whole_group_even_when_its_shell_dies_at_once(
    url: str, backend: tenure.Backend, tmp_path: Path
) -> None:
    """``sh`` dies of the SIGTERM at once; the worker it started ignores it. The
    worker must be SIGKILLed after the grace, and be gone when ``tenure run`` exits."""
    pid_file = tmp_path / "pid"
    script = f'{sys.executable} -c "{STUBBORN}" {pid_file} >/dev/null 2>&1 & wait'
    proc = await _start("--grace", "1", "job", "--", "sh", "-c", script, url=url)
    await _until(lambda: _pid(pid_file) is not None)
    assert await backend.revoke_lease("job")
    code, err = await _finish(proc)
    assert code == EXIT_LOST, err
    assert "SIGKILL" in err
    pid = _pid(pid_file)
    assert pid is not None and _dead(pid)


@pytest.mark.asyncio
async def test_what_the_command_leaves_in_its_group_is_stopped_before_the_release(
    url: str, backend: tenure.Backend, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    script = (
        f'{sys.executable} -c "{STUBBORN}" {pid_file} >/dev/null 2>&1 & '
        f"while [ ! -s {pid_file} ]; do sleep 0.05; done; exit 3"
    )
    code, err = await _finish(
        await _start("--grace", "0.5", "job", "--", "sh", "-c", script, url=url)
    )
    assert code == 3, err
    pid = _pid(pid_file)
    assert pid is not None and _dead(pid)
    assert "left processes in its group" in err
    assert await backend.get_lease("job") is None


@pytest.mark.asyncio
async def test_a_killed_supervisor_takes_the_commands_whole_group_along(
    url: str, backend: tenure.Backend, tmp_path: Path
) -> None:
    """``sh -c 'python work.py; echo done'``: ``work.py`` is not the direct child,
    and must die with ``tenure run`` all the same."""
    pid_file = tmp_path / "pid"
    work = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
    # Its output goes elsewhere: a pipe held open would keep the wait for the
    # killed supervisor going until work.py ended on its own.
    script = f'{sys.executable} -c "{work}" {pid_file} >/dev/null 2>&1; echo done'
    proc = await _start("job", "--", "sh", "-c", script, url=url)
    await _until(lambda: _pid(pid_file) is not None)
    proc.kill()
    await proc.wait()
    pid = _pid(pid_file)
    assert pid is not None
    await _until(lambda: _dead(pid), timeout=10)


@pytest.mark.asyncio
async def test_options_after_the_key_are_tenures_when_a_double_dash_follows(
    url: str, backend: tenure.Backend, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = await _start(
        *("job", "--url", url, "--ttl-ms", "2000", "--owner", "me", "--"),
        *(sys.executable, "-c", COMMAND, str(out), "sleep"),
        url=None,
    )
    await _until(lambda: "started" in _record(out))
    record = await backend.get_lease("job")
    assert record is not None and record.owner == "me" and record.ttl_ms <= 2000
    proc.send_signal(signal.SIGTERM)
    code, err = await _finish(proc)
    assert code == 0, err
    # Without "--", the command starts at the word after KEY, as documented.
    code, err = await _finish(
        await _start("job", sys.executable, "-c", COMMAND, str(out), "5", url=url)
    )
    assert code == 5, err


@pytest.mark.asyncio
async def test_a_forgotten_key_is_a_usage_error_not_a_lease_on_the_command(
    url: str, backend: tenure.Backend, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    code, err = await _finish(await _start("--", "touch", str(marker), url=url))
    assert code == 2, err
    assert "KEY" in err and not marker.exists()
    assert await backend.get_lease("touch") is None
    # A stray word between KEY and "--" is refused too, not run.
    code, err = await _finish(await _start("job", "touch", "--", "touch", str(marker), url=url))
    assert code == 2 and "only options and KEY" in err, err
    assert not marker.exists()


@pytest.mark.asyncio
async def test_the_command_starts_with_default_signal_dispositions(tmp_path: Path) -> None:
    """Python ignores SIGPIPE and SIGXFSZ at start-up, and an ignored signal stays
    ignored across exec: the command would not die of a closed pipe as it should."""
    url = f"sqlite:///{tmp_path / 'tenure.db'}"
    code, out = await _finish(
        await _start("job", "--", "grep", "SigIgn", "/proc/self/status", url=url)
    )
    assert code == 0, out
    ignored = int(out.split()[-1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), out
    assert not ignored & (1 << (signal.SIGXFSZ - 1)), out


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.asyncio
async def test_a_killed_keeper_leaves_tenure_run_to_end_the_group(tmp_path: Path) -> None:
    """The keeper between tenure run and the command is SIGKILLed alone: tenure
    run must not release the lease while the command's group runs on."""
    url = f"sqlite:///{tmp_path / 'tenure.db'}"
    pid_file = tmp_path / "pid"
    work = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
    script = f'{sys.executable} -c "{work}" {pid_file} >/dev/null 2>&1; echo done'
    proc = await _start("--grace", "5", "job", "--", "sh", "-c", script, url=url)
    await _until(lambda: _pid(pid_file) is not None)
    [keeper] = _children(proc.pid)
    os.kill(keeper, signal.SIGKILL)
    code, err = await _finish(proc)
    assert code == 128 + signal.SIGKILL, err
    assert "keeper died" in err
    pid = _pid(pid_file)
    assert pid is not None and _dead(pid)
