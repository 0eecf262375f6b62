"""A session's side of the policies: what a newer signal does to the run and to the
signals waiting, whether the send was made here or elsewhere (a control request),
and the rollback it leaves for before the next run."""

from __future__ import annotations

import asyncio
import inspect
import logging

from .._pubsub import Event
from ._context import SessionContext
from ._inbox import Inbox
from ._policies import SendRule, overtake, rule_on_wire
from ._run import RunEnd, ThreadRun
from ._types import Signal

__all__ = ["Control"]

logger = logging.getLogger("tenure.runtime")


class Control:
    """Applies a send's rule to one session's thread (the rules are in ``_policies``)."""

    def __init__(self, ctx: SessionContext, thread_key: str) -> None:
        self._ctx = ctx
        self._thread_key = thread_key
        # The run an interrupting signal asked to roll back, until on_rollback ran.
        self._rollback: str | None = None

    def overtake(
        self,
        rule: SendRule,
        run: ThreadRun | None,
        task: asyncio.Task[RunEnd] | None,
        inbox: Inbox,
        signal_id: str,
        sent_at: float,
    ) -> None:
        cancelled = overtake(rule, run, task, inbox, signal_id, sent_at)
        if cancelled and rule.rolls_back and run is not None:
            self._rollback = run.run_id

    def asked(self, event: Event) -> tuple[SendRule, str, float] | None:
        """The rule, signal and send time a control request carries (``None``: not one).

        The sender's policy decides, not this runtime's default.
        """
        data = event.data if isinstance(event.data, dict) else {}
        signal_id, sent_at = data.get("signal"), data.get("sent_at")
        rule = rule_on_wire(data, self._ctx.rule) or self._ctx.rule
        if isinstance(signal_id, str) and isinstance(sent_at, int | float):
            return rule, signal_id, float(sent_at)
        return None

    async def roll_back(self) -> None:
        """Before the next run: remove the effects of a run a ``rollback`` signal interrupted."""
        run_id, self._rollback = self._rollback, None
        hook = self._ctx.settings.on_rollback
        if run_id is None or hook is None:
            return
        detail = "ok"
        try:
            result = hook(self._thread_key, run_id)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            logger.exception("on_rollback of run %s (thread %r) raised", run_id, self._thread_key)
            detail = f"failed: {type(exc).__name__}"
        self._ctx.emit("rollback", self._thread_key, run_id=run_id, detail=detail)

    def skipped(self, run_id: str, signal: Signal) -> None:
        self._ctx.emit(
            "interrupted", self._thread_key, run_id=run_id, signal_id=signal.id, detail="skipped"
        )

    def discarded(self, run_id: str, signal_id: str) -> None:
        self._ctx.emit(
            "discarded", self._thread_key, run_id=run_id, signal_id=signal_id, detail="run busy"
        )

    def coalesced(self, run_id: str, signal_id: str, into: str) -> None:
        self._ctx.emit(
            "coalesced", self._thread_key, run_id=run_id, signal_id=signal_id, detail=f"into {into}"
        )
