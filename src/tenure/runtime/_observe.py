"""What the runtime tells observers: ``on_event`` callbacks and the event counter."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from .. import telemetry
from ._types import EventKind, OnEvent, RuntimeEvent

__all__ = ["Emit", "Observer"]

logger = logging.getLogger("tenure.runtime")


class Emit(Protocol):
    """Announce one step of the runtime (:meth:`Observer.emit`)."""

    def __call__(
        self,
        kind: EventKind,
        thread_key: str,
        *,
        run_id: str | None = None,
        token: int | None = None,
        signal_id: str | None = None,
        detail: str | None = None,
    ) -> None: ...


class Observer:
    """Emits :class:`RuntimeEvent` s of one process to its ``on_event`` callback."""

    __slots__ = ("_on_event", "_process_id")

    def __init__(self, process_id: str, on_event: OnEvent | None) -> None:
        self._process_id = process_id
        self._on_event = on_event

    def emit(
        self,
        kind: EventKind,
        thread_key: str,
        *,
        run_id: str | None = None,
        token: int | None = None,
        signal_id: str | None = None,
        detail: str | None = None,
    ) -> None:
        telemetry.count("tenure.runtime.events", {"tenure.runtime.event": kind})
        if self._on_event is None:
            return
        event = RuntimeEvent(
            kind=kind,
            thread_key=thread_key,
            process_id=self._process_id,
            at=time.monotonic(),
            run_id=run_id,
            token=token,
            signal_id=signal_id,
            detail=detail,
        )
        try:
            self._on_event(event)
        except (Exception, asyncio.CancelledError):
            # A synchronous callback cannot be cancelled: its CancelledError is its
            # own failure, and must not pass for the cancellation of whoever emits.
            logger.exception("on_event callback raised on %s", kind)
