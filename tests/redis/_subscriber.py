"""A subscriber process for the reclaim test: takes events, never acknowledges them.

Run as ``python -m tests.redis._subscriber URL PREFIX TOPIC GROUP DIR``. It
subscribes, writes ``DIR/ready``, and when its callback first runs writes
``DIR/got`` and hangs, leaving every event it read pending, until it is killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tenure import Event
from tenure.backends.redis import RedisStreamsPubSub


async def main(url: str, prefix: str, topic: str, group: str, where: Path) -> None:
    backend = RedisStreamsPubSub.from_url(url, prefix=prefix, quarantine=False)

    async def hang(event: Event) -> None:
        (where / "got").write_text(str(event.data))
        await asyncio.sleep(3600)

    await backend.subscribe(topic, hang, group=group)
    (where / "ready").write_text("ready")
    await asyncio.sleep(3600)


if __name__ == "__main__":
    url, prefix, topic, group, where = sys.argv[1:6]
    asyncio.run(main(url, prefix, topic, group, Path(where)))
