"""The safety margin: a holder stops believing it holds a lease before anyone else can get it.

Three ways to lose the margin, each guarded here and elsewhere (TESTING.md lists
which tests catch which planted bug):

- a renew deadline as long as the TTL: the holder would act until the very
  moment the backend can grant the key to someone else;
- a renewal whose success arrives after the deadline taken as a success: the
  holder acted unsure of its lease in between;
- renewals that fail or hang retried forever: only a look at the clock
  (``held``, ``ensure_held``) would tell the holder, and nothing cancels it.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import tenure
from safety.proxy import Proxy
from tenure import MemoryPubSub
from tenure._renewer import Renewer
from tenure.testing import ManualClock, eventually

from ..support.redis_server import RedisServer
from .support import LateRenewal, stall

TTL_MS = 1500  # the deadline is 1000 ms: a third of the TTL is the margin


@pytest.mark.asyncio
async def test_a_holder_cut_off_from_redis_gives_up_while_the_server_still_has_its_lease() -> None:
    with RedisServer() as server:
        async with Proxy("127.0.0.1", server.port) as proxy:
            options = "quarantine=false&prefix=margin:"
            cut_off = tenure.from_url(f"redis://127.0.0.1:{proxy.port}/0?{options}")
            observer = tenure.from_url(f"{server.url}?{options}")
            async with cut_off, observer:
                lease = await tenure.hold(cut_off, "k", "a", TTL_MS).start()
                try:
                    proxy.set_mode("blackhole")  # renewals now hang
                    await asyncio.wait_for(lease.lost.wait(), 10)
                    # Read at once, directly: the server still holds a's lease, with
                    # (about) the third of the TTL that separates the deadline from
                    # the expiry left. Half of that is asked for here.
                    record = await observer.get_lease("k")
                finally:
                    proxy.set_mode("pass")
                    # Healing resets the connections that lost bytes: the release may
                    # be the call that finds out (the server goes away with the test).
                    with contextlib.suppress(tenure.BackendUnavailable):
                        await lease.release()
    assert "renew deadline" in (lease.lost_reason or "")
    assert record is not None and record.owner == "a", record
    assert record.ttl_ms >= TTL_MS // 6, record


@pytest.mark.asyncio
async def test_a_renewal_that_succeeds_after_the_deadline_loses_the_lease() -> None:
    async with MemoryPubSub() as memory:
        late = LateRenewal(memory)
        lease = await tenure.hold(
            late, "k", "a", 3000, renew_every_ms=100, renew_deadline_ms=400, cancel_on_loss=False
        ).start()
        try:
            # The first renewal is sent 100 ms or more after the grant and succeeds,
            # but the process stalls before seeing it: it is seen 450 ms or more
            # after the grant (past the 400 ms deadline), yet within 400 ms of its
            # own send, so taking it as a success would keep the lease "held".
            late.then = lambda: stall(0.35)
            await asyncio.wait_for(lease.lost.wait(), 5)
            assert late.late == 1
            assert "succeeded only after" in (lease.lost_reason or "")
            assert not lease.held
        finally:
            await lease.release()


# -- the renewer on an injected clock: no real time in the decision -----------------


async def _renew_late(reply_after_ms: float) -> tuple[Renewer, LateRenewal]:
    """A renewer (every 1 s, deadline 2 s) whose first renewal's reply is seen late."""
    clock = ManualClock()
    memory = MemoryPubSub()
    assert (await memory.acquire_lease("k", "a", 60_000)).acquired
    late = LateRenewal(memory)
    renewer = Renewer(late, "k", "a", 60_000, sent_at=clock(), every=1.0, deadline=2.0, clock=clock)
    clock.advance_ms(1000)  # the first renewal is due: it is sent at once, at 1 s
    late.then = lambda: clock.advance_ms(reply_after_ms)
    renewer.start()
    return renewer, late


@pytest.mark.asyncio
async def test_the_renewer_counts_a_success_seen_after_the_deadline_as_a_loss() -> None:
    # Seen at 2.5 s: past the deadline (2 s), before 1 s + 2 s.
    renewer, late = await _renew_late(1500)
    try:
        await asyncio.wait_for(renewer.lost.wait(), 5)
    finally:
        await renewer.stop()
        await late.inner.aclose()
    assert late.late == 1
    assert "succeeded only after" in (renewer.reason or "")
    assert not renewer.check()


@pytest.mark.asyncio
async def test_the_renewer_keeps_a_lease_whose_renewal_is_seen_before_the_deadline() -> None:
    # Seen at 1.9 s: in time; the deadline moves to 1 s + 2 s from the grant.
    renewer, late = await _renew_late(900)
    try:
        # Taken as a success: valid from its send (at 1 s), deadline at 3 s.
        await eventually(lambda: late.late == 1 and renewer.valid_from >= 1001.0)
        assert renewer.check() and not renewer.lost.is_set()
    finally:
        await renewer.stop()
        await late.inner.aclose()
