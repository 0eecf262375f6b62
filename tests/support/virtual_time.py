"""An event loop on virtual time, for code whose decisions hang on ``loop.time()``.

When nothing is ready to run, a real loop sleeps in ``select`` until its next
timer; this one looks for I/O without waiting and, if there is none, moves its
clock straight to that timer. Every ``asyncio.sleep``, ``wait_for`` timeout and
``call_later`` then fires at exactly its virtual time, whatever the machine's
load: a test can assert the times at which calls were made, to the
microsecond, without a timing margin. Only for code that does no real I/O
(the memory backend): a socket would see virtual seconds pass in no real time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_virtual"]

T = TypeVar("T")

_NOTHING_LEFT = 10.0


class _Selector(selectors.DefaultSelector):
    def __init__(self, loop: _VirtualLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            # No timer: only I/O can come (another thread's wake-up, as when the
            # loop shuts its executor down). Nothing within seconds means the code
            # under test waits for something that can never happen: fail, not hang.
            ready = super().select(_NOTHING_LEFT)
            if not ready:
                raise RuntimeError(
                    f"virtual-time loop: no timer and no I/O for {_NOTHING_LEFT:g} s;"
                    " the code under test waits forever"
                )
            return ready
        ready = super().select(0)
        if not ready and timeout > 0:
            self._loop.now += timeout
        return ready


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_Selector(self))

    def time(self) -> float:
        return self.now


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh virtual-time loop starting at 0.0."""
    with asyncio.Runner(loop_factory=_VirtualLoop) as runner:
        return runner.run(main)
