"""A runtime process running ``tests.support.agent_graph`` per thread with
``graph_handler`` on a fenced saver (CHECKPOINTS: a SQLite path or a PostgreSQL URL):
``python -m tests.integrations.langgraph_graph_worker LEASES_URL CHECKPOINTS NAME``.

It speaks the protocol of ``tests/runtime/test_runtime_processes.Worker``: commands
on stdin (``send``, ``quit``), ``ready``, ``sent`` and each runtime ``event`` on stdout. The ``slow`` step
sleeps ``TENURE_TEST_SLOW`` seconds in this process.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import tenure
from tenure.integrations.langgraph import (
    FencedAsyncPostgresSaver,
    FencedAsyncSqliteSaver,
    graph_handler,
)
from tests.support.agent_graph import build_agent

TTL_MS = 1000


def say(**doc: Any) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


async def main(leases: str, checkpoints: str, name: str) -> None:
    loop = asyncio.get_running_loop()
    postgres = checkpoints.startswith("postgresql")
    opened: Any = (
        FencedAsyncPostgresSaver if postgres else FencedAsyncSqliteSaver
    ).from_conn_string
    async with (
        opened(checkpoints) as saver,
        tenure.from_url(leases) as backend,
    ):
        await saver.setup()
        agent = graph_handler(build_agent(saver), stream_mode=("updates", "messages", "custom"))
        async with tenure.ThreadRuntime(
            backend,
            agent,
            ttl_ms=TTL_MS,
            idle_timeout=5,
            process_id=name,
            output=True,
            on_rollback=agent.on_rollback,
            on_event=lambda e: say(op="event", kind=e.kind, run=e.run_id, detail=e.detail),
        ) as runtime:
            await runtime.start()
            say(op="ready")
            while line := await loop.run_in_executor(None, sys.stdin.readline):
                cmd = json.loads(line)
                if cmd["op"] == "quit":
                    break
                result = await runtime.send_signal(
                    cmd["thread"], cmd["payload"], policy=cmd.get("policy")
                )
                say(
                    op="sent",
                    id=cmd["id"],
                    outcome=result.outcome,
                    signal_id=result.signal_id,
                    output_after=result.output_after,
                )


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
