"""A subscriber process for the reclaim tests: takes events, never acknowledges them.

Run as ``python -m tests.redis._subscriber URL PREFIX TOPIC GROUP DIR [FINISH]``.
It subscribes, writes ``DIR/ready``, and when its callback first runs on an
event whose data is not below ``FINISH`` (default 0) writes ``DIR/got`` and
hangs, leaving every event it read pending, until it is killed. The callback
returns at once for events whose data is below ``FINISH``: finished, their
acknowledgement waits for the end of the read.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tenure import Event
from tenure.backends.redis import RedisStreamsPubSub


async def main(url: str, prefix: str, topic: str, group: str, where: Path, finish: int) -> None:
    backend = RedisStreamsPubSub.from_url(url, prefix=prefix, quarantine=False)

    async def hang(event: Event) -> None:
        if isinstance(event.data, int) and event.data < finish:
            return
        (where / "got").write_text(str(event.data))
        await asyncio.sleep(3600)

    await backend.subscribe(topic, hang, group=group)
    (where / "ready").write_text("ready")
    await asyncio.sleep(3600)


if __name__ == "__main__":
    url, prefix, topic, group, where = sys.argv[1:6]
    finish = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    asyncio.run(main(url, prefix, topic, group, Path(where), finish))
