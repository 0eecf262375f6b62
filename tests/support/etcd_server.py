"""Private ``etcd`` servers for tests: one node, or a cluster of three on loopback.

Tests never touch an etcd they did not start. :class:`EtcdCluster` starts
``size`` members on free 127.0.0.1 ports, each with its data in a temporary
directory, and waits until the cluster has a leader::

    with EtcdCluster(size=3, proxied=True) as cluster:
        url = cluster.url                      # etcd://127.0.0.1:p1,127.0.0.1:p2,...
        leader = cluster.leader()              # index of the current leader
        cluster.kill(leader); cluster.start(leader)   # SIGKILL, then the same member again
        cluster.pause(1); cluster.resume(1)    # SIGSTOP / SIGCONT
        cluster.restart_all()                  # every member killed, then started

With ``proxied=True`` every member advertises its peer address through a
:class:`safety.proxy.Proxy` (on an event loop of its own, in a thread), so
``cluster.partition(i)`` black-holes every peer connection made to member
``i``: what it sends over them (its appends and heartbeats, its votes and
forwarded proposals) is lost, and it cannot commit anything;
``cluster.heal(i)`` ends it.

:func:`shared_etcd` is one node per test process, started at first use and
killed at exit, for the contract suite and the tests parametrized over
backends (each test uses a prefix of its own).

The binary is ``etcd`` from ``$PATH`` (Debian's ``etcd-server``; ``scripts/setup``
installs it). If it is missing, starting raises ``RuntimeError``: tests
fail, they never skip.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from .redis_server import end_process, free_port

if TYPE_CHECKING:
    from safety.proxy import Proxy

__all__ = ["EtcdCluster", "shared_etcd"]

# Fast elections on loopback: a leader is replaced within about a second.
_HEARTBEAT_MS = 50
_ELECTION_MS = 500


def _binary() -> str:
    found = shutil.which("etcd")
    if found is None:
        raise RuntimeError(
            "etcd is not installed (apt-get install etcd-server; scripts/setup does it)"
        )
    return found


class EtcdCluster:
    """``size`` etcd members owned by a test (one by default)."""

    def __init__(
        self,
        size: int = 1,
        *,
        proxied: bool = False,
        tls: tuple[Path, Path, Path] | None = None,
        start_timeout: float = 20.0,
    ):
        """``tls``: (certificate, key, CA) files: clients then talk TLS (``etcds://``)."""
        self.size = size
        self.tls = tls
        self.proxied = proxied
        self.start_timeout = start_timeout
        self.client_ports = [free_port() for _ in range(size)]
        self.peer_ports = [free_port() for _ in range(size)]
        # What the members advertise to each other: a proxy's port when proxied.
        self.advertised_peer_ports = (
            [free_port() for _ in range(size)] if proxied else self.peer_ports
        )
        self.dir = Path(tempfile.mkdtemp(prefix="tenure-etcd-"))
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * size
        self._proxies: list[Proxy] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- addresses -----------------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.client_ports]

    @property
    def url(self) -> str:
        """``etcd://`` with every member's client address."""
        return "etcd://" + ",".join(self.endpoints)

    def member_url(self, index: int) -> str:
        return f"etcd://{self.endpoints[index]}"

    def _name(self, index: int) -> str:
        return f"m{index}"

    # -- life cycle ----------------------------------------------------------------

    def running(self, index: int) -> bool:
        proc = self.processes[index]
        return proc is not None and proc.poll() is None

    def _command(self, index: int) -> list[str]:
        initial = ",".join(
            f"{self._name(i)}=http://127.0.0.1:{self.advertised_peer_ports[i]}"
            for i in range(self.size)
        )
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://127.0.0.1:{self.client_ports[index]}"
        tls = (
            []
            if self.tls is None
            else ["--cert-file", str(self.tls[0]), "--key-file", str(self.tls[1])]
        )
        return [
            _binary(),
            *tls,
            "--name",
            self._name(index),
            "--data-dir",
            str(self.dir / self._name(index)),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            f"http://127.0.0.1:{self.peer_ports[index]}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{self.advertised_peer_ports[index]}",
            "--initial-cluster",
            initial,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            self.dir.name,
            "--heartbeat-interval",
            str(_HEARTBEAT_MS),
            "--election-timeout",
            str(_ELECTION_MS),
            "--logger",
            "zap",
            "--log-outputs",
            str(self.dir / f"{self._name(index)}.log"),
        ]

    def start(self, index: int | None = None, *, wait: bool = True) -> None:
        """Start member ``index`` (every member when ``None``) and wait for a leader."""
        indexes = range(self.size) if index is None else [index]
        for i in indexes:
            if self.running(i):
                raise RuntimeError(f"etcd member {i} is already running")
            self.processes[i] = subprocess.Popen(
                self._command(i),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        if wait:
            self.wait_ready()

    def _status(self, index: int, timeout: float = 1.0) -> dict[str, Any]:
        scheme = "https" if self.tls else "http"
        request = urllib.request.Request(
            f"{scheme}://{self.endpoints[index]}/v3/maintenance/status", data=b"{}", method="POST"
        )
        context = None if self.tls is None else ssl.create_default_context(cafile=self.tls[2])
        with urllib.request.urlopen(request, timeout=timeout, context=context) as reply:
            status: dict[str, Any] = json.loads(reply.read())
        return status

    def leader(self, *, timeout: float = 10.0, among: list[int] | None = None) -> int:
        """The index of the leader that the running members (or ``among``) agree on."""
        deadline = time.monotonic() + timeout
        ids: dict[str, int] = {}
        while True:
            seen: set[int] = set()
            for i in among if among is not None else range(self.size):
                if not self.running(i):
                    continue
                with contextlib.suppress(OSError, ValueError):
                    status = self._status(i)
                    ids[status["header"]["member_id"]] = i
                    if str(status.get("leader", "0")) != "0":
                        seen.add(int(status["leader"]))
            if len(seen) == 1:
                leader_id = str(seen.pop())
                if leader_id in ids and (among is None or ids[leader_id] in among):
                    return ids[leader_id]
            if time.monotonic() > deadline:
                raise RuntimeError(f"the etcd members agree on no leader: {self.log_tail()}")
            time.sleep(0.05)

    def wait_ready(self) -> None:
        """Wait until every running member answers and they agree on a leader."""
        deadline = time.monotonic() + self.start_timeout
        for i in range(self.size):
            while self.running(i):
                try:
                    self._status(i)
                    break
                except (OSError, ValueError):
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"etcd member {i} did not start: {self.log_tail(i)}"
                        ) from None
                    time.sleep(0.05)
            proc = self.processes[i]
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"etcd member {i} exited: {self.log_tail(i)}")
        self.leader(timeout=max(1.0, deadline - time.monotonic()))

    def log_tail(self, index: int = 0, size: int = 1500) -> str:
        path = self.dir / f"{self._name(index)}.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else "(no log)"

    def kill(self, index: int) -> None:
        """SIGKILL member ``index``: a crash (its data directory stays)."""
        self._signal_and_wait(index, signal.SIGKILL)

    def stop(self, index: int) -> None:
        self._signal_and_wait(index, signal.SIGTERM)

    def _signal_and_wait(self, index: int, sig: signal.Signals) -> None:
        end_process(self.processes[index], sig)
        self.processes[index] = None

    def pause(self, index: int) -> None:
        """Freeze member ``index`` (SIGSTOP)."""
        proc = self.processes[index]
        assert proc is not None, "not running"
        proc.send_signal(signal.SIGSTOP)

    def resume(self, index: int) -> None:
        proc = self.processes[index]
        assert proc is not None, "not running"
        proc.send_signal(signal.SIGCONT)

    def restart_all(self) -> None:
        """Kill every member at once, then start them all again on their data."""
        for i in range(self.size):
            self.kill(i)
        self.start()

    # -- peer proxies ----------------------------------------------------------------

    def _start_proxies(self) -> None:
        """The peer proxies, on an event loop of their own in a thread, so that
        the blocking calls of this class (and of tests) never stall them."""
        from safety.proxy import Proxy

        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="etcd-peer-proxies", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread

        async def start() -> list[Proxy]:
            return [
                await Proxy(
                    "127.0.0.1", self.peer_ports[i], listen_port=self.advertised_peer_ports[i]
                ).start()
                for i in range(self.size)
            ]

        self._proxies = asyncio.run_coroutine_threadsafe(start(), loop).result(10)

    def _in_proxy_loop(self, work: Callable[[], None]) -> None:
        assert self._loop is not None, "the cluster is not proxied"

        async def run() -> None:
            work()

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def partition(self, index: int) -> None:
        """Cut member ``index`` off from the others (its peer proxy black-holes)."""
        self._in_proxy_loop(lambda: self._proxies[index].set_mode("blackhole"))

    def heal(self, index: int) -> None:
        self._in_proxy_loop(lambda: self._proxies[index].set_mode("pass"))

    def _stop_proxies(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return

        async def stop() -> None:
            for proxy in self._proxies:
                await proxy.aclose()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()
        self._proxies.clear()

    # -- context -------------------------------------------------------------------

    def close(self) -> None:
        """Kill every member, stop the proxies and remove the data directory."""
        for i in range(self.size):
            self.kill(i)
        self._stop_proxies()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            if self.proxied:
                self._start_proxies()
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

    def __repr__(self) -> str:
        up = sum(self.running(i) for i in range(self.size))
        return f"EtcdCluster(size={self.size}, running={up}, dir={str(self.dir)!r})"


_shared: EtcdCluster | None = None


def shared_etcd() -> EtcdCluster:
    """One etcd node for this test process, started at first use and killed at exit."""
    global _shared
    if _shared is None:
        cluster = EtcdCluster()
        cluster.start()
        owner = os.getpid()
        # A forked child (a test's worker process) must not kill its parent's server.
        atexit.register(lambda: cluster.close() if os.getpid() == owner else None)
        _shared = cluster
    return _shared
