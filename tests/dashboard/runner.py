"""A runtime worker whose runs block until they are stopped (run by the dashboard's tests).

``python -m tests.dashboard.runner URL THREAD`` runs a :class:`ThreadRuntime`
that keeps output (so its runs listen for cancels) in the default namespace.
Each line on stdin is sent as a signal to ``THREAD``; the handler, given a
signal, waits forever. It prints ``ready``, then ``run <run_id> <token>`` when
a run has its signal, and ``ended <run_id> interrupted|cancelled`` when a run
is stopped.
"""

from __future__ import annotations

import asyncio
import sys

from tenure import ThreadRun, ThreadRuntime, from_url


async def main(url: str, thread: str) -> None:
    async def handler(run: ThreadRun) -> None:
        try:
            async for _signal in run.signals():
                print(f"run {run.run_id} {run.token}", flush=True)
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            print(f"ended {run.run_id} {'interrupted' if run.interrupted else 'cancelled'}")
            sys.stdout.flush()
            raise

    loop = asyncio.get_running_loop()
    async with (
        from_url(url) as backend,
        ThreadRuntime(backend, handler, process_id="worker-1", output=True) as runtime,
    ):
        print("ready", flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            await runtime.send_signal(thread, line.strip())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
