"""Run a workload with faults against one backend, then check the history.

A run: start the backend's server (our own, on a free loopback port) behind the
fault proxy, start the clients, inject faults until the deadline, heal, let the
clients finish, sweep every key with an acquire (P6: after healing every key can
be taken), read the fenced counter, and run every checker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import worker_env
from .checker import CheckConfig, Report, check_all
from .client import Client, ClientConfig, config_json
from .faults import FaultInjector, ServerFaults
from .history import INF, Op, group_by_key, load_dir
from .mutants import open_backend
from .proxy import Proxy
from .store import FencedStore

__all__ = ["RunConfig", "RunResult", "run"]

ROOT = Path(__file__).resolve().parent.parent

CLIENT_FAULTS = ["client-pause", "client-pause", "client-kill"]
PROXY_FAULTS = ["proxy-blackhole", "proxy-reset", "proxy-drop-reply"]


@dataclass
class RunConfig:
    backend: str  # one of safety.__main__.BACKENDS
    duration_s: float = 30.0
    seed: int = 1
    lease_clients: int = 12
    counter_clients: int = 4
    clients_per_key: int = 4
    ttl_ms: int = 300
    rotate_s: float = 3.0
    faults: bool = True
    mutant: str | None = None
    workdir: str | None = None
    op_timeout_s: float = 2.0
    check_budget: int = 200_000
    fault_kinds: list[str] | None = None  # None: every kind the backend supports
    failover_gap_s: float = 0.0  # Sentinel: no server fault this long after a failover


@dataclass
class RunResult:
    config: RunConfig
    report: Report
    operations: int
    clients: int
    keys: int
    faults: dict[str, int]
    takeover_ms: list[float]
    sweep_ok: bool
    sweep_failed: list[str]
    counter_final: int
    integrity: str | None
    workdir: str
    notes: list[str] = field(default_factory=list)
    # Acquires that returned: granted, refused as held by another owner, refused
    # by a quarantine (no owner named: the server may have lost leases).
    acquires: dict[str, int] = field(default_factory=dict)

    @property
    def grants(self) -> int:
        return self.acquires.get("granted", 0)

    @property
    def violations(self) -> int:
        return len(self.report.violations)

    def figure_line(self) -> str:
        r = self.report
        n = len(r.keys) or 1
        faults = sum(v for k, v in self.faults.items() if "not injected" not in k)
        kinds = ", ".join(f"{k} {v}" for k, v in self.faults.items()) or "none"
        p50, p99 = _pct(self.takeover_ms, 50), _pct(self.takeover_ms, 99)
        ttl = self.config.ttl_ms
        tk = (
            f"takeover p50/p99 = TTL {p50 - ttl:+.0f} / TTL {p99 - ttl:+.0f} ms "
            f"({len(self.takeover_ms)} kills of holders, TTL {ttl} ms)"
            if self.takeover_ms
            else "takeover: no holder was killed"
        )
        c = r.counter
        counter = (
            f"fenced counter {c.acknowledged} acknowledged = {c.final} final"
            + (f" (+{c.unknown} unknown)" if c.unknown else "")
            if c is not None and c.ok
            else (f"fenced counter {c.acknowledged} acknowledged vs {c.final} final" if c else "")
        )
        by_prop = {
            p: sum(1 for v in r.violations if v.prop == p) for p in ("P1", "P2", "P3", "P4", "P5")
        }
        viol = (
            "0 violations of P1-P5"
            if not r.violations
            else "VIOLATIONS " + ", ".join(f"{p}: {k}" for p, k in by_prop.items() if k)
        )
        where = (
            " (one process, clients as asyncio tasks)" if self.config.backend == "memory" else ""
        )
        return (
            f"{self.config.backend}: {self.operations} operations, {self.clients} client "
            f"{'tasks' if self.config.backend == 'memory' else 'processes'}{where}, {self.keys} keys, "
            f"{faults} faults ({kinds}), {viol}; "
            f"{100 * r.passed / n:.1f}% of per-key histories fully checked, "
            f"{100 * r.unknown / n:.1f}% unknown; {counter}; {tk}; "
            f"acquire sweep {'ok' if self.sweep_ok else 'FAILED'}; "
            f"acquires: {self.grants} granted, {self.acquires.get('held', 0)} refused as held, "
            f"{self.acquires.get('quarantine', 0)} refused by a quarantine"
            + (f"; SQLite integrity_check {self.integrity}" if self.integrity else "")
        )


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


# -- clients as processes or as tasks ----------------------------------------------


class ProcessPool:
    def __init__(self, make_cfg: Callable[[str, str, int], ClientConfig]) -> None:
        self._make = make_cfg
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.slots: dict[str, tuple[str, int]] = {}
        self.started = 0
        self._gen = 0

    def spawn(self, workload: str, slot: int) -> str:
        self._gen += 1
        name = f"{workload[0]}{slot}-{self._gen}"
        cfg = self._make(name, workload, slot)
        env = worker_env()
        with (Path(cfg.workdir) / f"{name}.stderr").open("wb") as err:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "safety.client", "--config", config_json(cfg)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stderr=err,
            )
        self.slots[name] = (workload, slot)
        self.started += 1
        return name

    def running(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def stop(self, name: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.procs[name].send_signal(signal.SIGSTOP)

    def cont(self, name: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.procs[name].send_signal(signal.SIGCONT)

    async def kill_and_replace(self, name: str) -> None:
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
        self.spawn(*self.slots[name])

    async def wait_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            left = max(0.1, deadline - time.monotonic())
            try:
                await asyncio.to_thread(proc.wait, left)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)


class _Shared:
    """One shared in-process backend handed to every task; closing it is a no-op."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def aclose(self) -> None:
        return None


class TaskPool:
    """Memory backend: clients are tasks in this process; pause = a closed gate."""

    def __init__(self, make_cfg: Callable[[str, str, int], ClientConfig], backend: Any) -> None:
        self._make = make_cfg
        self._backend = _Shared(backend)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.slots: dict[str, tuple[str, int]] = {}
        self.started = 0
        self._gen = 0

    def spawn(self, workload: str, slot: int) -> str:
        self._gen += 1
        name = f"{workload[0]}{slot}-{self._gen}"
        gate = asyncio.Event()
        gate.set()
        client = Client(self._make(name, workload, slot), lambda: self._backend, gate=gate)
        self.tasks[name] = asyncio.ensure_future(client.run())
        self.gates[name] = gate
        self.slots[name] = (workload, slot)
        self.started += 1
        return name

    def running(self) -> list[str]:
        return [n for n, t in self.tasks.items() if not t.done()]

    def stop(self, name: str) -> None:
        self.gates[name].clear()

    def cont(self, name: str) -> None:
        self.gates[name].set()

    async def kill_and_replace(self, name: str) -> None:
        task = self.tasks[name]
        while not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=0.05)
        self.spawn(*self.slots[name])

    async def wait_all(self, timeout: float) -> None:
        for g in self.gates.values():
            g.set()
        _, pending = await asyncio.wait(list(self.tasks.values()), timeout=timeout)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


# -- backends ---------------------------------------------------------------------


class Env:
    """A backend under test: its URL, its server faults, and its clean-up."""

    url = ""
    server_faults: ServerFaults | None = None
    proxy: Proxy | None = None
    kinds: list[str] = CLIENT_FAULTS
    max_ttl_s = 0.0  # extra wait for the acquire sweep (quarantine after state loss)

    def __init__(self) -> None:
        # (start, end) monotonic ns of restarts that lost every lease
        self.state_loss: list[tuple[int, int]] = []

    async def start(self, workdir: Path, label: str) -> None: ...

    async def close(self) -> None:
        if self.proxy is not None:
            await self.proxy.aclose()

    def integrity(self) -> str | None:
        return None


class SqliteEnv(Env):
    async def start(self, workdir: Path, label: str) -> None:
        self.path = workdir / "leases.db"
        self.url = f"sqlite:///{self.path}?busy_timeout_ms=2000"

    def integrity(self) -> str | None:
        db = sqlite3.connect(self.path)
        try:
            return str(db.execute("PRAGMA integrity_check").fetchone()[0])
        finally:
            db.close()


class RedisEnv(Env):
    """One Redis behind the fault proxy.

    ``clock=True`` runs it under ``clockshift.c`` and adds two faults that are
    not in the default set (ask for them with ``fault_kinds``):
    ``redis-clock-back`` steps the server's wall clock back 1 s (leases last
    longer in real time, never shorter; tokens keep increasing through their
    counters) and ``redis-clock-forward`` steps it 1 s forward, past every TTL
    of the run: every live lease ends at once, so a second owner is granted
    while the first still holds its lease. That is not detected (the class
    docstring of the Redis backend says so); P1 is expected to break, fencing
    (P4) must hold.
    """

    def __init__(self, persistence: bool, *, clock: bool = False) -> None:
        super().__init__()
        self.persistence = persistence
        self.clock = clock

    async def start(self, workdir: Path, label: str) -> None:
        from tests.support.redis_server import RedisServer

        self.server = RedisServer(persistence=self.persistence, shifted_clock=self.clock)
        await asyncio.to_thread(self.server.start)
        self.proxy = await Proxy("127.0.0.1", self.server.port).start()
        self.url = (
            f"redis://127.0.0.1:{self.proxy.port}/0?prefix={label}:&max_ttl_ms=2000"
            "&socket_timeout=1.5&socket_connect_timeout=1.5"
        )
        self.max_ttl_s = 4.0
        srv = self.server

        async def pause() -> None:
            srv.pause()

        async def resume() -> None:
            srv.resume()

        async def kill_restart() -> None:
            start = time.monotonic_ns()
            await asyncio.to_thread(srv.restart, keep_data=self.persistence)
            if not self.persistence:
                self.state_loss.append((start, time.monotonic_ns()))

        async def client_kill() -> None:
            await asyncio.to_thread(srv.command, "CLIENT", "KILL", "TYPE", "normal")

        async def script_flush() -> None:
            await asyncio.to_thread(srv.command, "SCRIPT", "FLUSH")

        async def clock_back() -> None:
            srv.step_clock(-1.0)

        async def clock_forward() -> None:
            srv.step_clock(1.0)

        actions: dict[str, Any] = {
            "redis-pause": (pause, resume),
            "redis-kill-restart": (kill_restart, None),
            "redis-client-kill": (client_kill, None),
            "redis-script-flush": (script_flush, None),
        }
        if self.clock:
            actions["redis-clock-back"] = (clock_back, None)
            actions["redis-clock-forward"] = (clock_forward, None)
        self.server_faults = ServerFaults(actions)
        self.kinds = [
            *CLIENT_FAULTS,
            *CLIENT_FAULTS,
            *PROXY_FAULTS,
            "redis-pause",
            "redis-kill-restart",
            "redis-client-kill",
            "redis-script-flush",
        ]

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self.server.close)


class RedisSentinelEnv(Env):
    """Redis run by Sentinel: a master, a replica, three sentinels, no persistence.

    ``min_replicas=1`` (the ``redis-sentinel-min-replicas`` backend) has the
    clients' backend ``WAIT`` for the replica after every grant, transfer and
    renewal. ``gap_s`` keeps other server faults out for that long after a
    failover (the new replica has time to sync and grants to happen).

    ``sentinel-failover`` kills the master (SIGKILL), waits until the sentinels
    have promoted the replica, then starts the dead server again, empty, as the
    new master's replica (so the next failover has one). Replication is
    asynchronous, so a failover may lose the last grants: like a restart without
    persistence, it is given to the model as a window in which leases may
    vanish; P1 gets no allowance (the promoted replica's epoch check must hold
    it with a quarantine).
    """

    def __init__(self, *, min_replicas: int = 0, gap_s: float = 0.0) -> None:
        super().__init__()
        self.min_replicas = min_replicas
        self.gap_s = gap_s

    async def start(self, workdir: Path, label: str) -> None:
        from tests.support.redis_server import RedisSentinels

        self.group = RedisSentinels()
        await asyncio.to_thread(self.group.start)
        self.url = (
            f"{self.group.url}?prefix={label}:&max_ttl_ms=2000"
            "&socket_timeout=1.5&socket_connect_timeout=1.5"
            + (f"&min_replicas={self.min_replicas}" if self.min_replicas else "")
        )
        self.max_ttl_s = 8.0
        group = self.group

        def failover() -> None:
            old = group.master
            new = group.failover(kill=True)
            old.restart(keep_data=False)
            old.replicate(new)

        async def sentinel_failover() -> None:
            start = time.monotonic_ns()
            try:
                await asyncio.to_thread(failover)
            finally:
                # The master was killed even if the failover then failed: the
                # writes it had not replicated may be gone either way.
                self.state_loss.append((start, time.monotonic_ns()))

        async def gap() -> None:
            await asyncio.sleep(self.gap_s)

        self.server_faults = ServerFaults(
            {"sentinel-failover": (sentinel_failover, gap if self.gap_s else None)}
        )
        self.kinds = [*CLIENT_FAULTS, *CLIENT_FAULTS, "sentinel-failover"]

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self.group.close)


class RedisClusterEnv(Env):
    """A Redis Cluster of three primaries and three replicas, no persistence.

    Faults (one server fault at a time, like the others):

    - ``cluster-failover``: SIGKILL a primary, wait until its replica is promoted
      and every node says ``cluster_state:ok``, then start the dead node again
      (empty, with its ``nodes.conf``: it rejoins as the new primary's replica).
      Asynchronous replication may lose the last writes: a state-loss window.
    - ``cluster-manual-failover``: ``CLUSTER FAILOVER`` on a replica (its primary
      stops writes until the replica caught up: nothing lost, unless it fails).
    - ``cluster-pause``: SIGSTOP a node (primary or replica) for 1-2 TTLs.
    - ``cluster-migrate``: move a slot holding lease keys to another primary
      (``SETSLOT IMPORTING``/``MIGRATING``, ``MIGRATE`` of its keys, ``SETSLOT
      NODE``), as ``redis-cli --cluster reshard`` does.
    - ``redis-client-kill`` (``CLIENT KILL TYPE normal``) and
      ``redis-script-flush`` on every primary.

    A fault that fails half-way is recorded as a state-loss window too (a
    failover that did not complete, a migration that stopped with keys on two
    nodes). P1 gets no allowance.
    """

    def __init__(self, rnd: random.Random) -> None:
        super().__init__()
        self.rnd = rnd

    async def start(self, workdir: Path, label: str) -> None:
        from tests.support.redis_server import ClusterServers

        cluster = self.cluster = ClusterServers(masters=3, replicas=1)
        await asyncio.to_thread(cluster.__enter__)
        self.url = (
            f"{cluster.url}?prefix={label}:&max_ttl_ms=2000"
            "&socket_timeout=1.5&socket_connect_timeout=1.5"
        )
        self.max_ttl_s = 8.0
        pattern = f"{label}:{{*}}:*"
        paused: list[Any] = []

        def wait(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
            deadline = time.monotonic() + timeout
            while True:
                with contextlib.suppress(Exception):
                    if check():
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out waiting for {what}")
                time.sleep(0.05)

        def healthy() -> bool:
            return all(cluster._ok(s) for s in cluster.servers if s.running)

        def role(server: Any) -> str:
            return str(server.command("INFO", "replication").get("role"))

        def synced(server: Any) -> bool:
            info = server.command("INFO", "replication")
            return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")

        def restart_empty(server: Any) -> None:
            """Start a killed node again without its data but with its nodes.conf."""
            for entry in server.dir.iterdir():
                if entry.name.endswith((".rdb", ".aof")) or entry.name == "appendonlydir":
                    if entry.is_dir():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
            server.start()

        def kill_failover() -> None:
            old = self.rnd.choice(cluster.primaries())
            new = cluster.replica_of(old)
            old.kill()
            try:
                wait(lambda: role(new) == "master" and healthy(), "the replica's promotion")
            finally:
                restart_empty(old)
                wait(lambda: synced(old), "the old primary to rejoin as a replica")
                wait(healthy, "cluster_state:ok")

        def manual_failover() -> None:
            primary = self.rnd.choice(cluster.primaries())
            replica = cluster.replica_of(primary)
            replica.command("CLUSTER", "FAILOVER")
            wait(lambda: role(replica) == "master" and healthy(), "the manual failover", 15.0)
            wait(lambda: synced(primary), "the old primary to follow", 15.0)

        def migrate() -> None:
            from redis.crc import key_slot

            primaries = cluster.primaries()
            self.rnd.shuffle(primaries)
            for source in primaries:
                keys = source.command("SCAN", 0, "MATCH", pattern, "COUNT", 1000)[1]
                if keys:
                    break
            else:
                raise RuntimeError("no key of the run to migrate")
            # A slot with a lease in it if there is one (else a token or marker).
            leases = [k for k in keys if k.endswith(b":lease")]
            slot = key_slot(self.rnd.choice(leases or keys))
            target = self.rnd.choice([p for p in primaries if p is not source])
            source_id = source.command("CLUSTER", "MYID")
            target_id = target.command("CLUSTER", "MYID")
            target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            try:
                while found := source.command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                    source.command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *found)
            finally:
                for server in [
                    target,
                    source,
                    *(p for p in primaries if p not in (source, target)),
                ]:
                    server.command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
                wait(healthy, "cluster_state:ok")

        def recorded(action: Callable[[], None], *, loses: bool) -> Callable[[], Any]:
            async def go() -> None:
                start = time.monotonic_ns()
                ok = False
                try:
                    await asyncio.to_thread(action)
                    ok = True
                finally:
                    if loses or not ok:
                        self.state_loss.append((start, time.monotonic_ns()))

            return go

        async def pause() -> None:
            node = self.rnd.choice([s for s in cluster.servers if s.running])
            node.pause()
            paused.append(node)

        async def resume() -> None:
            while paused:
                with contextlib.suppress(Exception):
                    paused.pop().resume()

        def on_primaries(*command: str) -> Callable[[], None]:
            def go() -> None:
                for primary in cluster.primaries():
                    primary.command(*command)

            return go

        self.server_faults = ServerFaults(
            {
                "cluster-failover": (recorded(kill_failover, loses=True), None),
                "cluster-manual-failover": (recorded(manual_failover, loses=False), None),
                "cluster-pause": (pause, resume),
                "cluster-migrate": (recorded(migrate, loses=False), None),
                "redis-client-kill": (
                    recorded(on_primaries("CLIENT", "KILL", "TYPE", "normal"), loses=False),
                    None,
                ),
                "redis-script-flush": (
                    recorded(on_primaries("SCRIPT", "FLUSH"), loses=False),
                    None,
                ),
            }
        )
        self.kinds = [
            *CLIENT_FAULTS,
            *CLIENT_FAULTS,
            "cluster-failover",
            "cluster-manual-failover",
            "cluster-pause",
            "cluster-migrate",
            "redis-client-kill",
            "redis-script-flush",
        ]

    async def close(self) -> None:
        await super().close()
        for server in self.cluster.servers:
            with contextlib.suppress(Exception):
                server.resume()
        await asyncio.to_thread(self.cluster.close)


class PostgresEnv(Env):
    def __init__(self, rnd: random.Random) -> None:
        super().__init__()
        self.rnd = rnd

    async def start(self, workdir: Path, label: str) -> None:
        from tests.support.pg_server import PgServer

        self.server = PgServer()
        await asyncio.to_thread(self.server.start)
        self.proxy = await Proxy("127.0.0.1", self.server.port).start()
        app = f"tenure-safety-{label}"
        self.url = (
            f"postgresql://postgres@127.0.0.1:{self.proxy.port}/postgres?schema={label}"
            f"&connect_timeout=2&application_name={app}&pool_timeout=1"
            # One call at a time per client: a small pool keeps the server's
            # connection slots free for the harness's own fault commands.
            "&pool_min_size=1&pool_max_size=2"
        )
        srv = self.server
        paused: list[int] = []

        async def terminate() -> None:
            import psycopg

            def go() -> None:
                with psycopg.connect(srv.url, autocommit=True) as conn:
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = %s",
                        (app,),
                    )

            await asyncio.to_thread(go)

        async def pause_backend() -> None:
            pids = await asyncio.to_thread(srv.backend_pids)
            if pids:
                pid = self.rnd.choice(pids)
                srv.pause(pid)
                paused.append(pid)

        async def resume_backend() -> None:
            while paused:
                with contextlib.suppress(ProcessLookupError):
                    srv.resume(paused.pop())

        self.server_faults = ServerFaults(
            {"pg-terminate": (terminate, None), "pg-pause-backend": (pause_backend, resume_backend)}
        )
        self.kinds = [
            *CLIENT_FAULTS,
            *CLIENT_FAULTS,
            *PROXY_FAULTS,
            "pg-terminate",
            "pg-pause-backend",
        ]

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self.server.close)


class EtcdEnv(Env):
    """A 3-member etcd cluster: the fault proxy sits in front of member 0's
    client port (the clients know the other two directly), and the server
    faults hit the cluster: the leader killed and restarted, a member paused,
    the leader cut off from the others."""

    def __init__(self, rnd: random.Random) -> None:
        super().__init__()
        self.rnd = rnd

    async def start(self, workdir: Path, label: str) -> None:
        from tests.support.etcd_server import EtcdCluster

        cluster = self.cluster = EtcdCluster(size=3, proxied=True)
        await asyncio.to_thread(cluster.__enter__)
        self.proxy = await Proxy("127.0.0.1", cluster.client_ports[0]).start()
        members = ",".join([f"127.0.0.1:{self.proxy.port}", *cluster.endpoints[1:]])
        self.url = f"etcd://{members}?prefix={label}/&timeout=1.5"
        killed: list[int] = []
        paused: list[int] = []
        cut: list[int] = []

        async def leader_kill() -> None:
            leader = await asyncio.to_thread(cluster.leader)
            cluster.kill(leader)
            killed.append(leader)

        async def restart() -> None:
            while killed:
                await asyncio.to_thread(cluster.start, killed.pop())

        async def pause() -> None:
            member = self.rnd.randrange(cluster.size)
            cluster.pause(member)
            paused.append(member)

        async def resume() -> None:
            while paused:
                cluster.resume(paused.pop())

        async def partition() -> None:
            leader = await asyncio.to_thread(cluster.leader)
            await asyncio.to_thread(cluster.partition, leader)
            cut.append(leader)

        async def heal() -> None:
            while cut:
                await asyncio.to_thread(cluster.heal, cut.pop())

        self.server_faults = ServerFaults(
            {
                "etcd-leader-kill": (leader_kill, restart),
                "etcd-member-pause": (pause, resume),
                "etcd-leader-partition": (partition, heal),
            }
        )
        self.kinds = [
            *CLIENT_FAULTS,
            *CLIENT_FAULTS,
            *PROXY_FAULTS,
            "etcd-leader-kill",
            "etcd-member-pause",
            "etcd-leader-partition",
        ]

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self.cluster.close)


def _env(kind: str, rnd: random.Random, rc: RunConfig) -> Env:
    if kind == "sqlite":
        return SqliteEnv()
    clock = any(k.startswith("redis-clock-") for k in rc.fault_kinds or ())
    if kind == "redis":
        return RedisEnv(persistence=False, clock=clock)
    if kind == "redis-aof":
        return RedisEnv(persistence=True, clock=clock)
    if kind == "redis-sentinel":
        return RedisSentinelEnv(gap_s=rc.failover_gap_s)
    if kind == "redis-sentinel-min-replicas":
        return RedisSentinelEnv(min_replicas=1, gap_s=rc.failover_gap_s)
    if kind == "redis-cluster":
        return RedisClusterEnv(rnd)
    if kind == "postgres":
        return PostgresEnv(rnd)
    if kind == "etcd":
        return EtcdEnv(rnd)
    raise ValueError(f"unknown backend {kind!r}")


# -- the run ----------------------------------------------------------------------


def _takeovers(ops: list[Op], kills: list[tuple[int, str]], cfg: CheckConfig) -> list[float]:
    """For each killed client that held a lease: ms from the kill to the next grant."""
    by_key = group_by_key(ops)
    out: list[float] = []
    for t_kill, victim in kills:
        for key_ops in by_key.values():
            held_until = -INF
            for o in key_ops:
                if o.process != victim or o.inv > t_kill:
                    continue
                if o.type == "ok" and (
                    (o.op == "acquire" and o.result.get("acquired"))
                    or (o.op == "renew" and o.result is True)
                    or (o.op == "transfer" and o.result is True)
                ):
                    held_until = o.ret + cfg.ttl_hi(int(o.args["ttl_ms"]))
                elif o.op == "release" or (o.op == "renew" and o.result is False):
                    held_until = -INF
            if held_until < t_kill:
                continue
            nxt = [
                o.ret
                for o in key_ops
                if o.type == "ok"
                and o.op == "acquire"
                and o.result.get("acquired")
                and o.process not in (victim, "sweep")
                and o.inv > t_kill
            ]
            if nxt:
                out.append((min(nxt) - t_kill) / 1e6)
    return out


async def _sweep(
    url: str,
    open_: Callable[[], Any],
    workdir: Path,
    keys: list[str],
    ttl_ms: int,
    wait_s: float,
) -> list[str]:
    """Acquire every key once (recorded, so the checkers see these grants too)."""
    cfg = ClientConfig(
        name="sweep",
        url=url,
        workdir=str(workdir),
        workload="sweep",
        seed=0,
        ttl_ms=ttl_ms,
        slot=0,
        t0_ns=0,
        rotate_s=1,
        deadline_ns=0,
    )
    sweeper = Client(cfg, open_)
    failed = []
    try:
        for key in keys:
            deadline = time.monotonic() + wait_s
            while True:
                typ, res = await sweeper.lease(key, "acquire", owner="sweep", ttl_ms=ttl_ms)
                if typ == "ok" and res.acquired:
                    await sweeper.lease(key, "release", owner="sweep")
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    failed.append(key)
                    break
                # A quarantine says how long it lasts: asking sooner is wasted.
                retry = getattr(res, "retry_after_ms", None) if typ == "ok" else None
                await asyncio.sleep(min(left, max(0.05, (retry or 0) / 1000)))
    finally:
        sweeper.hist.close()
        await sweeper._reset_backend()
    return failed


async def run(rc: RunConfig) -> RunResult:
    workdir = Path(rc.workdir or tempfile.mkdtemp(prefix=f"tenure-safety-{rc.backend}-"))
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    rnd = random.Random(rc.seed)
    label = f"safety{rc.seed}x{os.getpid()}"
    env: Env | None = None
    memory_backend: Any = None
    notes: list[str] = []
    t0 = time.monotonic_ns()
    deadline = 0  # known once every client is up; clients read it from workdir/go
    if rc.backend == "memory":
        memory_backend = open_backend("memory://", rc.mutant)
        url = "memory://"
        kinds = ["client-pause", "client-pause", "client-kill"]
    else:
        env = _env(rc.backend, rnd, rc)
        await env.start(workdir, label)
        url = env.url
        kinds = env.kinds

    def make_cfg(name: str, workload: str, slot: int) -> ClientConfig:
        return ClientConfig(
            name=name,
            url=url,
            workdir=str(workdir),
            workload=workload,
            seed=rnd.randrange(2**32),
            ttl_ms=rc.ttl_ms,
            slot=slot,
            t0_ns=t0,
            rotate_s=rc.rotate_s,
            deadline_ns=deadline,
            op_timeout_s=rc.op_timeout_s,
            mutant=rc.mutant,
            fencing=rc.mutant != "no-fencing",
        )

    pool: ProcessPool | TaskPool
    pool = (
        TaskPool(make_cfg, memory_backend) if memory_backend is not None else ProcessPool(make_cfg)
    )
    injector: FaultInjector | None = None
    try:
        per = rc.clients_per_key
        for i in range(rc.lease_clients):
            pool.spawn("lease", i // per)
        for i in range(rc.counter_clients):
            pool.spawn("counter", i // per)
        # Process start-up takes seconds on a loaded machine: start the clock
        # (and the key rotation) only once every client has opened its history.
        up_by = time.monotonic() + 120
        while not all((workdir / f"{n}.jsonl").exists() for n in pool.running()):
            if time.monotonic() > up_by:
                raise RuntimeError("clients did not start within 120 s")
            await asyncio.sleep(0.05)
        deadline = time.monotonic_ns() + int(rc.duration_s * 1e9)
        (workdir / "go").write_text(str(deadline))
        if rc.faults:
            injector = FaultInjector(
                rnd,
                ttl_ms=rc.ttl_ms,
                clients=pool,
                kinds=rc.fault_kinds or kinds,
                proxy=env.proxy if env else None,
                server=env.server_faults if env else None,
                log=workdir / "faults.log",
            )
            await injector.run(deadline)
            await injector.heal()
        else:
            await asyncio.sleep(max(0.0, (deadline - time.monotonic_ns()) / 1e9))
        await pool.wait_all(timeout=rc.op_timeout_s + 3 * rc.ttl_ms / 1000 + 10)
        partial = load_dir(workdir)
        keys = sorted(group_by_key(partial))
        if memory_backend is not None:
            shared = memory_backend
            failed = await _sweep(
                "memory://",
                lambda: _Shared(shared),
                workdir,
                keys,
                rc.ttl_ms,
                3 * rc.ttl_ms / 1000 + 2,
            )
        else:
            wait_s = 3 * rc.ttl_ms / 1000 + (env.max_ttl_s if env else 0) + 5
            failed = await _sweep(url, lambda: open_backend(url), workdir, keys, rc.ttl_ms, wait_s)
        integrity = env.integrity() if env else None
    finally:
        if injector is not None:
            with contextlib.suppress(Exception):
                await injector.heal()
        if env is not None:
            await env.close()
        if memory_backend is not None:
            await memory_backend.aclose()
    store = FencedStore(workdir / "counter.db")
    final = store.total()
    store.close()
    ops = load_dir(workdir)
    # Faults are bounded: a client pause lasts at most 3 TTLs, a server stall 2 TTLs;
    # a lost request takes effect within those plus the client's timeout, or never.
    horizon = rc.op_timeout_s * 1000 + 5 * rc.ttl_ms + 1000
    cfg = CheckConfig(budget=rc.check_budget, info_horizon_ms=horizon)
    report = check_all(
        ops,
        cfg,
        counter_final=final if rc.counter_clients else None,
        state_loss=env.state_loss if env else (),
    )
    takeover = _takeovers(ops, injector.kills if injector else [], cfg)
    acquires = {"granted": 0, "held": 0, "quarantine": 0}
    for o in ops:
        if o.op == "acquire" and o.type == "ok" and o.process != "sweep":
            got = o.result
            acquires[
                "granted" if got["acquired"] else "held" if got.get("owner") else "quarantine"
            ] += 1
    result = RunResult(
        config=rc,
        report=report,
        operations=len(ops),
        clients=pool.started,
        keys=len(group_by_key(ops)),
        faults=injector.summary() if injector else {},
        takeover_ms=takeover,
        sweep_ok=not failed,
        sweep_failed=failed,
        counter_final=final,
        integrity=integrity,
        workdir=str(workdir),
        notes=notes,
        acquires=acquires,
    )
    (workdir / "result.json").write_text(
        json.dumps(
            {
                "config": asdict(rc),
                "figure": result.figure_line(),
                "violations": [v.describe() for v in report.violations[:50]],
            },
            indent=2,
        )
    )
    return result
