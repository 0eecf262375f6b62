"""Replies: a thread's output stream, written by its run under the lease, read from anywhere.

The run appends items (``run.append``); the runtime writes the lifecycle items
itself (:data:`LIFECYCLE`). Every append is *fenced*: the backend stores it only
if the writer's owner and token are the lease's current ones, checked in the
same atomic step as the append (a Lua script, one SQL statement), so a stale
run's items never land and it gets :class:`~tenure.Fenced`. Positions are
``1, 2, 3, ...`` per thread with no gap, so a reader that resumes after the
last position it saw reads the rest exactly once and in order, and knows when
retention cut what it asked for (:class:`~tenure.OutputTruncated`).

The backends' stores (``backends/<name>/_output.py``) keep only
``(position, body)``; this module encodes, decodes and judges.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import (
    ConfigurationError,
    InvalidArgument,
)
from .._output import OutputStore, Retention, WriteFence

if TYPE_CHECKING:
    pass

__all__ = [
    "CANCEL",
    "LIFECYCLE",
    "OutputItem",
    "OutputStore",
    "Retention",
    "WriteFence",
    "store_for",
]

logger = logging.getLogger("tenure.runtime")

#: Items the runtime writes itself. ``run_started`` (data: owner, token,
#: process), ``signal_taken``, ``signal_finished``, ``run_ended`` (data: ``end``,
#: one of ``ok``, ``failed``, ``interrupted``, ``cancelled``), ``run_lost``
#: (written by the next owner for a run that stopped without ``run_ended``:
#: killed, paused or cut off; data: its ``run_id``), ``cancel`` (a cancel
#: request reached the run; data: who asked).
LIFECYCLE = frozenset(
    {"run_started", "signal_taken", "signal_finished", "run_ended", "run_lost", "cancel"}
)

#: A cancel request, on a thread's cancel topic (``{"run_id": ..., "by": ...}``).
CANCEL = "tenure.runtime.cancel"

#: Ends after which a signal is not run again: its reply is complete.
_FINAL_ENDS = frozenset({"interrupted"})


@dataclass(frozen=True, slots=True)
class OutputItem:
    """One item of a thread's output.

    ``position`` strictly increases per thread, without gaps. ``run_id`` and
    ``token`` are the writer's (its lease's fencing token); ``signal_id`` the
    signal the item answers (``None`` outside a signal). ``kind`` is the
    writer's (``"token"``, ``"tool"``, ``"final"``, ...) or one of
    :data:`LIFECYCLE`. ``data`` is what was appended (a JSON value, or
    ``bytes``). ``at`` is the writer's wall clock (seconds since the epoch).
    """

    position: int
    thread_key: str
    run_id: str
    token: int | None
    signal_id: str | None
    kind: str
    data: Any
    at: float


# -- encoding: pure ---------------------------------------------------------------------


def encode(
    run_id: str, token: int | None, signal_id: str | None, kind: str, data: Any, at: float
) -> str:
    """One item's body (JSON); ``bytes`` data is carried as base64."""
    doc: dict[str, Any] = {"r": run_id, "t": token, "s": signal_id, "k": kind, "a": at}
    if isinstance(data, bytes | bytearray | memoryview):
        doc["b"] = base64.b64encode(bytes(data)).decode("ascii")
    else:
        doc["d"] = data
    try:
        return json.dumps(doc, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"output data must be JSON-serialisable or bytes: {exc}") from exc


def decode(thread_key: str, position: int, body: str) -> OutputItem:
    doc = json.loads(body)
    data = base64.b64decode(doc["b"]) if "b" in doc else doc.get("d")
    return OutputItem(
        position, thread_key, doc["r"], doc["t"], doc["s"], doc["k"], data, float(doc["a"])
    )


def check_kind(kind: str) -> None:
    if not isinstance(kind, str) or not kind:
        raise InvalidArgument(f"kind must be a non-empty str, got {kind!r}")
    if kind in LIFECYCLE:
        raise InvalidArgument(f"kind {kind!r} is written by the runtime only")


def check_after(after: int) -> None:
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise InvalidArgument(f"after must be a position (an int >= 0), got {after!r}")


def ends_reply(item: OutputItem, signal_id: str) -> bool:
    """Whether ``item`` completes the reply to ``signal_id`` (it will not run again)."""
    if item.signal_id != signal_id:
        return False
    if item.kind == "signal_finished":
        return True
    return (
        item.kind == "run_ended"
        and isinstance(item.data, dict)
        and (item.data.get("end") in _FINAL_ENDS)
    )


# -- which store a backend gets ------------------------------------------------------------


def store_for(backend: object, provider: object) -> OutputStore:
    """A new output store on ``backend`` (closed by its runtime), or ``ConfigurationError``.

    A backend that can keep output offers ``output_store()``. Its stores fence
    with the backend's own lease records, so the lease provider must be the
    backend itself.
    """
    make = getattr(backend, "output_store", None)
    if provider is backend and callable(make):
        store: OutputStore = make()
        return store
    raise ConfigurationError(
        f"{type(backend).__name__} cannot keep thread output: replies need a backend that "
        "carries events and holds the leases itself (memory, SQLite, Redis, PostgreSQL)"
    )
