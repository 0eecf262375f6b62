"""A session's hold on its thread's lease: renewal, moves to the next holder, the token."""

from __future__ import annotations

import asyncio
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
    limit, deadline from the send). Its renewals go with those of every other
    thread lease of the process, in one call per renew interval
    (``ctx.renewals``). ``on_lost(reason)`` is called when it is lost.
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
            renewals=ctx.renewals,
        )
        self.lost = self.renewer.lost
        self.lost_reason = ""
        # The holder a move under way (or of unknown outcome) hands the lease to.
        self._moving: Holder | None = None

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
            self._moving = to
            if not self.renewer.check() or not await ctx.provider.transfer_lease(
                self.lease_key, self.owner, to.owner, ctx.settings.ttl_ms
            ):
                self._moving = None
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
            # Until its outcome is known, the lease may be ``to``'s: whoever ends
            # this session meanwhile (aclose) releases it under both names.
            self._moving = to
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
                    ok = False  # still unknown: ``to`` stays to be released
                else:
                    self._moving = to if ok else None  # known now
            if not ok:
                self.renewer.lose("the lease was no longer held at hand-over")
                return False
            self._moved(to, sent)
            try:
                self.token = await self._read_token()
            except LeaseLost as exc:
                self.renewer.lose(exc.reason)
                return False
        return True

    def _moved(self, to: Holder, sent_at: float) -> None:
        """The lease now belongs to ``to`` (a transfer sent at ``sent_at`` succeeded)."""
        self.holder = to
        self._moving = None
        self.renewer.moved(to.owner, sent_at)

    async def _read_token(self) -> int | None:
        """The token of the lease just moved to this holder (``None`` on a provider without
        tokens or without ``Capability.RECORD``).

        Never guessed: a read that fails is tried again while the lease counts as
        held. Raises ``LeaseLost`` when it cannot be read in that time, or names
        another holder.
        """
        ctx = self._ctx
        if not ctx.records or self.token is None:
            return None  # a provider without tokens (its grant carried none)
        leases = cast(RecordedLeases, ctx.provider)
        pause = 0.005
        while True:
            try:
                record = await leases.get_lease(self.lease_key)
            except TenureError as exc:
                if not self.renewer.check():
                    raise LeaseLost(
                        self.lease_key, self.owner, f"its token could not be read: {exc}"
                    ) from exc
                logger.warning("reading the token of %r failed, again: %s", self.lease_key, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.2)
                continue
            if record is None or record.owner != self.owner:
                raise LeaseLost(self.lease_key, self.owner, "it was gone right after its transfer")
            return record.token

    async def release(self) -> bool:
        """Stop renewing and release; ``True`` when released while still held.

        A move whose outcome is unknown (cut short, or unanswered) may have
        given the lease to the next holder's name: that name is released too.
        """
        lost = self.lost.is_set()
        await self.renewer.stop(final=True)
        owners = [self.owner] if self._moving is None else [self.owner, self._moving.owner]
        released = not lost
        for owner in owners:
            try:
                await self._ctx.provider.release_lease(self.lease_key, owner)
            except TenureError as exc:
                logger.warning("releasing %r failed: %s", self.lease_key, exc)
                released = False
        self._moving = None
        return released
