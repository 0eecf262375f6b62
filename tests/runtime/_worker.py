"""A runtime process for the multi-process tests: ``python _worker.py URL PROCESS_ID [options]``.

Reads JSON commands on stdin (``{"id": n, "op": "send", "thread": ..., "payload": ...}``,
optionally with ``"signal_id"`` and ``"policy"``,
``{"op": "quit"}``) and writes one JSON document per line on stdout, flushed at
once, so the parent sees everything that happened before it kills the process:

- ``{"op": "ready"}`` once the runtime runs;
- ``{"op": "sent", "id": n, "outcome": ..., "run_id": ..., "signal_id": ...}``;
- ``{"op": "run_start" | "run_end", "thread", "run", "token", "t"}``;
- ``{"op": "take" | "done", "thread", "run", "sid", "payload", "attempt", "t"}``;
- ``{"op": "event", "kind", "thread", "run", "token", "sid", "detail", "t"}``.

``t`` is ``time.monotonic()``, one timeline for every process of the host. A
payload ``{"block": true}`` makes the handler wait forever on that signal
the first time it is delivered (a redelivery passes); ``{"hold": path}``
makes it wait until the file ``path`` exists. A ``take`` names the ids of the
signals coalesced into the one taken (``"coalesced"``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, get_args

import tenure
from tenure import Debounce, RuntimeEvent, ThreadRun, ThreadRuntime
from tenure.runtime._types import Policy


def say(**doc: Any) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("process_id")
    parser.add_argument("--ttl-ms", type=int, default=2000)
    parser.add_argument("--idle", type=float, default=0.3)
    parser.add_argument("--work-ms", type=float, default=0.0)
    parser.add_argument("--one-per-run", action="store_true")
    parser.add_argument("--namespace", default="tenure.thread")
    parser.add_argument("--policy", default="enqueue", choices=get_args(Policy))
    parser.add_argument("--window", type=float, default=0.2, help="the debounce policy's window")
    parser.add_argument(
        "--clock-skew",
        type=float,
        default=0.0,
        help="seconds added to the wall clock this process stamps its signals with "
        "(Event.created_at, Signal.sent_at): a sender on a host whose clock is off",
    )
    parser.add_argument(
        "--slow-release-ms",
        type=float,
        default=0.0,
        help="pause inside release_lease (prints releasing), to widen the closing window",
    )
    args = parser.parse_args()
    if args.clock_skew:
        skew_sent_at(args.clock_skew)

    async def handler(run: ThreadRun) -> None:
        say(
            op="run_start",
            thread=run.thread_key,
            run=run.run_id,
            token=run.token,
            t=time.monotonic(),
        )
        detail = "ok"
        try:
            async for signal in run.signals():
                doc = {
                    "thread": run.thread_key,
                    "run": run.run_id,
                    "sid": signal.id,
                    "payload": signal.payload,
                    "attempt": signal.attempt,
                }
                coalesced = [s.id for s in signal.coalesced]
                say(op="take", t=time.monotonic(), coalesced=coalesced, **doc)
                blocking = isinstance(signal.payload, dict) and signal.payload.get("block")
                if blocking and signal.attempt == 1:
                    await asyncio.Event().wait()
                hold = isinstance(signal.payload, dict) and signal.payload.get("hold")
                # Another process makes the file: nothing here to wait on but the disk.
                while hold and not await asyncio.to_thread(Path(hold).exists):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                if args.work_ms:
                    await asyncio.sleep(args.work_ms / 1000)
                say(op="done", t=time.monotonic(), **doc)
                if args.one_per_run:
                    break
        except asyncio.CancelledError:
            detail = "interrupted" if run.interrupted else "cancelled"
            raise
        finally:
            say(
                op="run_end",
                thread=run.thread_key,
                run=run.run_id,
                detail=detail,
                t=time.monotonic(),
            )

    def on_event(e: RuntimeEvent) -> None:
        say(
            op="event",
            kind=e.kind,
            thread=e.thread_key,
            run=e.run_id,
            token=e.token,
            sid=e.signal_id,
            detail=e.detail,
            t=e.at,
        )

    loop = asyncio.get_running_loop()
    async with tenure.from_url(args.url) as backend:
        leases: Any = backend
        if args.slow_release_ms:
            leases = SlowRelease(backend, args.slow_release_ms / 1000)
        await serve(args, backend, leases, handler, on_event, loop)
    say(op="bye")


def policy_of(name: Any, window: float) -> Any:
    return Debounce(window) if name == "debounce" else name


class _SkewedClock:
    """The ``time`` module as ``tenure._pubsub`` uses it, ``skew`` seconds off."""

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def time(self) -> float:
        return time.time() + self.skew


def skew_sent_at(skew: float) -> None:
    """Stamp this process's signals ``skew`` seconds off: the only place a sender's
    clock enters a signal is the publish time ``prepare_event`` gives it. Leases
    keep the true clock (a skewed host's SQLite leases would fail for another reason)."""
    from tenure import _pubsub

    setattr(_pubsub, "time", _SkewedClock(skew))  # noqa: B010 - a module attribute, on purpose


class SlowRelease:
    """The backend's leases with a pause before each release (a test-only knob)."""

    def __init__(self, inner: Any, pause: float) -> None:
        self.inner = inner
        self.pause = pause
        self.capabilities = inner.capabilities
        self.acquire_lease = inner.acquire_lease
        self.get_lease_owner = inner.get_lease_owner
        self.get_lease = inner.get_lease
        self.renew_lease = inner.renew_lease
        self.transfer_lease = inner.transfer_lease

    async def release_lease(self, key: str, owner: str) -> None:
        say(op="releasing", t=time.monotonic())
        await asyncio.sleep(self.pause)
        await self.inner.release_lease(key, owner)


async def serve(
    args: argparse.Namespace,
    backend: Any,
    leases: Any,
    handler: Any,
    on_event: Any,
    loop: asyncio.AbstractEventLoop,
) -> None:
    async with (
        ThreadRuntime(
            backend,
            handler,
            lease_provider=leases,
            ttl_ms=args.ttl_ms,
            idle_timeout=args.idle,
            process_id=args.process_id,
            on_event=on_event,
            namespace=args.namespace,
            policy=policy_of(args.policy, args.window),
        ) as runtime,
    ):
        say(op="ready")

        async def send(cmd: dict[str, Any]) -> None:
            result = await runtime.send_signal(
                cmd["thread"],
                cmd["payload"],
                signal_id=cmd.get("signal_id"),
                policy=policy_of(cmd["policy"], cmd.get("window", args.window))
                if cmd.get("policy")
                else None,
            )
            say(
                op="sent",
                id=cmd["id"],
                outcome=result.outcome,
                run_id=result.run_id,
                signal_id=result.signal_id,
                t=time.monotonic(),
            )

        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "send":
                # Sends of one process run one after the other, in the order given.
                await send(cmd)


if __name__ == "__main__":
    asyncio.run(main())
