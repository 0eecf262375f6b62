"""A process that holds one lease and says when it loses it (run by the dashboard's tests).

``python -m tests.dashboard.holder URL KEY OWNER TTL_MS`` prints ``held <token>``
once the lease is held, then ``lost <reason>`` when ``hold`` reports the loss.
"""

from __future__ import annotations

import asyncio
import sys

from tenure import from_url, hold


async def main(url: str, key: str, owner: str, ttl_ms: int) -> None:
    async with from_url(url) as backend:
        lease = await hold(backend, key, owner, ttl_ms).start()
        print(f"held {lease.token}", flush=True)
        try:
            await lease.lost.wait()
            print(f"lost {lease.lost_reason}", flush=True)
        finally:
            await lease.release()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
