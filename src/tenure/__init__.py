"""tenure: distributed leases with fencing tokens, pub/sub, and a thread runtime."""

from ._contract import AcquireResult, LeaseProvider, LeaseRecord
from ._detect import NoopLeaseProvider, is_lease_provider, lease_provider_for
from ._errors import (
    BackendClosed,
    BackendUnavailable,
    ConfigurationError,
    InvalidArgument,
    LeaseLost,
    LeaseUnavailable,
    TenureError,
)
from ._hold import HeldLease, acquire_wait, hold, renew_many
from ._pubsub import Event, PubSub
from ._url import default_url, from_url
from .backends.memory import MemoryPubSub
from .backends.sqlite import SqlitePubSub
from .runtime import RuntimeEvent, SendResult, Signal, ThreadRun, ThreadRuntime

__all__ = [
    "AcquireResult",
    "BackendClosed",
    "BackendUnavailable",
    "ConfigurationError",
    "Event",
    "HeldLease",
    "InvalidArgument",
    "LeaseLost",
    "LeaseProvider",
    "LeaseRecord",
    "LeaseUnavailable",
    "MemoryPubSub",
    "NoopLeaseProvider",
    "PubSub",
    "RuntimeEvent",
    "SendResult",
    "Signal",
    "SqlitePubSub",
    "TenureError",
    "ThreadRun",
    "ThreadRuntime",
    "acquire_wait",
    "default_url",
    "from_url",
    "hold",
    "is_lease_provider",
    "lease_provider_for",
    "renew_many",
]

__version__ = "0.1.0"
