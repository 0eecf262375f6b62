"""tenure: distributed leases with fencing tokens, pub/sub, and a thread runtime.

Importing tenure loads no backend and no driver (not even ``sqlite3``): a
backend module is imported when its URL scheme or its class is first used.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ._contract import (
    AcquireResult,
    Backend,
    Capability,
    EventBackend,
    LeaseProvider,
    LeaseRecord,
    RefusalReason,
    capabilities_of,
)
from ._detect import NoopLeaseProvider, events_of, is_lease_provider, lease_provider_for
from ._errors import (
    BackendClosed,
    BackendUnavailable,
    ConfigurationError,
    Fenced,
    InvalidArgument,
    LeaseLost,
    LeaseUnavailable,
    OutputTruncated,
    TenureError,
)
from ._hold import HeldLease, acquire_wait, hold, renew_many
from ._pubsub import Event, LeaseFence, PubSub
from ._url import default_url, from_url
from ._version import __version__ as __version__
from .runtime import Debounce, RuntimeEvent, SendResult, Signal, ThreadRun, ThreadRuntime

if TYPE_CHECKING:
    from .backends.memory import MemoryPubSub
    from .backends.sqlite import SqlitePubSub

__all__ = [
    "AcquireResult",
    "Backend",
    "BackendClosed",
    "BackendUnavailable",
    "Capability",
    "ConfigurationError",
    "Debounce",
    "Event",
    "EventBackend",
    "Fenced",
    "HeldLease",
    "InvalidArgument",
    "LeaseFence",
    "LeaseLost",
    "LeaseProvider",
    "LeaseRecord",
    "LeaseUnavailable",
    "MemoryPubSub",
    "NoopLeaseProvider",
    "OutputTruncated",
    "PubSub",
    "RefusalReason",
    "RuntimeEvent",
    "SendResult",
    "Signal",
    "SqlitePubSub",
    "TenureError",
    "ThreadRun",
    "ThreadRuntime",
    "acquire_wait",
    "capabilities_of",
    "default_url",
    "events_of",
    "from_url",
    "hold",
    "is_lease_provider",
    "lease_provider_for",
    "renew_many",
]


# A library never configures logging; without a handler of the application's,
# Python's last-resort handler would print tenure's warnings to stderr.
logging.getLogger("tenure").addHandler(logging.NullHandler())

_LAZY = {
    "MemoryPubSub": "tenure.backends.memory",
    "SqlitePubSub": "tenure.backends.sqlite",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name == "sync":  # the blocking API: loaded (never started) on first use
        return importlib.import_module("tenure.sync")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tenure' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def _show_as_tenure() -> None:
    # Errors show as tenure.InvalidArgument in tracebacks, not tenure._errors.InvalidArgument.
    for name in __all__:
        obj = globals().get(name)
        if isinstance(obj, type) and issubclass(obj, TenureError):
            obj.__module__ = "tenure"


_show_as_tenure()
