"""What an operator sees of a namespace's threads: who runs each, with which
token and TTL, and whether it has unfinished signals. Read from the backend,
so any process can look (``ThreadRuntime.threads()``, ``tenure threads``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from .._contract import Capability, LeaseProvider, LeaseRecord, capabilities_of
from ._identity import process_of, run_of
from ._log import GROUP, LeaseTable, RuntimeLog
from ._names import ThreadNames

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["ThreadStatus", "thread_statuses", "with_sessions"]


@dataclass(frozen=True, slots=True)
class ThreadStatus:
    """One thread as the backend has it.

    ``owner`` is the lease holder (``"<process>/<session>.<n>"``) and
    ``process_id``/``run_id`` its parts; ``token`` and ``ttl_ms`` are the
    lease's. All four are ``None`` when no run holds the thread. ``pending`` is
    true while the thread's log has signals not yet acknowledged (unread, or
    being handled): a thread with ``pending`` and no owner is taken over by
    the next sweep of any runtime of the namespace, unless a persisted signal
    (``policy="persist"``) heads what waits: then it stays stored, without a
    run, until a send wakes the thread.

    From :meth:`ThreadRuntime.threads` also, for the threads this runtime
    runs (``local``): ``queued``, the signals received and not yet handed to
    the handler, ``in_flight``, those handed to it and not acknowledged, and
    ``held_ms``, how long ago the thread was handed to this process (its last
    hand-over; the backends do not keep it for threads run elsewhere),
    ``discarded``, the signals its session here settled unrun under the
    ``discard`` policy, ``skipped``, those an ``interrupt`` or ``rollback``
    request settled unrun while they waited, and ``coalesced``, those handed
    to a newer signal's run inside it (``coalesce``, ``Debounce``).
    """

    thread_key: str
    owner: str | None
    process_id: str | None
    run_id: str | None
    token: int | None
    ttl_ms: int | None
    pending: bool
    local: bool = False
    queued: int | None = None
    in_flight: int | None = None
    held_ms: int | None = None
    discarded: int | None = None
    skipped: int | None = None
    coalesced: int | None = None


async def thread_statuses(
    leases: LeaseProvider, log: object, names: ThreadNames, thread_key: str | None = None
) -> list[ThreadStatus]:
    """The threads of ``names``' namespace with a run or unfinished signals, by key
    (only ``thread_key``'s when given). ``leases`` must declare ``OPERATIONS``
    (or ``RECORD`` for one thread); ``log`` is read with ``backlog`` when it
    declares ``BACKLOG``."""
    prefix = names.name(thread_key) if thread_key is not None else names.prefix
    records: dict[str, LeaseRecord] = {}
    # Declared, never probed: the capabilities promise the methods read here.
    table = cast(LeaseTable, leases)
    if thread_key is not None and Capability.OPERATIONS not in capabilities_of(leases):
        record = await table.get_lease(prefix)
        if record is not None:
            records[thread_key] = record
    else:
        async for name, record in table.scan_leases(prefix):
            key = names.thread_of(name)
            if key is not None and (thread_key is None or key == thread_key):
                records[key] = record
    pending: set[str] = set()
    if Capability.BACKLOG in capabilities_of(log):
        for name in await cast(RuntimeLog, log).backlog(prefix, GROUP):
            key = names.thread_of(name)
            if key is not None and (thread_key is None or key == thread_key):
                pending.add(key)
    statuses = []
    for key in sorted(records.keys() | pending):
        record = records.get(key)
        owner = None if record is None else record.owner
        statuses.append(
            ThreadStatus(
                thread_key=key,
                owner=owner,
                process_id=process_of(owner),
                run_id=run_of(owner),
                token=None if record is None else record.token,
                ttl_ms=None if record is None else record.ttl_ms,
                pending=key in pending,
            )
        )
    return statuses


def with_sessions(
    statuses: list[ThreadStatus], sessions: Mapping[str, Session], process_id: str
) -> list[ThreadStatus]:
    """``statuses`` with what this process knows of the threads it runs."""
    by_key = {s.thread_key: s for s in statuses}
    for key, session in sessions.items():
        base = by_key.get(key) or ThreadStatus(
            key, session.owner, process_id, session.run_id, session.token, None, False
        )
        # ``inflight`` holds every signal received and not settled, the queued included.
        inbox = session.inbox
        # A debounce's held signals, acknowledged to read newer ones, wait too.
        queued = len(inbox.buffer)
        by_key[key] = replace(
            base,
            local=True,
            queued=queued + len(inbox.held),
            in_flight=len(inbox.inflight) - queued,
            held_ms=int((time.monotonic() - session.taken_at) * 1000),
            discarded=inbox.discarded,
            skipped=inbox.skipped,
            coalesced=inbox.coalesced,
        )
    return [by_key[k] for k in sorted(by_key)]
