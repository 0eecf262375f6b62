"""A subscriber process for the kill test: acknowledges some events, then hangs.

Run as ``python -m tests.postgres._subscriber URL TOPIC GROUP HANG_AT DIR``. It
subscribes to ``GROUP``, writes ``DIR/ready``, acknowledges every event whose
``data`` is below ``HANG_AT`` (appending it to ``DIR/acked``), and hangs on the
first one that is not, writing ``DIR/got``, until it is killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tenure import Event
from tenure.backends.postgres import PostgresPubSub


async def main(url: str, topic: str, group: str, hang_at: int, where: Path) -> None:
    backend = PostgresPubSub.from_url(url)

    async def handle(event: Event) -> None:
        if event.data < hang_at:
            with (where / "acked").open("a") as out:
                out.write(f"{event.data}\n")
            return
        (where / "got").write_text(str(event.data))
        await asyncio.sleep(3600)

    await backend.subscribe(topic, handle, group=group)
    (where / "ready").write_text("ready")
    await asyncio.sleep(3600)


if __name__ == "__main__":
    url, topic, group, hang_at, where = sys.argv[1:6]
    asyncio.run(main(url, topic, group, int(hang_at), Path(where)))
