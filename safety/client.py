"""One workload client: runs operations against a backend and records every one.

Run as a process (``python -m safety.client --config JSON``) by the runner, or as
an asyncio task in the runner's own process for the memory backend.

Outcome of a call: ``ok`` when it returned; ``fail`` only when it certainly had no
effect (the backend refused it before doing anything: ``InvalidArgument``,
``BackendClosed``); ``info`` (unknown) for everything else, timeouts and
``BackendUnavailable`` included, because the request may have been applied even
though the reply was lost. After an unknown outcome the client rebuilds its
backend (the connection may be out of step) and carries on: every lease call is
safe to retry.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tenure import AcquireResult, BackendClosed, InvalidArgument, LeaseRecord

from .history import HistoryWriter
from .store import FencedStore

__all__ = ["Client", "ClientConfig"]

MS = 1_000_000


@dataclass
class ClientConfig:
    name: str
    url: str
    workdir: str
    workload: str  # lease | counter
    seed: int
    ttl_ms: int
    slot: int
    t0_ns: int
    rotate_s: float
    deadline_ns: int
    op_timeout_s: float = 1.0
    mutant: str | None = None
    fencing: bool = True
    key_prefix: str = ""

    def key(self, now_ns: int) -> str:
        epoch = (now_ns - self.t0_ns) // int(self.rotate_s * 1e9)
        return f"{self.key_prefix}{self.workload}{self.slot}.{epoch}"


_METHODS = {
    "acquire": "acquire_lease",
    "renew": "renew_lease",
    "release": "release_lease",
    "transfer": "transfer_lease",
    "get": "get_lease",
}


class Client:
    """The lease or fenced-counter workload for one simulated worker."""

    def __init__(
        self,
        cfg: ClientConfig,
        open_backend: Callable[[], Any],
        *,
        gate: asyncio.Event | None = None,
    ) -> None:
        self.cfg = cfg
        self._open = open_backend
        self._backend: Any = None
        self._gate = gate
        self.rnd = random.Random(cfg.seed)
        self.hist = HistoryWriter(Path(cfg.workdir) / f"{cfg.name}.jsonl", cfg.name)
        self.store: FencedStore | None = None
        if cfg.workload == "counter":
            self.store = FencedStore(Path(cfg.workdir) / "counter.db", fencing=cfg.fencing)

    async def _pause_point(self) -> None:
        if self._gate is not None:
            await self._gate.wait()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self._pause_point()

    def _backend_now(self) -> Any:
        if self._backend is None:
            self._backend = self._open()
        return self._backend

    async def _reset_backend(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await backend.aclose()

    async def call(
        self, key: str, op: str, args: dict[str, Any], fn: Callable[[Any], Awaitable[Any]]
    ) -> tuple[str, Any]:
        """Run one lease operation and record it; returns (type, raw result)."""
        await self._pause_point()
        backend = self._backend_now()
        self.hist.event(key, op, "invoke", time.monotonic_ns(), args=args)
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a
            # cancellation (a kill) when the call completes at the same moment.
            async with asyncio.timeout(self.cfg.op_timeout_s):
                raw = await fn(backend)
        except (InvalidArgument, BackendClosed) as exc:
            self.hist.event(key, op, "fail", time.monotonic_ns(), result=repr(exc)[:200])
            return "fail", None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.hist.event(key, op, "info", time.monotonic_ns(), result=repr(exc)[:200])
            await self._reset_backend()
            # Back off, as a real worker would, instead of hammering a failing backend.
            await self.sleep(self.rnd.uniform(0.05, 0.15))
            return "info", None
        t = time.monotonic_ns()
        result: Any
        token: int | None = None
        if isinstance(raw, AcquireResult):
            result = {"acquired": raw.acquired, "owner": raw.owner}
            token = raw.token
        elif isinstance(raw, LeaseRecord):
            result = {"owner": raw.owner, "ttl_ms": raw.ttl_ms}
            token = raw.token
        else:
            result = raw
        self.hist.event(key, op, "ok", t, result=result, token=token)
        return "ok", raw

    async def lease(self, key: str, op: str, **args: Any) -> tuple[str, Any]:
        """Run lease operation ``op`` (acquire, renew, release, transfer, get) on ``key``."""
        method = _METHODS[op]
        params = tuple(args.values())
        return await self.call(key, op, args, lambda b: getattr(b, method)(key, *params))

    # -- the workloads ----------------------------------------------------------

    async def _wait_for_go(self) -> None:
        """The runner starts the clock once every client is up (``go`` holds the deadline)."""
        go = Path(self.cfg.workdir) / "go"
        while self.cfg.deadline_ns == 0:
            with contextlib.suppress(FileNotFoundError, ValueError):
                self.cfg.deadline_ns = int(go.read_text())
                break
            await asyncio.sleep(0.01)

    async def run(self) -> None:
        try:
            await self._wait_for_go()
            while time.monotonic_ns() < self.cfg.deadline_ns:
                if self.cfg.workload == "counter":
                    await self._counter_round()
                else:
                    await self._lease_round()
        finally:
            self.hist.close()
            if self.store is not None:
                self.store.close()
            await self._reset_backend()

    async def _acquire(self, key: str, owner: str) -> int | None:
        ttl = self.cfg.ttl_ms
        typ, res = await self.lease(key, "acquire", owner=owner, ttl_ms=ttl)
        if typ == "ok" and res.acquired:
            return int(res.token) if res.token is not None else -1
        if typ == "ok":
            # Denied: retry soon, as a worker routing its work would.
            await self.sleep(self.rnd.uniform(0.005, 0.03))
        return None

    async def _release(self, key: str, owner: str) -> None:
        await self.lease(key, "release", owner=owner)

    async def _lease_round(self) -> None:
        cfg, rnd = self.cfg, self.rnd
        ttl = cfg.ttl_ms
        key = cfg.key(time.monotonic_ns())
        owner = f"{cfg.name}"
        if await self._acquire(key, owner) is None:
            return
        hold_until = time.monotonic() + rnd.uniform(0, 2 * ttl / 1000)
        gen = 0
        while time.monotonic() < hold_until and time.monotonic_ns() < cfg.deadline_ns:
            if rnd.random() < 0.08:
                # A slow step that outlives the lease: the next renew must fail,
                # and the release after it must not disturb the successor.
                await self.sleep(rnd.uniform(1.2, 2.0) * ttl / 1000)
            else:
                await self.sleep(rnd.uniform(0.15, 0.33) * ttl / 1000)
            dice = rnd.random()
            if dice < 0.7:
                typ, res = await self.lease(key, "renew", owner=owner, ttl_ms=ttl)
                if typ == "ok" and res is False:
                    break  # lost; a worker still releases in its finally block
            elif dice < 0.85:
                await self.lease(key, "get")
            else:
                gen += 1
                new = f"{cfg.name}.{gen}"
                typ, res = await self.lease(
                    key, "transfer", from_owner=owner, to_owner=new, ttl_ms=ttl
                )
                if typ == "ok" and res is True:
                    owner = new
                    # The follow-up run learns its token with an idempotent re-acquire.
                    if await self._acquire(key, owner) is None:
                        break
                elif typ == "ok":
                    break
        if rnd.random() < 0.9:
            await self._release(key, owner)

    async def _counter_round(self) -> None:
        cfg, rnd = self.cfg, self.rnd
        key = cfg.key(time.monotonic_ns())
        owner = cfg.name
        token = await self._acquire(key, owner)
        if token is None:
            return
        assert self.store is not None
        store = self.store
        value = await self._store_op(key, "read", {"token": token}, lambda: store.read(key, token))
        if isinstance(value, int):
            # Work between read and write; now and then a pause that outlives
            # the lease (GC, swap, a stopped VM): the stale write fencing must stop.
            if rnd.random() < 0.1:
                await self.sleep(rnd.uniform(1.2, 2.0) * cfg.ttl_ms / 1000)
            else:
                await self.sleep(rnd.uniform(0.2, 0.5) * cfg.ttl_ms / 1000)
            await self._store_op(
                key,
                "write",
                {"token": token, "value": value + 1},
                lambda: "accepted" if store.write(key, value + 1, token) else "rejected",
            )
        await self._release(key, owner)

    async def _store_op(
        self, key: str, op: str, args: dict[str, Any], fn: Callable[[], Any]
    ) -> Any:
        await self._pause_point()
        self.hist.event(key, op, "invoke", time.monotonic_ns(), args=args)
        try:
            result = fn()
        except Exception as exc:
            self.hist.event(key, op, "info", time.monotonic_ns(), result=repr(exc)[:200])
            return None
        self.hist.event(
            key, op, "ok", time.monotonic_ns(), result="rejected" if result is None else result
        )
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m safety.client")
    parser.add_argument("--config", required=True, help="ClientConfig as JSON")
    ns = parser.parse_args(argv)
    cfg = ClientConfig(**json.loads(ns.config))
    from .mutants import open_backend

    client = Client(cfg, lambda: open_backend(cfg.url, cfg.mutant))
    asyncio.run(client.run())
    return 0


def config_json(cfg: ClientConfig) -> str:
    return json.dumps(asdict(cfg))


if __name__ == "__main__":
    sys.exit(main())
