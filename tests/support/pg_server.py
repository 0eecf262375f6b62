"""A private PostgreSQL server for tests that stop, kill, pause or restart it.

The shared server on 127.0.0.1:5432 must never be disturbed; a test that needs
to hurt a server starts its own::

    with PgServer(password="s3cret") as server:
        url = server.url            # postgresql://postgres:s3cret@127.0.0.1:<port>/postgres
        ...
        server.kill()               # SIGKILL the postmaster and every backend
        server.start()              # crash recovery, same port, same data
        pid = server.backend_pids()[0]
        server.pause(pid)           # SIGSTOP one backend (holding its locks)
        server.resume(pid)

It runs ``initdb`` and ``pg_ctl`` from the directory :func:`find_bindir` finds
(``$TENURE_PG_BINDIR``, else the highest version under ``/usr/lib/postgresql``,
else ``pg_config --bindir``, else ``$PATH``) in a fresh temporary directory,
listens on a free port on 127.0.0.1 only, and keeps its Unix socket inside
that directory. initdb refuses to run as root, so when the tests run as root
the server runs as the ``postgres`` OS user (through ``runuser``) in a
directory that user owns.

Durability settings: ``fsync=off`` (the OS never crashes in a test, only the
server does), ``synchronous_commit`` stays on so a killed server keeps every
commit it acknowledged. ``close()`` stops the server and removes the directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

import psycopg

__all__ = ["PgServer", "find_bindir"]

_TOOLS = ("initdb", "pg_ctl")


def _has_tools(bindir: Path) -> bool:
    return all(os.access(bindir / tool, os.X_OK) for tool in _TOOLS)


def _version(bindir: str) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin: "16" > "15" > "9.6", compared as numbers.
    name = Path(bindir).parent.name
    return tuple(int(part) for part in re.findall(r"\d+", name))


def find_bindir() -> Path:
    """Where PostgreSQL's server programs (``initdb``, ``pg_ctl``) are, whatever the version.

    ``$TENURE_PG_BINDIR`` if set; else the highest version installed under
    ``/usr/lib/postgresql/*/bin`` (Debian's layout, what ``scripts/setup``
    installs); else ``pg_config --bindir``; else the directory of ``pg_ctl`` on
    ``$PATH``. Raises ``RuntimeError`` (a loud failure, not a skip) when none
    has them.
    """
    override = os.environ.get("TENURE_PG_BINDIR")
    if override:
        if not _has_tools(Path(override)):
            raise RuntimeError(f"TENURE_PG_BINDIR={override} has no {' and '.join(_TOOLS)}")
        return Path(override)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True, timeout=30
        )
        candidates.append(out.stdout.strip())
    on_path = shutil.which("pg_ctl")
    if on_path is not None:
        candidates.append(str(Path(on_path).resolve().parent))
    for candidate in candidates:
        if candidate and _has_tools(Path(candidate)):
            return Path(candidate)
    raise RuntimeError(
        "PostgreSQL's server programs (initdb, pg_ctl) were not found under "
        "/usr/lib/postgresql/*/bin, by pg_config or on PATH: run scripts/setup, "
        "or set TENURE_PG_BINDIR"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgServer:
    """One throw-away PostgreSQL cluster; see the module docstring.

    ``password``: when given, TCP connections need it (scram-sha-256) and
    :attr:`url` contains it; otherwise TCP connections are trusted. The
    cluster is created on the first :meth:`start`; later starts reuse its
    data (so :meth:`kill` then :meth:`start` is a crash and a recovery).
    """

    def __init__(
        self,
        *,
        password: str | None = None,
        bindir: Path | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.password = password
        # Extra server settings (``-c name=value``), e.g. a slow WAL writer.
        self.settings = dict(settings or {})
        self.bindir = find_bindir() if bindir is None else bindir
        self.port = free_port()
        self._as_root = os.geteuid() == 0
        self.dir = Path(tempfile.mkdtemp(prefix="tenure-pg-"))
        if self._as_root:
            entry = pwd.getpwnam("postgres")
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self._initialised = False

    # -- URLs ----------------------------------------------------------------

    @property
    def url(self) -> str:
        """``postgresql://postgres[:password]@127.0.0.1:<port>/postgres``."""
        auth = "postgres" if self.password is None else f"postgres:{quote(self.password, safe='')}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/postgres"

    # -- life cycle ------------------------------------------------------------

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(
                f"{args[0]} failed ({result.returncode}): {result.stderr.strip()}\n"
                f"{self.server_log()[-2000:]}"
            )
        return result

    def _initdb(self) -> None:
        args = ["initdb", "-D", str(self.data), "-U", "postgres", "--no-sync", "-E", "UTF8"]
        if self.password is None:
            args += ["-A", "trust"]
        else:
            pwfile = self.dir / "pwfile"
            pwfile.write_text(self.password + "\n")
            if self._as_root:
                entry = pwd.getpwnam("postgres")
                os.chown(pwfile, entry.pw_uid, entry.pw_gid)
            args += ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        self._run(*args)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "pwfile").unlink()
        self._initialised = True

    def start(self) -> Self:
        """Start (creating the cluster the first time) and wait until it accepts connections."""
        if not self._initialised:
            self._initdb()
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} "
            "-c fsync=off -c full_page_writes=off -c max_connections=60 "
            "-c shared_buffers=16MB"
        ) + "".join(f" -c {name}={value}" for name, value in self.settings.items())
        data, log = str(self.data), str(self.log)
        self._run("pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "-o", options, "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m <mode>`` (``smart``, ``fast`` or ``immediate``); no-op if stopped."""
        if self.postmaster_pid() is None:
            return
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop")

    def restart(self) -> None:
        """A clean stop then a start on the same port with the same data."""
        self.stop()
        self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster and all its backends at once (a crash); wait until gone."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        victims = [pid, *self._children(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(_alive(v) for v in victims):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL processes {victims} did not die")
            time.sleep(0.02)
        # A killed postmaster may linger as a zombie until the container's
        # init reaps it, and PostgreSQL would take its stale lock files for a
        # live server: the processes are gone, so the files can go too.
        for stale in (
            self.data / "postmaster.pid",
            self.dir / f".s.PGSQL.{self.port}.lock",
            self.dir / f".s.PGSQL.{self.port}",
        ):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()

    def close(self) -> None:
        """Stop the server (immediately) and remove its directory."""
        try:
            pid = self.postmaster_pid()
            if pid is not None:
                # A paused backend would make any orderly shutdown hang.
                for child in self._children(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, signal.SIGCONT)
                try:
                    self.stop("immediate")
                except RuntimeError:
                    self.kill()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- processes -----------------------------------------------------------

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid, or ``None``."""
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except (FileNotFoundError, PermissionError):
            return None
        pid = int(first)
        return pid if _alive(pid) else None

    def backend_pids(self) -> list[int]:
        """Pids of client backends (not the server's own workers), from ``pg_stat_activity``."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchall()
        return [int(pid) for (pid,) in rows]

    def pause(self, pid: int) -> None:
        """SIGSTOP one server process (a backend stays frozen holding its locks)."""
        os.kill(pid, signal.SIGSTOP)

    def resume(self, pid: int) -> None:
        """SIGCONT a process paused with :meth:`pause`."""
        os.kill(pid, signal.SIGCONT)

    def server_log(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @staticmethod
    def _children(parent: int) -> list[int]:
        children = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The command name may contain spaces and parentheses: split after the last ')'.
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                children.append(int(entry.name))
        return children


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
