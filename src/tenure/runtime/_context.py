"""What a session is handed: the runtime's settings, its backends and its callbacks.

A session never sees its runtime: it reads the frozen :class:`SessionContext`
made once per runtime, and reports back only through the callbacks in it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .._contract import LeaseProvider
from .._errors import InvalidArgument
from .._pubsub import Callback
from .._renewer import Renewals, renew_timing
from .._validate import check_name, check_timeout, check_ttl
from ._log import RuntimeLog
from ._names import ThreadNames
from ._observe import Emit
from ._policies import SendRule
from ._run import Handler

__all__ = ["OnRollback", "SessionContext", "Settings"]

OnRollback = Callable[[str, str], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class Settings:
    """A runtime's checked settings (see :class:`~tenure.ThreadRuntime`); times in seconds."""

    ttl_ms: int
    renew_every: float
    renew_deadline: float
    idle_timeout: float
    sweep_interval: float
    marker_timeout: float
    unsubscribe_timeout: float
    cancel_on_loss: bool
    process_id: str
    #: Called as ``on_rollback(thread_key, run_id)`` for a run a ``rollback``
    #: signal interrupted, before the thread's next run starts.
    on_rollback: OnRollback | None = None

    @classmethod
    def check(
        cls,
        *,
        ttl_ms: int,
        renew_every_ms: float | None,
        renew_deadline_ms: float | None,
        idle_timeout: float,
        sweep_interval: float | None,
        marker_timeout: float,
        unsubscribe_timeout: float,
        cancel_on_loss: bool,
        process_id: str | None,
        on_rollback: OnRollback | None = None,
    ) -> Settings:
        """The settings, or ``InvalidArgument`` naming the first bad one."""
        if on_rollback is not None and not callable(on_rollback):
            raise InvalidArgument(f"on_rollback must be callable, got {type(on_rollback).__name__}")
        ttl_ms = check_ttl(ttl_ms)
        every, deadline = renew_timing(ttl_ms, renew_every_ms, renew_deadline_ms)
        idle_timeout = _positive(idle_timeout, "idle_timeout")
        if sweep_interval is None:
            sweep_interval = min(every, 1.0)
        return cls(
            ttl_ms=ttl_ms,
            renew_every=every,
            renew_deadline=deadline,
            idle_timeout=idle_timeout,
            sweep_interval=_positive(sweep_interval, "sweep_interval"),
            marker_timeout=check_timeout(marker_timeout, "marker_timeout"),
            unsubscribe_timeout=check_timeout(unsubscribe_timeout, "unsubscribe_timeout"),
            cancel_on_loss=bool(cancel_on_loss),
            process_id=check_name(
                process_id if process_id is not None else uuid.uuid4().hex[:12], "process_id"
            ),
            on_rollback=on_rollback,
        )


def _positive(value: float, name: str) -> float:
    value = check_timeout(value, name)
    if value <= 0:
        raise InvalidArgument(f"{name} must be greater than 0")
    return value


@dataclass(frozen=True, slots=True)
class SessionContext:
    """Everything a session needs, and nothing of the runtime that made it.

    ``fenced``: the log takes signals only under the thread's lease
    (``Capability.FENCED_TAKES`` on a log that keeps the leases too);
    ``records``: the provider reads a lease's token (``Capability.RECORD``).
    ``renewals``: the one loop that renews every thread lease of the process,
    together (see :class:`~tenure._renewer.Renewals`).
    ``unsubscribe`` unsubscribes within ``unsubscribe_timeout`` (going on in the
    background after it); ``ended(thread_key, sid, look_again)`` is told when
    a session has ended (``look_again``: signals may be left for a sweep, one
    of which wakes the thread when ``wake`` is passed as a fourth argument).
    """

    settings: Settings
    names: ThreadNames
    log: RuntimeLog
    provider: LeaseProvider
    handler: Handler
    rule: SendRule
    fenced: bool
    records: bool
    renewals: Renewals
    emit: Emit
    unsubscribe: Callable[[str, Callback], Awaitable[None]]
    ended: Callable[[str, str, bool, bool], None]
