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
from ._pubsub import Event, PubSub
from ._url import default_url, from_url
from .backends.memory import MemoryPubSub

__all__ = [
    "AcquireResult",
    "BackendClosed",
    "BackendUnavailable",
    "ConfigurationError",
    "Event",
    "InvalidArgument",
    "LeaseLost",
    "LeaseProvider",
    "LeaseRecord",
    "LeaseUnavailable",
    "MemoryPubSub",
    "NoopLeaseProvider",
    "PubSub",
    "TenureError",
    "default_url",
    "from_url",
    "is_lease_provider",
    "lease_provider_for",
]

__version__ = "0.1.0"
