"""``tenure.sync.SyncThreadRuntime``: the thread runtime, started and sent to from blocking code."""

from __future__ import annotations

import functools
import os
from typing import Any, Self

from .._errors import TenureError
from .._lifecycle import Closeable
from ..runtime import SendResult, ThreadRuntime
from ..runtime._run import Handler
from ._backend import SyncBackend
from ._hold import _backend
from ._portal import call

__all__ = ["SyncThreadRuntime"]


class SyncThreadRuntime(Closeable):
    """A :class:`tenure.ThreadRuntime` on tenure's loop thread, driven from blocking code.

    ``handler`` is the runtime's usual ``async def handler(run)``; it runs on the
    loop thread. ``settings`` are :class:`~tenure.ThreadRuntime`'s keyword
    arguments. :meth:`send_signal` blocks until the signal is stored (a Django
    or Flask view can call it); ``with`` starts the runtime and closes it at the
    end. ``runtime`` is the async runtime, for use on the loop thread.

    A runtime does not cross ``fork()``: make it in the child (a worker's start
    hook); calls in a child raise :class:`~tenure.TenureError`.
    """

    def __init__(self, backend: SyncBackend, handler: Handler, **settings: Any) -> None:
        inner = _backend(backend).backend
        self._pid = os.getpid()

        async def build() -> ThreadRuntime:
            return ThreadRuntime(inner, handler, **settings)

        self.runtime: ThreadRuntime = call(build, what="SyncThreadRuntime()")

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise TenureError(
                f"this SyncThreadRuntime was made in process {self._pid} and crossed fork(): "
                "make the runtime in the child process (for instance in the worker's start hook)"
            )

    def start(self) -> None:
        """Start the sweeper (``send_signal`` also starts the runtime on first use)."""
        self._check_process()
        call(self.runtime.start, what="SyncThreadRuntime.start()")

    def send_signal(
        self, thread_key: str, payload: Any, *, signal_id: str | None = None
    ) -> SendResult:
        """Blocking :meth:`tenure.ThreadRuntime.send_signal`: same arguments, result and errors."""
        self._check_process()
        return call(
            functools.partial(self.runtime.send_signal, signal_id=signal_id),
            thread_key,
            payload,
            what="send_signal()",
        )

    def close(self) -> None:
        """Close the runtime: its runs end and hand their threads back."""
        if os.getpid() == self._pid:
            call(self.runtime.aclose, what="SyncThreadRuntime.close()")

    def __enter__(self) -> Self:
        self.start()
        return self
