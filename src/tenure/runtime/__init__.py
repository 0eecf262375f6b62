"""The thread runtime: one run per conversation thread across processes.

See :mod:`tenure.runtime._runtime` for the design and its guarantees.
"""

from ._output import LIFECYCLE, OutputItem, Retention
from ._runtime import ThreadRun, ThreadRuntime
from ._status import ThreadStatus
from ._types import Debounce, EventKind, Outcome, Policy, RuntimeEvent, SendResult, Signal

__all__ = [
    "LIFECYCLE",
    "Debounce",
    "EventKind",
    "Outcome",
    "OutputItem",
    "Policy",
    "Retention",
    "RuntimeEvent",
    "SendResult",
    "Signal",
    "ThreadRun",
    "ThreadRuntime",
    "ThreadStatus",
]
