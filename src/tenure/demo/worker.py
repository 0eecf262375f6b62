"""One worker process of ``tenure demo``: ``python -m tenure.demo.worker DIR INDEX``.

It runs a :class:`~tenure.runtime.ThreadRuntime` on the demo's URL, sends its
share of the planned signal stream, and handles whatever threads it wins,
recording everything it does in ``DIR/<worker>.jsonl`` (one flushed line per
record, see :mod:`tenure.demo._evidence`), until ``DIR/stop`` appears.
The settings come from ``DIR/settings.json``, written by the coordinator.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

from .. import RuntimeEvent, ThreadRun, ThreadRuntime, from_url
from ._evidence import plan, worker_name

__all__ = ["main"]

_POLL = 0.05


class _Recorder:
    def __init__(self, out: TextIO, worker: str) -> None:
        self._out = out
        self._worker = worker

    def __call__(self, kind: str, **fields: Any) -> None:
        doc = {"k": kind, "w": self._worker, "t": time.monotonic_ns(), **fields}
        # One write and one flush per record: a SIGKILL loses at most the
        # record being written, which the reader then ignores.
        self._out.write(json.dumps(doc, separators=(",", ":")) + "\n")
        self._out.flush()


async def _wait_for(path: Path) -> None:
    """Until ``path`` exists, or the coordinator is gone (then never leave an orphan)."""
    parent = os.getppid()
    # A file is the only thing the coordinator process shares with us.
    while not os.path.exists(path):  # noqa: ASYNC240 - polling another process's file
        if os.getppid() != parent:
            return
        await asyncio.sleep(_POLL)


def _handler(
    settings: dict[str, Any], rng: random.Random, record: _Recorder
) -> Callable[[ThreadRun], Awaitable[None]]:
    work_min, work_max = settings["work_ms"]
    per_run_min, per_run_max = settings["signals_per_run"]

    async def handler(run: ThreadRun) -> None:
        # A "turn" of the conversation: handle a few signals, then return;
        # the runtime hands the lease to a new run if more are waiting.
        budget = rng.randint(per_run_min, per_run_max)
        record("run_start", thread=run.thread_key, run_id=run.run_id, token=run.token)
        how = "cancelled"
        try:
            async for signal in run.signals():
                start = time.monotonic_ns()
                await asyncio.sleep(rng.uniform(work_min, work_max) / 1000)
                if run.lost.is_set():
                    # Not acknowledged: the next owner gets this signal again.
                    break
                payload = signal.payload if isinstance(signal.payload, dict) else {}
                record(
                    "handled",
                    sig=payload.get("sig"),
                    signal_id=signal.id,
                    thread=run.thread_key,
                    run_id=run.run_id,
                    token=run.token,
                    start=start,
                    end=time.monotonic_ns(),
                    attempt=signal.attempt,
                )
                budget -= 1
                if budget <= 0:
                    break
            how = "lost" if run.lost.is_set() else "ok"
        finally:
            if run.lost.is_set():
                how = "lost"
            record("run_end", thread=run.thread_key, run_id=run.run_id, token=run.token, how=how)

    return handler


def _on_event(record: _Recorder) -> Callable[[RuntimeEvent], None]:
    def on_event(event: RuntimeEvent) -> None:
        if event.kind in ("signal", "run_end"):
            return  # the handler records these itself, with its own timestamps
        record(
            "event",
            ev=event.kind,
            thread=event.thread_key,
            run_id=event.run_id,
            token=event.token,
            signal_id=event.signal_id,
            detail=event.detail,
        )

    return on_event


async def _send_share(
    runtime: ThreadRuntime, settings: dict[str, Any], name: str, directory: Path, record: _Recorder
) -> None:
    """Send this worker's share of the plan on its schedule, until done or told to stop."""
    go = json.loads((directory / "go").read_text())
    # The coordinator's start instant on the shared monotonic clock.
    t0 = int(go["t"]) / 1e9
    stop = asyncio.ensure_future(_wait_for(directory / "stop"))
    seed = int(settings["seed"])
    everything = plan(seed, settings["workers"], settings["threads"], settings["signals"])
    total = int(settings["signals"])
    spread = float(settings["send_seconds"])
    for s in (s for s in everything if s.sender == name):
        delay = t0 + spread * s.n / total - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if stop.done():
            break
        result = await runtime.send_signal(s.thread, {"sig": s.sig, "from": name})
        record(
            "sent",
            sig=s.sig,
            signal_id=result.signal_id,
            thread=s.thread,
            outcome=result.outcome,
            run_id=result.run_id,
        )
    record("sending_done")
    await stop


async def run_worker(directory: Path, index: int) -> None:
    settings = json.loads((directory / "settings.json").read_text())
    name = worker_name(index)
    rng = random.Random(f"work:{int(settings['seed'])}:{index}")
    with (directory / f"{name}.jsonl").open("a", encoding="utf-8") as out:
        record = _Recorder(out, name)
        backend = from_url(settings["url"])
        async with backend:
            runtime = ThreadRuntime(
                backend,
                _handler(settings, rng, record),
                ttl_ms=int(settings["ttl_ms"]),
                idle_timeout=float(settings["idle_timeout"]),
                process_id=f"{name}-{os.getpid()}",
                on_event=_on_event(record),
                namespace=settings["namespace"],
            )
            async with runtime:
                record("hello", pid=os.getpid(), process_id=runtime.process_id)
                await _wait_for(directory / "go")
                await _send_share(runtime, settings, name, directory, record)
        record("done")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m tenure.demo.worker DIR INDEX", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    asyncio.run(run_worker(Path(args[0]), int(args[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
