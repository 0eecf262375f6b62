"""A runtime process that replies on its threads' output: ``python _output_worker.py URL NAME``.

Commands on stdin, one JSON document a line: ``{"op": "send", "id": n,
"thread": ..., "payload": ...}``, ``{"op": "cancel", "id": n, "thread": ...,
"run_id": ...}``, ``{"op": "quit"}``. Reports on stdout, flushed at once:
``ready``, ``sent`` (with ``output_after``), ``cancelled``, ``run_start``,
``appended`` (run, position), ``fenced`` (run), ``run_end`` (run, how).

A signal's payload ``{"tokens": n, "delay": s}`` makes the handler append ``n``
items, ``s`` seconds apart, on its first delivery, and ``retry_tokens``
(default 3) on a later one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import tenure
from tenure import Fenced, ThreadRun, ThreadRuntime


def say(**doc: Any) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("process_id")
    parser.add_argument("--ttl-ms", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=0.3)
    parser.add_argument("--no-cancel", action="store_true", help="keep running after a loss")
    args = parser.parse_args()

    async def handler(run: ThreadRun) -> None:
        say(op="run_start", run=run.run_id, token=run.token, t=time.monotonic())
        how = "ok"
        try:
            async for signal in run.signals():
                payload = signal.payload
                n = payload["tokens"] if signal.attempt == 1 else payload.get("retry_tokens", 3)
                for i in range(n):
                    try:
                        position = await run.append({"i": i, "attempt": signal.attempt})
                    except Fenced:
                        say(op="fenced", run=run.run_id, t=time.monotonic())
                        how = "fenced"
                        return
                    say(op="appended", run=run.run_id, pos=position)
                    await asyncio.sleep(payload.get("delay", 0.0))
        except asyncio.CancelledError:
            how = "interrupted" if run.interrupted else "cancelled"
            raise
        finally:
            say(op="run_end", run=run.run_id, how=how, t=time.monotonic())

    loop = asyncio.get_running_loop()
    async with (
        tenure.from_url(args.url) as backend,
        ThreadRuntime(
            backend,
            handler,
            ttl_ms=args.ttl_ms,
            idle_timeout=args.idle,
            process_id=args.process_id,
            cancel_on_loss=not args.no_cancel,
            output=True,
        ) as runtime,
    ):
        say(op="ready")
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "send":
                result = await runtime.send_signal(cmd["thread"], cmd["payload"])
                say(
                    op="sent",
                    id=cmd["id"],
                    outcome=result.outcome,
                    run_id=result.run_id,
                    signal_id=result.signal_id,
                    output_after=result.output_after,
                )
            elif cmd["op"] == "cancel":
                cancelled = await runtime.cancel(cmd["thread"], run_id=cmd.get("run_id"))
                say(op="cancelled", id=cmd["id"], sent=cancelled)
    say(op="bye")


if __name__ == "__main__":
    asyncio.run(main())
