"""A member of a consumer group that hangs on its first event until it is killed.

Run as ``python -m tests.support.hanging_subscriber URL TOPIC GROUP DIR [KEY OWNER_PREFIX]``
(with ``KEY`` and ``OWNER_PREFIX``, a fenced subscription: it takes events only
while the lease ``KEY`` is held by an owner starting with ``OWNER_PREFIX``). It
subscribes, writes ``DIR/ready``, and on its first event writes the event's
data to ``DIR/got`` and hangs, leaving every event it took unacknowledged.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import tenure
from tenure import Event, LeaseFence


async def main(url: str, topic: str, group: str, where: Path, fence: LeaseFence | None) -> None:
    async with tenure.from_url(url) as opened:
        backend: Any = opened  # a backend that carries events

        async def hang(event: Event) -> None:
            (where / "got").write_text(str(event.data))
            await asyncio.sleep(3600)

        await backend.subscribe(topic, hang, group=group, fence=fence)
        (where / "ready").write_text("ready")
        await asyncio.sleep(3600)


if __name__ == "__main__":
    url, topic, group, where = sys.argv[1:5]
    fence = LeaseFence(sys.argv[5], sys.argv[6]) if len(sys.argv) > 6 else None
    asyncio.run(main(url, topic, group, Path(where), fence))
