"""A private ``redis-server`` for tests that restart, pause or kill Redis.

The shared Redis on 6379 must never be disturbed, so fault tests start their
own server with :class:`RedisServer`: on 127.0.0.1, on a free port, with its
data in a temporary directory that is removed at the end::

    with RedisServer() as server:              # started, answers PING
        url = server.url                       # redis://127.0.0.1:<port>/0
        server.pause(); server.resume()        # SIGSTOP / SIGCONT
        server.restart(keep_data=False)        # like a restart without persistence
        server.kill()                          # SIGKILL, no shutdown save

    with RedisServer(shifted_clock=True) as server:
        server.step_clock(-100)                # its wall clock jumps back 100 s

The binary is ``redis-server`` from ``$PATH`` (Debian's ``redis-server``
package; ``.ci/run`` installs it). If it is missing, :meth:`start` raises
``RuntimeError``: tests fail, they never skip. Only the standard library and
the synchronous redis-py client are used, so the module works in any process
(pytest, a subprocess of a test, a benchmark).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

from redis.crc import key_slot

import redis

__all__ = [
    "ClusterServers",
    "RedisSentinels",
    "RedisServer",
    "SentinelServer",
    "end_process",
    "free_port",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def end_process(proc: subprocess.Popen[bytes] | None, sig: signal.Signals) -> None:
    """Send ``sig`` to a server process and wait until it is gone (SIGKILL after 10 s)."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)  # a paused server cannot handle SIGTERM
        proc.send_signal(sig)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class RedisServer:
    """One ``redis-server`` process owned by a test.

    ``persistence=True`` turns on the append-only file with ``appendfsync
    always`` (every write survives :meth:`restart` and even :meth:`kill`);
    otherwise nothing is saved and a restart starts empty. ``password`` sets
    ``requirepass`` (the default user's password). ``args`` are extra
    ``redis-server`` options, e.g. ``["--maxmemory-policy", "allkeys-lru"]``.
    The port and data directory stay the same across restarts.
    ``shifted_clock=True`` runs the server under ``clockshift.c`` (built with
    ``cc``), so :meth:`step_clock` can move its wall clock and only its.
    """

    def __init__(
        self,
        *,
        persistence: bool = False,
        password: str | None = None,
        args: Sequence[str] = (),
        start_timeout: float = 10.0,
        shifted_clock: bool = False,
    ) -> None:
        self.persistence = persistence
        self.password = password
        self.args = list(args)
        self.start_timeout = start_timeout
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tenure-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.shifted_clock = shifted_clock
        self.clock_offset = 0.0

    # -- addresses -------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, with the password when one is set."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def url_for(self, username: str | None = None, password: str | None = None) -> str:
        """A URL of this server with the given credentials (for auth tests)."""
        auth = ""
        if username is not None or password is not None:
            auth = quote(username or "", safe="")
            if password is not None:
                auth += ":" + quote(password, safe="")
            auth += "@"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A synchronous admin client (close it, or use it in a ``with`` block)."""
        kwargs.setdefault("socket_timeout", 5.0)
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **kwargs)

    def command(self, *args: Any) -> Any:
        """Run one command on a fresh admin connection and return the reply."""
        with self.client() as conn:
            return conn.execute_command(*args)

    # -- life cycle ---------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the server and wait until it answers ``PING``."""
        if self.running:
            raise RuntimeError("redis-server is already running")
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed (apt-get install redis-server; .ci/run does it)"
            )
        cmd = [
            binary,
            *self._config_file(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--save",
            "",
            "--logfile",
            str(self.dir / "redis.log"),
            "--appendonly",
            "yes" if self.persistence else "no",
            "--appendfsync",
            "always",
            # A replica's first sync starts at once (Redis waits 5 s by default).
            "--repl-diskless-sync-delay",
            "0",
        ]
        if self.password is not None:
            cmd += ["--requirepass", self.password]
        cmd += self.args
        env = None
        if self.shifted_clock:
            env = {
                **os.environ,
                "LD_PRELOAD": str(self._build_shim()),
                "TENURE_CLOCK_OFFSET_FILE": str(self._offset_file),
            }
            self._write_offset()
        self.process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self._wait_ready()

    # -- the shifted clock ------------------------------------------------------

    @property
    def _offset_file(self) -> Path:
        return self.dir / "clock-offset"

    def _build_shim(self) -> Path:
        shim = self.dir / "clockshift.so"
        if not shim.exists():
            compiler = shutil.which("cc") or shutil.which("gcc")
            if compiler is None:
                raise RuntimeError("shifted_clock needs a C compiler (apt-get install gcc)")
            source = Path(__file__).with_name("clockshift.c")
            subprocess.run(
                [compiler, "-shared", "-fPIC", "-O2", "-o", str(shim), str(source)],
                check=True,
                capture_output=True,
            )
        return shim

    def _write_offset(self) -> None:
        tmp = self._offset_file.with_suffix(".tmp")
        tmp.write_text(str(round(self.clock_offset * 1_000_000)))
        tmp.replace(self._offset_file)  # the server never reads half a number

    def step_clock(self, seconds: float) -> None:
        """Move the server's wall clock by ``seconds`` (back if negative), at once.

        Redis caches the time for up to a cron tick (100 ms): wait a little
        before relying on the new time.
        """
        if not self.shifted_clock:
            raise RuntimeError("step_clock needs RedisServer(shifted_clock=True)")
        self.clock_offset += seconds
        self._write_offset()

    def replicate(self, master: RedisServer, timeout: float = 10.0) -> None:
        """Become a replica of ``master``; return once it acknowledges a write
        there (so a ``WAIT`` on the master counts it at once)."""
        self.command("REPLICAOF", "127.0.0.1", str(master.port))
        deadline = time.monotonic() + timeout
        while self.command("INFO", "replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica on port {self.port} never synced")
            time.sleep(0.02)
        # A replica that just synced can take a second more to acknowledge.
        with master.client() as conn:
            conn.set("tenure-test-sync", 1)
            acked = conn.execute_command("WAIT", 1, int(timeout * 1000))
            conn.delete("tenure-test-sync")
        if acked < 1:
            raise RuntimeError(f"replica on port {self.port} never acknowledged a write")

    def _config_file(self) -> list[str]:
        """Arguments before the options (a sentinel's config file)."""
        return []

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {log}")
            try:
                with self.client(socket_timeout=1.0, socket_connect_timeout=1.0) as conn:
                    conn.ping()
                    # With AOF, PING answers before the data is loaded.
                    if conn.info("persistence").get("loading", 0) == 0:
                        return
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop gracefully (SIGTERM; with persistence the AOF is complete)."""
        self._signal_and_wait(signal.SIGTERM)

    def kill(self) -> None:
        """Kill at once (SIGKILL), as a crash would."""
        self._signal_and_wait(signal.SIGKILL)

    def _signal_and_wait(self, sig: signal.Signals) -> None:
        end_process(self.process, sig)
        self.process = None

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, nothing is answered."""
        assert self.process is not None, "not running"
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo :meth:`pause` (SIGCONT)."""
        assert self.process is not None, "not running"
        self.process.send_signal(signal.SIGCONT)

    def restart(self, *, keep_data: bool | None = None) -> None:
        """Stop and start again on the same port.

        ``keep_data=False`` kills the server and deletes its files: the new
        server starts empty, exactly like a restart without persistence.
        ``keep_data=True`` stops it gracefully and keeps its files (needs
        ``persistence=True`` to keep anything). The default follows
        ``persistence``.
        """
        if keep_data is None:
            keep_data = self.persistence
        if keep_data:
            self.stop()
        else:
            self.kill()
            for entry in self.dir.iterdir():
                if entry.name not in {"redis.log", "clockshift.so", "clock-offset"}:
                    if entry.is_dir():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
        self.start()

    def close(self) -> None:
        """Kill the server and remove its directory."""
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"RedisServer(port={self.port}, {state}, dir={str(self.dir)!r})"


class SentinelServer(RedisServer):
    """One ``redis-server --sentinel`` watching ``master`` as ``service``.

    Quick to act: the master is down after ``down_after_ms`` without a reply.
    Sentinel rewrites its config file, so each has its own in its directory.
    """

    def __init__(self, service: str, master: RedisServer, *, down_after_ms: int = 1000) -> None:
        super().__init__()
        self.service = service
        self.master = master
        self.down_after_ms = down_after_ms

    def _config_file(self) -> list[str]:
        conf = self.dir / "sentinel.conf"
        if not conf.exists():
            conf.write_text(
                f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.service} 4000\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
        return [str(conf), "--sentinel"]

    def master_address(self) -> tuple[str, int]:
        with self.client() as conn:
            host, port = conn.sentinel_get_master_addr_by_name(self.service)
        return str(host), int(port)


class _Servers:
    """Several servers started and closed together (a ``with`` block).

    Subclasses set ``servers`` and write :meth:`start`; :meth:`close` closes
    every server, also when :meth:`start` fails halfway.
    """

    servers: list[RedisServer]

    def start(self) -> None:
        raise NotImplementedError

    def server_at(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    @staticmethod
    def _wait(check: Any, what: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RedisSentinels(_Servers):
    """A master, ``replicas`` replicas and three sentinels: Redis as Sentinel runs it.

    ``url`` is tenure's ``redis+sentinel://`` URL of the service. The servers
    have no persistence unless ``persistence=True``. :meth:`failover` asks a
    sentinel to promote a replica (``SENTINEL FAILOVER``) and waits until every
    sentinel names the new master and it accepts writes.
    """

    def __init__(
        self, *, service: str = "tenure", replicas: int = 1, persistence: bool = False
    ) -> None:
        self.service = service
        self.servers = [RedisServer(persistence=persistence) for _ in range(1 + replicas)]
        self.sentinels: list[SentinelServer] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"

    @property
    def master(self) -> RedisServer:
        return self.server_at(self.sentinels[0].master_address()[1])

    def start(self) -> None:
        first, *rest = self.servers
        for server in self.servers:
            server.start()
        for replica in rest:
            replica.replicate(first)
        self.sentinels = [SentinelServer(self.service, first) for _ in range(3)]
        for sentinel in self.sentinels:
            sentinel.start()
        # Every sentinel knows the replicas (from the master's INFO) and its peers.
        self._wait(self._sentinels_ready, "sentinels to discover the set")

    def _sentinels_ready(self) -> bool:
        for sentinel in self.sentinels:
            with sentinel.client() as conn:
                state = conn.sentinel_master(self.service)  # parsed by redis-py
            if int(state["num-slaves"]) < len(self.servers) - 1:
                return False
            if int(state["num-other-sentinels"]) < len(self.sentinels) - 1:
                return False
        return True

    def failover(self, *, kill: bool = False, timeout: float = 20.0) -> RedisServer:
        """Promote a replica through Sentinel; returns the new master once it takes writes.

        ``kill=True`` kills the master (SIGKILL) and lets the sentinels notice
        (``down_after_ms``), agree and promote, as on a crash. Otherwise a
        sentinel is told to fail over (``SENTINEL FAILOVER``) while the old master
        still runs: until the sentinels turn it into a replica (at their next
        look at it, within seconds), it still takes writes from clients that
        are connected to it.
        """
        old = self.master
        if kill:
            old.kill()
        else:
            self.sentinels[0].command("SENTINEL", "FAILOVER", self.service)

        def done() -> bool:
            ports = {s.master_address()[1] for s in self.sentinels if s.running}
            if len(ports) != 1 or ports == {old.port}:
                return False
            new = self.server_at(ports.pop())
            return bool(new.command("INFO", "replication").get("role") == "master")

        self._wait(done, "the failover", timeout)
        return self.master

    def close(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            server.close()


class ClusterServers(_Servers):
    """A Redis Cluster of ``masters`` primaries, each with ``replicas`` replicas,
    made with ``redis-cli --cluster create``: ``url`` is tenure's
    ``redis+cluster://`` URL (its startup nodes are every server).
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 0,
        persistence: bool = False,
        node_timeout_ms: int = 2000,
    ) -> None:
        args = ["--cluster-enabled", "yes", "--cluster-node-timeout", str(node_timeout_ms)]
        self.replicas = replicas
        self.servers = [
            RedisServer(persistence=persistence, args=args) for _ in range(masters * (1 + replicas))
        ]
        for server in self.servers:
            server.port = self._cluster_port()

    @staticmethod
    def _cluster_port() -> int:
        """A free port whose cluster bus port (+10000) is free too (and exists)."""
        while True:
            port = free_port()
            if port > 55535:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    def start(self, timeout: float = 20.0) -> None:
        for server in self.servers:
            server.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed (it comes with redis-server)")
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-yes"]
            + (["--cluster-replicas", str(self.replicas)] if self.replicas else []),
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        self._wait(lambda: all(self._ok(s) for s in self.servers), "cluster_state:ok", timeout)
        if self.replicas:
            self._wait(self._replicas_synced, "every replica to sync", timeout)

    def _replicas_synced(self) -> bool:
        infos = [s.command("INFO", "replication") for s in self.servers]
        synced = [i for i in infos if i.get("role") == "slave"]
        return len(synced) == len(self.servers) - len(self.servers) // (1 + self.replicas) and all(
            i.get("master_link_status") == "up" for i in synced
        )

    def replica_of(self, primary: RedisServer) -> RedisServer:
        """A replica of ``primary`` (by its own ``INFO replication``)."""
        for server in self.servers:
            if server is primary or not server.running:
                continue
            info = server.command("INFO", "replication")
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary.port:
                return server
        raise RuntimeError(f"no replica of the node on port {primary.port}")

    def primaries(self) -> list[RedisServer]:
        """The running servers that are primaries now."""
        return [
            s
            for s in self.servers
            if s.running and s.command("INFO", "replication").get("role") == "master"
        ]

    @staticmethod
    def _ok(server: RedisServer) -> bool:
        info = server.command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text

    def node_of(self, key: bytes) -> RedisServer:
        """The server that holds ``key``'s slot now (as the first running server sees it)."""
        slot = key_slot(key)
        first = next(s for s in self.servers if s.running)
        for start, end, (_, port, *_), *_ in first.command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return self.server_at(int(port))
        raise RuntimeError(f"no node holds slot {slot}")
