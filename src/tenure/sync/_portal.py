"""The one private event-loop thread per process that runs tenure's async code for blocking callers.

Every blocking call of :mod:`tenure.sync` hands a coroutine to this loop and
waits for its result, so the blocking API is the async implementation, not a
second one. The thread starts on the first blocking call (importing
:mod:`tenure.sync` starts nothing) and is a daemon: it never keeps a process
alive.

After ``fork()`` the child has no loop thread (only the forking thread survives)
and must not touch the parent's loop, its sockets or its selector (an epoll set
is shared with the parent). A hook run in the child forgets the parent's loop
without closing anything (the objects are kept referenced, so no finaliser runs
on them), and the next blocking call starts a fresh loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import weakref
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

from .._errors import TenureError

__all__ = ["Portal", "SyncCallInEventLoop", "SyncLoopDied", "call", "on_fork", "portal"]

_T = TypeVar("_T")

# Workers that run sync callbacks (subscriptions, on_lost) off the loop thread.
_CALLBACK_THREADS = 32


class SyncCallInEventLoop(TenureError, RuntimeError):
    """A blocking :mod:`tenure.sync` call was made from a thread running an event loop.

    It would stall that loop, or deadlock when the call needs the loop it blocks.
    """


class SyncLoopDied(TenureError, RuntimeError):
    """tenure's private loop thread has ended: no blocking call can run any more.

    Raised by every later blocking call instead of waiting for it for ever.
    """


class Portal:
    """An event loop running forever in a daemon thread, and a pool for sync callbacks."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        # What ended the loop thread, if something did (see check_alive).
        self.died: BaseException | None = None
        self.loop = asyncio.new_event_loop()
        self.callbacks = concurrent.futures.ThreadPoolExecutor(
            _CALLBACK_THREADS, thread_name_prefix="tenure-sync-callback"
        )
        ready = threading.Event()
        self.thread = threading.Thread(
            target=self._main, args=(ready,), name="tenure-sync-loop", daemon=True
        )
        self.thread.start()
        ready.wait()

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        try:
            self.loop.run_forever()
        except BaseException as exc:  # SystemExit or KeyboardInterrupt raised on the loop
            self.died = exc
            raise

    def check_alive(self) -> None:
        """Raise :class:`SyncLoopDied` if the loop thread has ended."""
        if not self.thread.is_alive():
            cause = self.died
            raise SyncLoopDied(
                "tenure.sync's loop thread has ended"
                + (f" ({cause!r} reached it)" if cause is not None else "")
                + ": blocking tenure calls cannot run in this process any more"
            ) from cause

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


_lock = threading.Lock()
_portal: Portal | None = None
# Objects of a parent process, inherited by a forked child: kept referenced so
# that no finaliser (closing a transport, unregistering from the shared epoll
# set, terminating a database session) ever runs on them in the child.
_inherited: list[object] = []
_fork_hooks: weakref.WeakSet[Any] = weakref.WeakSet()


def portal() -> Portal:
    """This process's portal, started on first use."""
    current = _portal
    if current is not None:
        return current
    return _start()


def _start() -> Portal:
    global _portal
    with _lock:
        if _portal is None:
            _portal = Portal()
        return _portal


def check_blocking_allowed(what: str) -> None:
    """Raise :class:`SyncCallInEventLoop` when called from a thread running an event loop."""
    if asyncio._get_running_loop() is not None:
        raise SyncCallInEventLoop(
            f"tenure.sync {what} blocks, and was called from a running event loop "
            "(it would stall the loop, or deadlock): in async code use the async API "
            "(tenure.from_url, tenure.hold, ...), or run this call in a worker thread "
            "with `await asyncio.to_thread(...)`"
        )


def call(fn: Callable[..., Coroutine[Any, Any, _T]], *args: Any, what: str = "") -> _T:
    """Run ``fn(*args)`` on the portal's loop and block until it returns; its error is raised here.

    If the waiting thread is interrupted (``KeyboardInterrupt``), the coroutine is cancelled.
    """
    if asyncio._get_running_loop() is not None:
        check_blocking_allowed(what or getattr(fn, "__qualname__", "call"))
    # A bare lock instead of concurrent.futures: the caller sleeps on it, the
    # coroutine's last step releases it (no done-callback round on the loop).
    done = _allocate_lock()
    done.acquire()
    outcome: list[Any] = [None, None, None]  # result, error, task

    async def run() -> None:
        try:
            outcome[0] = await fn(*args)
        except BaseException as exc:
            outcome[1] = exc
        finally:
            done.release()

    current = _portal or _start()
    current.check_alive()
    loop = current.loop
    coro = run()
    try:
        loop.call_soon_threadsafe(_create_task, loop, coro, outcome)
        # A loop thread that dies meanwhile never answers: look every second.
        while not done.acquire(timeout=1.0):
            current.check_alive()
    except BaseException:
        loop.call_soon_threadsafe(_cancel, coro, outcome)
        raise
    error = outcome[1]
    if error is not None:
        outcome[1] = None  # no reference cycle through the traceback
        raise error
    return cast(_T, outcome[0])


def _create_task(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None], outcome: list[Any]
) -> None:
    outcome[2] = loop.create_task(coro)


def _cancel(coro: Coroutine[Any, Any, None], outcome: list[Any]) -> None:
    task = outcome[2]
    if task is not None:
        task.cancel()
    else:  # interrupted before the loop saw it
        coro.close()


def on_fork(obj: Any) -> None:
    """Call ``obj._after_fork_in_child()`` in a forked child while ``obj`` is alive."""
    _fork_hooks.add(obj)


def _after_fork_in_child() -> None:
    global _portal, _lock
    _lock = threading.Lock()  # the parent may have held it while forking
    if _portal is not None:
        _inherited.append(_portal)
        _portal = None
    for obj in list(_fork_hooks):
        obj._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
