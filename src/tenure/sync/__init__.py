"""Blocking tenure, for threads and sync frameworks (Django, Flask, Celery, scripts).

The same async implementation, not a second one: each blocking call runs the
async code on one private event-loop thread per process (started on the first
call; importing this module starts nothing) and waits for it. Everything here is
thread-safe; many threads share one backend.

::

    import tenure.sync

    with tenure.sync.from_url("redis://localhost:6379") as backend:
        with tenure.sync.hold(backend, "invoice-7", "worker-a", ttl_ms=30_000) as lease:
            lease.ensure_held()
            store.write("invoice-7", value, token=lease.token)

A blocking call made from a thread that runs an event loop raises
:class:`SyncCallInEventLoop` instead of stalling or deadlocking that loop.

``fork()`` (Celery prefork, gunicorn ``--preload``, multiprocessing): a
:class:`SyncBackend` re-initialises in the child on its first call (a fresh
loop thread, connections and file handle; nothing of the parent's is touched),
a lease held when forking stays the parent's (``held`` is false in the child),
and a :class:`SyncThreadRuntime` refuses to cross the fork.
"""

from __future__ import annotations

from ._backend import SyncBackend, SyncCallback, from_url
from ._hold import (
    SyncHeldLease,
    acquire_wait,
    current_lease,
    hold,
    renew_many,
    singleton,
)
from ._portal import SyncCallInEventLoop
from ._runtime import SyncThreadRuntime

SyncCallInEventLoop.__module__ = __name__  # shown as tenure.sync.SyncCallInEventLoop

__all__ = [
    "SyncBackend",
    "SyncCallInEventLoop",
    "SyncCallback",
    "SyncHeldLease",
    "SyncThreadRuntime",
    "acquire_wait",
    "current_lease",
    "from_url",
    "hold",
    "renew_many",
    "singleton",
]
