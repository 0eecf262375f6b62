"""The fault injector: seeded, bounded, healed at the end.

Kinds (each enabled per backend by the runner):

- ``client-pause``: SIGSTOP a client for 1.5-3 TTLs, then SIGCONT (a GC pause, a
  stopped VM). At most a third of the clients are stopped at once.
- ``client-kill``: SIGKILL a client (no release); a fresh client takes its slot.
  On SQLite every client is a writer, so this is also "writer killed inside a
  transaction" whenever it lands in one.
- ``proxy-blackhole`` / ``proxy-reset`` / ``proxy-drop-reply``: the TCP proxy in
  front of the server, for 0.5-2 TTLs.
- ``redis-pause`` / ``redis-kill`` (kill + restart, data kept or lost depending on
  the configuration) / ``redis-client-kill`` (``CLIENT KILL TYPE normal``) /
  ``redis-script-flush``.
- ``pg-terminate`` (``pg_terminate_backend`` of the clients' sessions) /
  ``pg-pause-backend`` (SIGSTOP one client backend for 1-2 TTLs).

Every fault that is still active when the run ends is undone by :meth:`heal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .proxy import Proxy

__all__ = ["ClientPool", "FaultInjector", "ServerFaults"]


class ClientPool(Protocol):
    """The running clients, as processes or as tasks."""

    def running(self) -> list[str]: ...
    def stop(self, name: str) -> None: ...
    def cont(self, name: str) -> None: ...
    async def kill_and_replace(self, name: str) -> None: ...


@dataclass
class ServerFaults:
    """Server-side faults: name → (inject, undo or None, hold time in TTLs or None)."""

    actions: dict[
        str, tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]] | None]
    ] = field(default_factory=dict)


class FaultInjector:
    def __init__(
        self,
        rnd: random.Random,
        *,
        ttl_ms: int,
        clients: ClientPool,
        kinds: list[str],
        proxy: Proxy | None = None,
        server: ServerFaults | None = None,
        interval_s: tuple[float, float] = (0.1, 0.4),
        log: Path | None = None,
    ) -> None:
        self.rnd = rnd
        self.ttl = ttl_ms / 1000
        self.clients = clients
        self.kinds = kinds
        self.proxy = proxy
        self.server = server or ServerFaults()
        self.interval = interval_s
        self.counts: Counter[str] = Counter()
        self.kills: list[tuple[int, str]] = []  # (monotonic ns, victim)
        self._stopped: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._net_busy = False
        self._server_busy = False
        self._undo: list[Callable[[], Awaitable[None]]] = []
        # One line per fault: monotonic ns, kind, what happened (for a reader of
        # a failed run: which fault was active when the violation happened).
        self._log = log.open("a", buffering=1) if log is not None else None

    def _note(self, kind: str, what: str) -> None:
        if self._log is not None:
            self._log.write(f"{time.monotonic_ns()} {kind} {what}\n")

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self, until_ns: int) -> None:
        while time.monotonic_ns() < until_ns:
            await asyncio.sleep(self.rnd.uniform(*self.interval))
            if time.monotonic_ns() >= until_ns:
                break
            await self.inject(self.rnd.choice(self.kinds))

    async def inject(self, kind: str) -> None:
        rnd = self.rnd
        if kind == "client-pause":
            cands = [n for n in self.clients.running() if n not in self._stopped]
            if not cands or len(self._stopped) >= max(1, len(cands) // 3):
                return
            victim = rnd.choice(cands)
            self._stopped.add(victim)
            self.clients.stop(victim)
            self.counts[kind] += 1
            self._note(kind, victim)
            self._spawn(self._resume_later(victim, rnd.uniform(1.5, 3.0) * self.ttl))
        elif kind == "client-kill":
            cands = [n for n in self.clients.running() if n not in self._stopped]
            if not cands:
                return
            victim = rnd.choice(cands)
            self.kills.append((time.monotonic_ns(), victim))
            self.counts[kind] += 1
            self._note(kind, victim)
            await self.clients.kill_and_replace(victim)
        elif kind.startswith("proxy-"):
            if self.proxy is None or self._net_busy:
                return
            self._net_busy = True
            self.proxy.set_mode(kind.removeprefix("proxy-"))
            self.counts[kind] += 1
            self._note(kind, "on")
            self._spawn(self._heal_proxy_later(rnd.uniform(0.5, 2.0) * self.ttl))
        else:
            inject, undo = self.server.actions[kind]
            if self._server_busy:
                return
            self._server_busy = True
            self._note(kind, "start")
            try:
                await inject()
            except Exception as exc:
                # The fault could not be injected (e.g. no connection slot for the
                # admin command): count it apart, never as an injected fault.
                self._server_busy = False
                self.counts[f"{kind} (not injected: {type(exc).__name__})"] += 1
                self._note(kind, f"failed {type(exc).__name__}: {exc}".replace("\n", " "))
                return
            self.counts[kind] += 1
            self._note(kind, "done")
            if undo is None:
                self._server_busy = False
            else:
                self._undo.append(undo)
                self._spawn(self._undo_later(undo, rnd.uniform(1.0, 2.0) * self.ttl))

    async def _resume_later(self, name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        if name in self._stopped:
            self._stopped.discard(name)
            self.clients.cont(name)

    async def _heal_proxy_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if self.proxy is not None:
            self.proxy.set_mode("pass")
        self._net_busy = False

    async def _undo_later(self, undo: Callable[[], Awaitable[None]], delay: float) -> None:
        await asyncio.sleep(delay)
        if undo in self._undo:
            self._undo.remove(undo)
            await undo()
        self._server_busy = False

    async def heal(self) -> None:
        """Undo every active fault: resume clients and servers, open the network."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for name in list(self._stopped):
            with contextlib.suppress(Exception):
                self.clients.cont(name)
        self._stopped.clear()
        for undo in self._undo:
            await undo()
        self._undo.clear()
        if self.proxy is not None:
            self.proxy.set_mode("pass")
        self._note("heal", "all")
        if self._log is not None:
            self._log.close()
            self._log = None

    def summary(self) -> dict[str, Any]:
        return dict(sorted(self.counts.items()))
