"""One worker process: thread runtimes that handle signals, and a sender that sends them.

``python -m safety.threads.worker --config JSON`` (the runner starts it). The
worker runs one :class:`tenure.ThreadRuntime` per namespace of its threads, on
one backend object opened from ``url``; the handler writes each signal to the
recording sink with its run's token (see :mod:`safety.threads.evidence`).

Until the deadline in ``<workdir>/go`` it sends signals to random threads, one
at a time, with ids it chooses (``<worker>.<n>``), retrying a failed send with
the same id (an unknown outcome stores nothing twice) and recording each
returned send. ``SIGUSR1`` makes it SIGKILL itself right after the next send
returned and was recorded (the "sender killed right after a send" fault). Then
it idles, its runtimes still sweeping, until ``<workdir>/exit`` appears.

The ``policies`` workload sends each signal under a policy drawn from
:data:`MIX`, hands a run's coalesced signals to the sink with it, records the
runtime's settlement events (``events-*.jsonl``), and ends its sending with one
``enqueue`` signal to every thread, which wakes what was persisted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import controls
from .evidence import Settled, Sink, Stored, StoredLog

__all__ = ["DEBOUNCE_S", "MIX", "WorkerConfig", "config_json", "main"]

logger = logging.getLogger("safety.threads.worker")

# The policies workload's mix (relative weights) and its debounce window: every
# policy, enqueue the most, as agent platforms' users send.
MIX: dict[str, int] = {
    "enqueue": 6,
    "coalesce": 3,
    "interrupt": 2,
    "rollback": 1,
    "reject": 2,
    "discard": 2,
    "persist": 2,
    "debounce": 2,
}
DEBOUNCE_S = 0.03
# The runtime events that settle a signal without its own run (evidence.Settled).
SETTLING = ("coalesced", "discarded", "interrupted")


@dataclass
class WorkerConfig:
    name: str
    url: str
    workdir: str
    seed: int
    ttl_ms: int
    threads: list[list[str]]  # [namespace, thread key]
    send_gap_ms: list[float] = field(default_factory=lambda: [5.0, 40.0])
    work_ms: list[float] = field(default_factory=lambda: [1.0, 15.0])
    control: str | None = None
    # Every n-th signal a worker sends is poison (0: none); see Stored.poison.
    poison_every: int = 0
    output: bool = False  # runtimes keep output: each handled signal appends an item
    # "runtime": the handler writes each signal to the sink; "langgraph": it runs a
    # graph on a fenced saver at ``checkpoints`` (safety.threads.graph), then writes it;
    # "policies": as "runtime", each signal sent under a policy drawn from MIX.
    workload: str = "runtime"
    checkpoints: str | None = None


def config_json(cfg: WorkerConfig) -> str:
    return json.dumps(asdict(cfg))


async def _cancelled_elsewhere() -> None:
    """Await a task someone else cancelled: its CancelledError, which tenure did not
    cause, comes out of the handler."""
    other = asyncio.ensure_future(asyncio.sleep(10))
    await asyncio.sleep(0)
    other.cancel()
    await other


class Worker:
    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.workdir = Path(cfg.workdir)
        self.rnd = random.Random(cfg.seed)
        self.sink = Sink(self.workdir / "sink.db", cfg.name)
        self.log = StoredLog(self.workdir / f"stored-{cfg.name}.jsonl")
        self.handed = StoredLog(self.workdir / f"handed-{cfg.name}.jsonl")
        self.events = StoredLog(self.workdir / f"events-{cfg.name}.jsonl")
        self.kill_after_send = False
        self.runtimes: dict[str, Any] = {}
        self.backend: Any = None
        self.stack = contextlib.AsyncExitStack()

    def _handler(self, namespace: str) -> Any:
        from tenure import BackendUnavailable, LeaseLost, ThreadRun

        async def append(run: ThreadRun, data: Any) -> None:
            # What a careful handler does: an outage is waited out while the lease
            # is held (a loss raises LeaseLost: Fenced, or the renewer's).
            while True:
                try:
                    await run.append(data)
                    return
                except BackendUnavailable:
                    run.ensure_held()
                    await asyncio.sleep(0.05)

        lo, hi = self.cfg.work_ms

        async def handle(run: ThreadRun) -> None:
            async for sig in run.signals():
                if isinstance(sig.payload, dict) and sig.payload.get("poison"):
                    self.handed.line({"signal_id": sig.id, "attempt": sig.attempt})
                    await _cancelled_elsewhere()
                await asyncio.sleep(self.rnd.uniform(lo, hi) / 1000)
                try:
                    # Before the sink's write, which refuses a stale run: the output's
                    # own fence must be what keeps a stale item out.
                    if self.cfg.output:
                        await append(run, {"signal": sig.id, "attempt": sig.attempt})
                    carried = tuple(c.id for c in sig.coalesced)
                    await self.sink.write(run, namespace, sig.id, sig.attempt, carried)
                except LeaseLost:  # Fenced too
                    return

        return handle

    def _on_event(self, namespace: str) -> Any:
        """Record each settlement as the runtime emits it: before the signal's ack."""
        if self.cfg.workload != "policies":
            return None

        def on_event(event: Any) -> None:
            if event.kind in SETTLING and event.signal_id is not None:
                self.events.record(
                    Settled(
                        event.kind,
                        namespace,
                        event.thread_key,
                        event.signal_id,
                        event.run_id,
                        event.detail,
                        self.cfg.name,
                        time.monotonic_ns(),
                    )
                )

        return on_event

    def _policy(self) -> tuple[str, Any]:
        """A policy drawn from MIX: its name, and what ``send_signal`` takes."""
        if self.cfg.workload != "policies":
            return "enqueue", None
        from tenure import Debounce

        name = self.rnd.choices(list(MIX), weights=list(MIX.values()))[0]
        return name, Debounce(DEBOUNCE_S) if name == "debounce" else name

    async def _handlers(self, namespaces: list[str]) -> dict[str, Any]:
        if self.cfg.workload in ("runtime", "policies"):
            return {ns: self._handler(ns) for ns in namespaces}
        from . import graph

        assert self.cfg.checkpoints is not None, "the langgraph workload needs checkpoints"
        saver = await self.stack.enter_async_context(graph.open_saver(self.cfg.checkpoints))
        agent = graph.build_graph(saver, self.rnd, self.cfg.work_ms)
        return {
            ns: graph.recording_handler(graph.RecordingGraph(agent, self.sink, ns, self.cfg.name))
            for ns in namespaces
        }

    async def start(self) -> None:
        import tenure
        from tenure.runtime import Retention

        self.backend = tenure.from_url(self.cfg.url)
        controls.apply_to_backend(self.cfg.control, self.backend)
        namespaces = sorted({ns for ns, _ in self.cfg.threads})
        handlers = await self._handlers(namespaces)
        for i, ns in enumerate(namespaces):
            rt = tenure.ThreadRuntime(
                self.backend,
                handlers[ns],
                ttl_ms=self.cfg.ttl_ms,
                process_id=f"{self.cfg.name}.{i}",
                namespace=ns,
                # Every item kept for the run's check (the default keeps 10,000).
                output=Retention(max_items=10_000_000) if self.cfg.output else False,
                on_event=self._on_event(ns),
            )
            await rt.start()
            self.runtimes[ns] = rt

    async def _deadline(self) -> int:
        go = self.workdir / "go"
        while True:
            with contextlib.suppress(FileNotFoundError, ValueError):
                return int(go.read_text())
            await asyncio.sleep(0.02)

    async def send_all(self, deadline_ns: int) -> None:
        seq: Counter[tuple[str, str]] = Counter()
        lo, hi = self.cfg.send_gap_ms
        give_up_ns = deadline_ns + 5_000_000_000
        n = 0
        while time.monotonic_ns() < deadline_ns:
            ns, key = self.rnd.choice(self.cfg.threads)
            n += 1
            poison = self.cfg.poison_every > 0 and n % self.cfg.poison_every == 0
            if not await self._send(seq, n, ns, key, self._policy(), poison, give_up_ns):
                return
            await asyncio.sleep(self.rnd.uniform(lo, hi) / 1000)
        if self.cfg.workload == "policies":
            # The wake round: a waking signal behind whatever this worker persisted.
            for ns, key in self.cfg.threads:
                n += 1
                if not await self._send(seq, n, ns, key, ("enqueue", None), False, give_up_ns):
                    return

    async def _send(
        self,
        seq: Counter[tuple[str, str]],
        n: int,
        ns: str,
        key: str,
        policy: tuple[str, Any],
        poison: bool,
        give_up_ns: int,
    ) -> bool:
        """Send one signal until its outcome is known and record it; ``False``: gave up."""
        from tenure import TenureError

        seq[(ns, key)] += 1
        sid = f"{self.cfg.name}.{n}"
        payload = {"sid": sid, "sender": self.cfg.name, "seq": seq[(ns, key)], "poison": poison}
        name, arg = policy
        extra = {} if arg is None else {"policy": arg}
        outcome = None
        t0 = time.monotonic_ns()
        while outcome is None and time.monotonic_ns() < give_up_ns:
            try:
                result = await self.runtimes[ns].send_signal(key, payload, signal_id=sid, **extra)
                outcome = result.outcome
            except (TenureError, OSError) as exc:
                # Unknown outcome: the same id again stores nothing twice.
                logger.warning("send %s failed, retrying: %r", sid, exc)
                await asyncio.sleep(self.rnd.uniform(0.05, 0.2))
        if outcome is None:
            return False  # gave up: its outcome stays unknown, nothing is owed for it
        stored = Stored(
            sid, ns, key, self.cfg.name, seq[(ns, key)], time.monotonic_ns(), outcome, poison
        )
        self.log.record(replace(stored, policy=name, t0_ns=t0))
        if self.kill_after_send:
            os.kill(os.getpid(), signal.SIGKILL)
        return True

    async def run(self) -> None:
        try:
            await self._run()
        except BaseException:
            # Said at once, with its cause, and the process ends: left to
            # asyncio.run's teardown, a pool that was never closed keeps it
            # alive forever, and the run would only show "not drained".
            logger.exception("worker %s failed", self.cfg.name)
            logging.shutdown()
            os._exit(70)  # runner.WORKER_FAILED

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, self._arm_kill)
        await self.start()
        (self.workdir / f"ready-{self.cfg.name}").touch()
        deadline = await self._deadline()
        await self.send_all(deadline)
        (self.workdir / f"sent-{self.cfg.name}").touch()
        stop = self.workdir / "exit"
        while True:  # idle, sweeping, until the runner says so
            if stop.exists():
                break
            await asyncio.sleep(0.1)
        for rt in self.runtimes.values():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await rt.aclose()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self.backend.aclose()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self.stack.aclose()
        self.sink.close()
        self.log.close()
        self.handed.close()
        self.events.close()

    def _arm_kill(self) -> None:
        self.kill_after_send = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m safety.threads.worker")
    parser.add_argument("--config", required=True, help="WorkerConfig as JSON")
    parser.add_argument("--control", default=None, choices=controls.CONTROLS)
    ns = parser.parse_args(argv)
    cfg = WorkerConfig(**json.loads(ns.config))
    if ns.control is not None:
        cfg.control = ns.control
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    controls.apply(cfg.control)
    asyncio.run(Worker(cfg).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
