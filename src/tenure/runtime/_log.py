"""What the runtime needs of its backends, and which event log a backend gives it.

The lease side is :class:`~tenure.LeaseProvider` (with ``get_lease`` when the
provider declares ``Capability.RECORD``); the signal side is a :class:`RuntimeLog`.
The event types and the consumer group below are the runtime's wire format on
that log.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import AsyncIterator, Collection
from typing import Protocol, cast

from .._contract import Capability, LeaseProvider, LeaseRecord, capabilities_of
from .._detect import NoopLeaseProvider, is_lease_provider, lease_provider_for
from .._errors import ConfigurationError, InvalidArgument
from .._pubsub import Callback, Event, LeaseFence

__all__ = [
    "CLOSE_MARKER",
    "GROUP",
    "INTERRUPT",
    "SIGNAL_TYPE",
    "EventSource",
    "FencedLog",
    "LeaseTable",
    "RecordedLeases",
    "RuntimeLog",
    "forgets_idle_groups",
    "log_for",
    "provider_for",
]

logger = logging.getLogger("tenure.runtime")

#: A signal, on its thread's topic.
SIGNAL_TYPE = "tenure.signal"
#: A closing session's marker, on its thread's topic (``{"session": sid, "seq": n}``).
CLOSE_MARKER = "tenure.runtime.close"
#: A request to the owner to apply a sender's policy, on the thread's control topic.
INTERRUPT = "tenure.runtime.interrupt"
#: The consumer group through which the owner of a thread reads its topic.
GROUP = "tenure.runtime"

# What a log shared by the processes of one host's memory backend must declare:
# the runtime's log without groups that outlive a process.
_LOCAL_NEEDS = Capability.RUNTIME_LOG & ~Capability.DURABLE_GROUPS


class EventSource(Protocol):
    """A backend that carries events (``Capability.EVENTS``): what a runtime is built on."""

    async def publish(self, topic: str, event: Event) -> Event: ...

    async def subscribe(
        self, topic: str, callback: Callback, *, group: str | None = None
    ) -> None: ...

    async def unsubscribe(self, topic: str, callback: Callback) -> None: ...


class RuntimeLog(EventSource, Protocol):
    """The log a runtime reads its threads' signals from (``Capability.RUNTIME_LOG``)."""

    async def reclaim(self, topic: str, group: str) -> int: ...

    async def backlog(
        self, prefix: str, group: str, *, skip: Collection[str] = ()
    ) -> list[str]: ...

    async def aclose(self) -> None: ...


class FencedLog(RuntimeLog, Protocol):
    """A log that takes events only under a lease (``Capability.FENCED_TAKES``)."""

    async def subscribe(
        self,
        topic: str,
        callback: Callback,
        *,
        group: str | None = None,
        fence: LeaseFence | None = None,
    ) -> None: ...


class RecordedLeases(LeaseProvider, Protocol):
    """A lease provider that reads a lease's record (``Capability.RECORD``)."""

    async def get_lease(self, key: str) -> LeaseRecord | None: ...


class LeaseTable(RecordedLeases, Protocol):
    """A lease provider an operator can list (``Capability.OPERATIONS``)."""

    def scan_leases(
        self, prefix: str = "", limit: int | None = None
    ) -> AsyncIterator[tuple[str, LeaseRecord]]: ...


def forgets_idle_groups(log: object) -> bool:
    """Whether ``log`` may forget a thread's consumer group between two of its
    sessions (a Redis backend with ``retention_ms``): a signal stored before the
    next session's group is made would be skipped, so no session may be assumed
    to have left the group behind."""
    return getattr(log, "forgets_idle_groups", False) is True


# One process-local log per backend object whose events cannot hold signals, so
# runtimes of one process built on it route to each other.
_local_logs: weakref.WeakKeyDictionary[object, RuntimeLog] = weakref.WeakKeyDictionary()


def _memory_log() -> RuntimeLog:
    # Through the scheme registry, as a user gets one: the runtime imports no backend.
    from .._url import from_url

    return cast(RuntimeLog, from_url("memory://"))


def _local_log(backend: object) -> RuntimeLog:
    try:
        log = _local_logs.get(backend)
        if log is None:
            log = _local_logs[backend] = _memory_log()
    except TypeError:  # not weak-referenceable: one log per runtime
        return _memory_log()
    return log


def provider_for(backend: object, lease_provider: object) -> LeaseProvider:
    """The lease provider of a runtime on ``backend`` (``lease_provider`` when given).

    Raises ``ConfigurationError`` unless ``backend`` carries events, and
    ``InvalidArgument`` for a ``lease_provider`` without the five lease methods.
    """
    if Capability.EVENTS not in capabilities_of(backend):
        raise ConfigurationError(
            f"{type(backend).__name__} cannot carry signals: the runtime needs a backend "
            "that declares Capability.EVENTS (a PubSub)"
        )
    if lease_provider is None:
        return lease_provider_for(backend)
    if not is_lease_provider(lease_provider):
        raise InvalidArgument(
            f"lease_provider must have the five lease methods, got {type(lease_provider).__name__}"
        )
    return lease_provider


def log_for(backend: object, provider: LeaseProvider, runtime: object) -> tuple[RuntimeLog, bool]:
    """The log a runtime on ``backend`` reads, and whether the runtime owns (and closes) it.

    ``backend`` itself when it declares what the runtime needs; a process-local
    log otherwise (shared by the runtimes of one backend object, or ``runtime``'s
    own when the provider grants every lease: nothing is coordinated then).
    Raises ``ConfigurationError`` for a backend whose durable groups could strand
    a signal.
    """
    capabilities = capabilities_of(backend)
    if isinstance(provider, NoopLeaseProvider):
        logger.warning(
            "%s provides no leases: the thread runtime runs single-process "
            "(threads are coordinated within this process only)",
            type(backend).__name__,
        )
        return _local_log(runtime), True
    if Capability.DURABLE_GROUPS in capabilities:
        missing = Capability.RUNTIME_LOG & ~capabilities
        if missing:
            names = ", ".join(f"Capability.{c.name}" for c in Capability if c in missing)
            raise ConfigurationError(
                f"{type(backend).__name__} has durable groups but does not declare {names}: "
                "the runtime could strand a signal of a dead owner or sender on it"
            )
        # Declared, never probed: the capabilities promise the log's methods.
        return cast(RuntimeLog, backend), False
    if _LOCAL_NEEDS in capabilities:
        return cast(RuntimeLog, backend), False  # events within one process (memory://)
    return _local_log(backend), False
