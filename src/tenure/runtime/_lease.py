"""A session's hold on its thread's lease: renewal, moves to the next holder, the token."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

from .._errors import LeaseLost, TenureError
from .._renewer import Renewer
from ._context import SessionContext
from ._identity import Holder
from ._log import RecordedLeases

__all__ = ["ThreadLease"]

logger = logging.getLogger("tenure.runtime")


class ThreadLease:
    """The lease of one thread while a session of this process holds it.

    It is kept by the same :class:`~tenure._renewer.Renewer` as
    :func:`tenure.hold`'s: one view of when it counts as lost (per-call time
    limit, deadline from the send). ``on_lost(reason)`` is called when it is.
    """

    def __init__(
        self,
        ctx: SessionContext,
        lease_key: str,
        holder: Holder,
        token: int | None,
        sent_at: float,
        on_lost: Callable[[str], None],
    ) -> None:
        self._ctx = ctx
        self.lease_key = lease_key
        self.holder = holder
        self.token = token
        self._on_lost = on_lost
        settings = ctx.settings
        self.renewer = Renewer(
            ctx.provider,
            lease_key,
            holder.owner,
            settings.ttl_ms,
            sent_at=sent_at,
            every=settings.renew_every,
            deadline=settings.renew_deadline,
            on_lost=self._lose,
        )
        self.lost = self.renewer.lost
        self.lost_reason = ""

    @property
    def owner(self) -> str:
        return self.holder.owner

    def why_not_held(self, owner: str) -> str | None:
        """Why ``owner`` does not hold the lease now (``None`` while it does)."""
        if self.holder.owner != owner:
            return f"it was handed over to run {self.holder.run_id}"
        if not self.renewer.check() or self.lost.is_set():
            return self.lost_reason or "lost"
        if self.renewer.finished:
            return "it was released"
        return None

    def _lose(self, reason: str) -> None:
        self.lost_reason = reason
        self._on_lost(reason)

    def count_lost(self, reason: str) -> None:
        """Count the lease lost without telling anyone (a session that failed to open)."""
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()

    async def open(self) -> None:
        """Move an "opening" lease to the session's first run (``LeaseLost`` if not held)."""
        ctx, to = self._ctx, self.holder.next()
        async with self.renewer.paused():
            sent = time.monotonic()
            if not self.renewer.check() or not await ctx.provider.transfer_lease(
                self.lease_key, self.owner, to.owner, ctx.settings.ttl_ms
            ):
                raise LeaseLost(self.lease_key, self.owner, "expired while opening")
            self._moved(to, sent)
            self.token = await self._read_token()

    async def hand_over(self) -> bool:
        """Move the lease to the session's next run; ``False`` (and lost) if it was not held."""
        ctx, to = self._ctx, self.holder.next()
        async with self.renewer.paused():
            if not self.renewer.check():
                return False
            sent = time.monotonic()
            try:
                ok = await ctx.provider.transfer_lease(
                    self.lease_key, self.owner, to.owner, ctx.settings.ttl_ms
                )
            except TenureError as exc:
                # The outcome is unknown: the transfer may have been applied.
                logger.warning("transfer of %r failed: %s", self.lease_key, exc)
                ok = False
            if not ok:
                try:
                    ok = await ctx.provider.get_lease_owner(self.lease_key) == to.owner
                except TenureError:
                    ok = False
            if not ok:
                self.renewer.lose("the lease was no longer held at hand-over")
                return False
            self._moved(to, sent)
            self.token = await self._read_token()
        return True

    def _moved(self, to: Holder, sent_at: float) -> None:
        """The lease now belongs to ``to`` (a transfer sent at ``sent_at`` succeeded)."""
        self.holder = to
        self.renewer.moved(to.owner, sent_at)

    async def _read_token(self) -> int | None:
        """The token of the lease after a transfer (``None`` without ``Capability.RECORD``)."""
        ctx = self._ctx
        if not ctx.records:
            return None
        try:
            record = await cast(RecordedLeases, ctx.provider).get_lease(self.lease_key)
        except TenureError:
            return None
        if record is None or record.owner != self.owner:
            return None
        return record.token

    async def release(self) -> bool:
        """Stop renewing and release; ``True`` when released while still held."""
        lost = self.lost.is_set()
        await self.renewer.stop(final=True)
        try:
            await self._ctx.provider.release_lease(self.lease_key, self.owner)
        except TenureError as exc:
            logger.warning("releasing %r failed: %s", self.lease_key, exc)
            return False
        return not lost
