"""A paused owner's late write, rejected by its fencing token.

    python examples/fencing.py                      # everything in memory
    python examples/fencing.py sqlite:///tmp/t.db   # any backend URL
    python examples/fencing.py redis://127.0.0.1:6379/0 --store postgresql://postgres@127.0.0.1/postgres
    python examples/fencing.py --langgraph /tmp/checkpoints.db  # a LangGraph thread's checkpoints

Worker A holds a lease and starts a job. It is then paused for longer than its
TTL (a stop-the-world GC, a swapped-out VM, SIGSTOP): here the pause is
simulated by blocking A's event loop, so its background renewal cannot run
either, exactly as in a real pause. Meanwhile the lease expires and worker B
takes over with a higher token and writes its result. When A wakes up it
still has its result to write:

- ``lease.held`` is already False: A could have checked before writing; but a
  check is never enough, because the pause can fall between the check and the
  write;
- so the store itself compares tokens: A's write carries the lower token and is
  rejected, B's result stays.

With ``--langgraph PATH`` the store is a LangGraph thread's checkpoints in a
SQLite file, written through ``FencedAsyncSqliteSaver`` (``pip install
'tenure[langgraph]'``): A's late checkpoint is refused with ``FenceRefused``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import tenure
from tenure.fencing import FencedStore, FencedValue, MemoryFencedStore, PostgresFencedStore

TTL_MS = 600


async def main(url: str, store_url: str | None, store: FencedStore | None = None) -> None:
    if store is None:
        store = MemoryFencedStore() if store_url is None else PostgresFencedStore(store_url)
    key = f"report-{time.time_ns()}"
    async with tenure.from_url(url) as backend, store:
        async with tenure.hold(backend, key, "worker-a", TTL_MS, cancel_on_loss=False) as lease:
            print(f"A holds {key!r} with token {lease.token}")
            assert lease.token is not None
            assert await store.write(key, lease.token, "A's draft")
            worker_b = asyncio.create_task(successor(backend, store, key))
            print(f"A pauses for {2 * TTL_MS} ms (the lease's TTL is {TTL_MS} ms)...")
            # Deliberately blocking: the whole loop stops, as in a real pause.
            time.sleep(2 * TTL_MS / 1000)  # noqa: ASYNC251
            print(f"A wakes up; lease.held = {lease.held} ({lease.lost_reason})")
            await worker_b  # in a real system B runs elsewhere; here, let it finish
            applied = await store.write(key, lease.token, "A's report")
            print(f"A writes with token {lease.token}: {'applied' if applied else 'REJECTED'}")

        stored = await store.read(key)
        assert stored is not None
        print(f"the store holds {stored.value!r}, written with token {stored.token}")
        assert stored.value == "B's report", "fencing failed: a stale write was applied"


async def successor(backend: Any, store: FencedStore, key: str) -> None:
    # B waits for the key; it is granted once A's lease expires on the backend.
    async with tenure.hold(backend, key, "worker-b", TTL_MS, wait=30) as lease:
        assert lease.token is not None
        print(f"B took over {key!r} with token {lease.token}")
        applied = await store.write(key, lease.token, "B's report")
        print(f"B writes with token {lease.token}: {'applied' if applied else 'rejected'}")


class CheckpointStore(FencedStore):
    """A LangGraph thread's checkpoints as the fenced store: each write is a checkpoint."""

    def __init__(self, saver: Any) -> None:
        self.saver = saver

    async def write(self, key: str, token: int, value: Any) -> bool:
        from langgraph.checkpoint.base import empty_checkpoint

        from tenure.fencing import FenceRefused

        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"report": value}
        config: Any = {
            "configurable": {"thread_id": key, "checkpoint_ns": "", "fencing_token": token}
        }
        try:
            await self.saver.aput(config, checkpoint, {"source": "loop", "step": 0}, {})
        except FenceRefused as refused:
            print(f"  the saver refused it: {refused}")
            return False
        return True

    async def read(self, key: str) -> FencedValue | None:
        latest = await self.saver.aget_tuple({"configurable": {"thread_id": key}})
        if latest is None:
            return None
        return FencedValue(
            latest.metadata["fencing_token"], latest.checkpoint["channel_values"]["report"]
        )


async def with_langgraph(url: str, path: str) -> None:
    from tenure.integrations.langgraph import FencedAsyncSqliteSaver

    async with FencedAsyncSqliteSaver.from_conn_string(path) as saver:
        await saver.setup()
        await main(url, None, CheckpointStore(saver))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="memory://", help="lease backend URL")
    parser.add_argument("--store", help="a PostgreSQL URL for the fenced store (default: memory)")
    parser.add_argument(
        "--langgraph", metavar="PATH", help="a SQLite file for LangGraph checkpoints"
    )
    args = parser.parse_args()
    if args.langgraph:
        asyncio.run(with_langgraph(args.url, args.langgraph))
    else:
        asyncio.run(main(args.url, args.store))
