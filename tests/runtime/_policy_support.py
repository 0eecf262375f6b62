"""Two runtimes on one memory backend standing for two processes (shared by the
policy tests): the owner, whose events are recorded, and another sender."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from tenure import MemoryPubSub, RuntimeEvent, ThreadRuntime

from .test_policies import OPTIONS

__all__ = ["owner_and_other"]


@asynccontextmanager
async def owner_and_other(
    handler: Any, events: list[RuntimeEvent], **other_options: Any
) -> AsyncIterator[tuple[ThreadRuntime, ThreadRuntime]]:
    """Both runtimes started with ``OPTIONS`` (the other's updated by ``other_options``);
    the owner's events go to ``events``."""
    async with MemoryPubSub() as memory:
        owner = ThreadRuntime(memory, handler, on_event=events.append, **OPTIONS)
        other = ThreadRuntime(memory, handler, **{**OPTIONS, **other_options})
        async with owner, other:
            yield owner, other
