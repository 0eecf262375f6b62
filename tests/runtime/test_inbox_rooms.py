"""The inbox's rooms on their own: what skipping, discarding, coalescing and
debouncing do to the signals waiting in a buffer, in log order, with no backend.

The end-to-end behaviour of each policy is in ``test_policies*.py``; these pin
the branches a run of the runtime reaches only under rare orderings (a request
before its signal, two coalescing requests in flight, a redelivered signal).
"""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from tenure import Signal
from tenure._pubsub import Event
from tenure.runtime._coalesce import Carry
from tenure.runtime._debounce import KEPT, Debounce
from tenure.runtime._inbox import Inbox
from tenure.runtime._log import SIGNAL_TYPE
from tenure.runtime._pending import Pending
from tenure.runtime._skips import Skips


def signal(sid: str, sent_at: float = 0.0) -> Signal:
    return Signal(sid, "t", sid, sent_at)


def waiting(*sids: str) -> deque[Pending]:
    return deque(Pending(signal(sid, float(n))) for n, sid in enumerate(sids))


def ids(buffer: deque[Pending]) -> list[str]:
    return [p.signal.id for p in buffer]


class Recorder:
    def __init__(self) -> None:
        self.coalesced: list[tuple[str, str]] = []
        self.skipped: list[str] = []
        self.discarded: list[str] = []
        self.put: list[Pending] = []


def carry_of(
    buffer: deque[Pending], inflight: dict[str, Pending] | None = None
) -> tuple[Carry, Recorder]:
    seen = Recorder()
    carry = Carry(
        buffer,
        {} if inflight is None else inflight,
        lambda sid, into: seen.coalesced.append((sid, into)),
        seen.put.append,
    )
    return carry, seen


def skips_of(
    buffer: deque[Pending], inflight: dict[str, Pending] | None = None
) -> tuple[Skips, Recorder]:
    seen = Recorder()
    skips = Skips(
        buffer,
        {} if inflight is None else inflight,
        lambda s: seen.skipped.append(s.id),
        seen.discarded.append,
    )
    return skips, seen


# -- coalescing ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_coalescing_signal_that_waits_takes_the_ones_before_it() -> None:
    buffer = waiting("a", "b", "c", "d")
    carry, seen = carry_of(buffer)
    carry.through("c", 2.0)
    assert ids(buffer) == ["c", "d"]
    assert [s.id for s in buffer[0].signal.coalesced] == ["a", "b"]
    assert seen.coalesced == [("a", "c"), ("b", "c")]
    assert not carry.carrying


@pytest.mark.asyncio
async def test_a_coalescing_request_before_its_signal_carries_what_is_read_until_it() -> None:
    buffer = waiting("a")
    carry, seen = carry_of(buffer)
    carry.through("c", 10.0)  # c is later in the log than everything read so far
    assert ids(buffer) == []
    assert carry.carrying
    assert carry.arrived(signal("b", 1.0)) is None  # read before c: carried too
    arrived = carry.arrived(signal("c", 2.0))
    assert arrived is not None
    assert [s.id for s in arrived.coalesced] == ["a", "b"]
    assert seen.coalesced == [("a", "c"), ("b", "c")]
    assert not carry.carrying


@pytest.mark.asyncio
async def test_with_a_later_coalescing_signal_still_to_come_one_that_waits_is_carried_too() -> None:
    # Requests for d (not read yet) and then for e (waiting): e is carried into d
    # with what waits before it; what waits after e stays.
    buffer = waiting("a", "b", "c")
    carry, seen = carry_of(buffer)
    carry.through("d", 10.0)
    assert ids(buffer) == []
    buffer.extend(waiting("x", "e", "y"))
    carry.through("e", 1.0)
    assert ids(buffer) == ["y"]
    arrived = carry.arrived(signal("d", 3.0))
    assert arrived is not None
    assert [s.id for s in arrived.coalesced] == ["a", "b", "c", "x", "e"]
    assert [into for _, into in seen.coalesced] == ["d"] * 5


@pytest.mark.asyncio
async def test_a_request_for_a_signal_carried_already_changes_nothing() -> None:
    buffer = waiting("a", "b")
    carry, seen = carry_of(buffer)
    carry.through("z", 10.0)
    assert ids(buffer) == []
    buffer.extend(waiting("c"))
    carry.through("a", 0.0)  # a was carried into z: its own request comes late
    assert ids(buffer) == ["c"]
    assert seen.coalesced == []


@pytest.mark.asyncio
async def test_a_request_for_the_signal_being_handled_carries_nothing() -> None:
    buffer = waiting("b")
    handled = Pending(signal("a"))
    carry, seen = carry_of(buffer, {"a": handled})
    carry.through("a", 0.0)
    assert ids(buffer) == ["b"]
    assert not carry.carrying and seen.coalesced == []


@pytest.mark.asyncio
async def test_a_coalescing_signal_that_never_comes_lets_the_newest_carried_run() -> None:
    buffer = waiting("a", "b")
    carry, seen = carry_of(buffer)
    carry.through("gone", 0.0)
    carry._end()  # the grace period ran out with nothing read (its timer's callback)
    assert [p.signal.id for p in seen.put] == ["b"]
    assert [s.id for s in seen.put[0].signal.coalesced] == ["a"]
    assert seen.put[0].how is None
    assert not carry.carrying
    carry.drop("t")  # nothing left to drop


@pytest.mark.asyncio
async def test_a_signal_sent_long_after_the_requested_one_ends_the_wait_for_it() -> None:
    buffer = waiting()
    carry, _ = carry_of(buffer)
    carry.through("late", 100.0)
    assert carry.arrived(signal("a", 105.0)) is None  # within 10 s: still waited for
    arrived = carry.arrived(signal("b", 111.0))  # over 10 s later: it went elsewhere
    assert arrived is not None
    assert [s.id for s in arrived.coalesced] == ["a"]


@pytest.mark.asyncio
async def test_what_is_carried_when_the_session_ends_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    buffer = waiting("a", "b")
    carry, _ = carry_of(buffer)
    carry.through("z", 10.0)
    carry.drop("t")
    assert not carry.carrying
    assert "2 signal(s) carried into a coalescing signal not yet read" in caplog.text
    assert "a, b" in caplog.text


# -- skips and discards -----------------------------------------------------------


def test_a_request_skips_what_waits_before_its_signal() -> None:
    buffer = waiting("a", "b", "c")
    skips, seen = skips_of(buffer)
    skipped = skips.through("b", 1.0)
    assert [p.signal.id for p in skipped] == ["a"]
    assert all(p.how == "ack" for p in skipped)
    assert ids(buffer) == ["b", "c"]
    assert seen.skipped == ["a"]  # each one told, not only counted


def test_a_request_before_its_signal_skips_what_was_sent_before_it_and_arrives_until_it() -> None:
    buffer = waiting("a", "b", "c")  # sent at 0, 1, 2
    skips, seen = skips_of(buffer)
    skipped = skips.through("z", 1.0)
    assert [p.signal.id for p in skipped] == ["a", "b"]
    assert ids(buffer) == ["c"]
    assert skips.settles(signal("d", 0.5))  # sent before z, arriving after the request
    assert seen.skipped == ["a", "b", "d"]
    assert not skips.settles(signal("e", 2.0))  # sent after z: back to normal
    assert not skips.settles(signal("f", 0.5))


def test_the_requesting_signal_itself_ends_the_skip() -> None:
    skips, seen = skips_of(waiting())
    skips.through("z", 5.0)
    assert not skips.settles(signal("z", 5.0))
    assert not skips.settles(signal("y", 1.0))
    assert seen.skipped == []


def test_a_request_for_a_signal_being_handled_skips_only_what_was_sent_before_it() -> None:
    buffer = waiting("a", "b")
    skips, _ = skips_of(buffer, {"h": Pending(signal("h"))})
    skipped = skips.through("h", 0.0)
    assert [p.signal.id for p in skipped] == ["a"]
    assert not skips.settles(signal("x", -1.0))  # no skip remembered for later arrivals


def test_discard_settles_a_waiting_signal_now_and_a_coming_one_when_it_arrives() -> None:
    buffer = waiting("a", "b")
    skips, seen = skips_of(buffer)
    skips.discard("b", taken=False)
    assert ids(buffer) == ["a"]
    skips.discard("c", taken=False)
    assert skips.settles(signal("c"))
    assert not skips.settles(signal("c"))  # once
    assert seen.discarded == ["b", "c"]
    assert skips.discarded == 2


def test_discard_leaves_a_signal_a_run_took_or_holds() -> None:
    skips, seen = skips_of(waiting(), {"held": Pending(signal("held"))})
    skips.discard("taken", taken=True)
    skips.discard("held", taken=False)
    assert not skips.settles(signal("taken"))
    assert not skips.settles(signal("held"))
    assert seen.discarded == [] and skips.discarded == 0


# -- debouncing ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_quiet_window_starts_again_with_each_signal_heard_of() -> None:
    debounce = Debounce(lambda sid, into: None)
    loop = asyncio.get_running_loop()
    debounce.heard("a", 5.0, known=True)
    first = loop.time()
    assert not debounce.quiet(first + 4.9)
    assert debounce.quiet(first + 5.1)
    debounce.heard("a", 5.0, known=True)  # the same signal again: no new window
    assert debounce.quiet(first + 5.1)
    await asyncio.sleep(0.01)
    debounce.heard("b", 1.0, known=True)  # a newer one: its window, from now
    assert not debounce.quiet(loop.time() + 0.9)
    assert debounce.hold_until(buffered=True) == pytest.approx(loop.time() + 1.0, abs=0.05)


@pytest.mark.asyncio
async def test_a_signal_announced_by_its_request_is_waited_for_until_it_arrives() -> None:
    debounce = Debounce(lambda sid, into: None)
    debounce.heard("a", 2.0, known=False)  # its request came first
    assert debounce.announcing
    debounce.arrived("a", 2.0)
    assert not debounce.announcing
    debounce.heard("b", 2.0, known=True)  # delivered already: not announced
    assert not debounce.announcing
    debounce.heard("c", 2.0, known=False)
    debounce.give_up_announced()
    assert not debounce.announcing


@pytest.mark.asyncio
async def test_held_signals_wait_longer_when_nothing_is_buffered() -> None:
    debounce = Debounce(lambda sid, into: None)
    loop = asyncio.get_running_loop()
    debounce.heard("a", 0.5, known=True)
    quiet = loop.time() + 0.5
    assert debounce.hold_until(buffered=False) == pytest.approx(quiet, abs=0.05)  # none held
    debounce.keep(signal("a"))
    assert debounce.hold_until(buffered=True) == pytest.approx(quiet, abs=0.05)
    # Nothing buffered, one held: wait for the announced ones a while more (at least 1 s).
    assert debounce.hold_until(buffered=False) == pytest.approx(quiet + 1.0, abs=0.05)
    debounce.heard("b", 3.0, known=True)
    assert debounce.hold_until(buffered=False) == pytest.approx(loop.time() + 6.0, abs=0.05)


def test_the_newest_held_signal_runs_with_the_older_ones() -> None:
    told: list[tuple[str, str]] = []
    debounce = Debounce(lambda sid, into: told.append((sid, into)))
    older = Signal("b", "t", "b", 1.0, coalesced=(signal("a"),))
    debounce.keep(older)
    debounce.keep(signal("c"))
    assert [s.id for s in debounce.held] == ["a", "b", "c"]
    released = debounce.release()
    assert released.how == "ack"  # acknowledged when they were held
    assert released.signal.id == "c"
    assert [s.id for s in released.signal.coalesced] == ["a", "b"]
    assert told == [("a", "c"), ("b", "c")]
    assert debounce.held == []
    assert debounce.hand(signal("d")) == signal("d")  # nothing held: unchanged


def test_held_signals_are_dropped_with_a_warning_when_the_session_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    debounce = Debounce(lambda sid, into: None)
    debounce.keep(signal("a"))
    debounce.drop("t")
    assert debounce.held == []
    assert "1 debounced signal(s) acknowledged but not yet run are dropped" in caplog.text


@pytest.mark.asyncio
async def test_the_signals_heard_of_and_announced_are_remembered_up_to_a_bound() -> None:
    debounce = Debounce(lambda sid, into: None)
    loop = asyncio.get_running_loop()
    for n in range(KEPT + 1):
        debounce.heard(str(n), 1.0, known=False)
    # The oldest is forgotten: heard of again, it starts a window of its own.
    debounce.heard("0", 100.0, known=True)
    assert not debounce.quiet(loop.time() + 50)
    # The oldest announced one is forgotten too: when the others arrive, none is awaited.
    for n in range(1, KEPT + 1):
        debounce.arrived(str(n), 1.0)
    assert not debounce.announcing


# -- one request settling the signal another waits for -----------------------------
#
# Found by the thread harness's policy mix (python -m safety threads --workload
# policies, no faults): a coalescing request whose signal an interrupt then
# skipped left the carry waiting for it; the interrupting signal, read next, was
# carried into it, and the session, seeing nothing to run, closed and dropped it.


def inbox_of(seen: Recorder) -> Inbox:
    return Inbox(
        "t",
        "sid",
        lambda: True,
        asyncio.Event(),
        lambda s: seen.skipped.append(s.id),
        lambda sid, into: seen.coalesced.append((sid, into)),
        seen.discarded.append,
        wakes=lambda data: True,
        awake=True,
    )


def arriving(sid: str, sent_at: float) -> Event:
    return Event(SIGNAL_TYPE, {"thread": "t", "payload": sid}, id=sid, created_at=sent_at)


@pytest.mark.asyncio
async def test_an_interrupt_skips_what_was_carried_and_the_coalescing_signal_it_waited_for() -> (
    None
):
    seen = Recorder()
    inbox = inbox_of(seen)
    inbox.carry_through("c", 5.0)  # c's request came before c
    assert inbox._admit(arriving("x", 1.0)) is None  # carried into c, acknowledged
    skipped = inbox.skip_through("i", 6.0)  # i's request: everything read was before i
    assert [s.id for s in skipped] == ["x"]
    assert seen.skipped == ["x"]  # told, though acknowledged when carried
    assert inbox._admit(arriving("c", 5.0)) is None  # sent before i: skipped
    assert seen.skipped == ["x", "c"]
    pending = inbox._admit(arriving("i", 6.0))  # not carried into c, which is gone
    assert pending is not None and pending.signal.id == "i"
    assert pending.signal.coalesced == ()
    assert inbox.has_work
    assert not seen.coalesced
    assert (inbox.skipped, inbox.coalesced) == (2, 0)  # counted for ThreadStatus


@pytest.mark.asyncio
async def test_a_skipped_coalescing_signal_carries_nothing_more() -> None:
    seen = Recorder()
    inbox = inbox_of(seen)
    inbox.skip_through("i", 6.0)
    inbox.carry_through("c", 5.0)
    assert inbox._admit(arriving("c", 5.0)) is None  # skipped by i: forgotten by the carry
    pending = inbox._admit(arriving("i", 6.0))
    assert pending is not None and pending.signal.coalesced == ()


@pytest.mark.asyncio
async def test_carried_signals_whose_coalescing_signal_does_not_come_run_before_the_session_closes() -> (
    None
):
    seen = Recorder()
    inbox = inbox_of(seen)
    inbox.carry_through("c", 5.0)  # c went to another owner: it will not come here
    assert inbox._admit(arriving("a", 1.0)) is None
    assert inbox._admit(arriving("b", 2.0)) is None
    assert not inbox.has_work  # nothing buffered: the session would close
    assert inbox.end_carry()  # its close marker was read back: nothing more comes
    assert inbox.has_work
    (head,) = inbox.buffer
    assert head.signal.id == "b" and [s.id for s in head.signal.coalesced] == ["a"]
    assert seen.coalesced == [("a", "b")]
    assert (inbox.skipped, inbox.coalesced) == (0, 1)
    assert not inbox.end_carry()  # nothing carried any more


@pytest.mark.asyncio
async def test_an_interrupt_skips_the_debounced_signals_held_for_a_newer_one() -> None:
    seen = Recorder()
    inbox = inbox_of(seen)
    inbox._debounce.keep(signal("a", 1.0))  # acknowledged to read a newer one
    assert inbox.has_work
    skipped = inbox.skip_through("i", 6.0)
    assert [s.id for s in skipped] == ["a"] and seen.skipped == ["a"]
    assert not inbox.held and not inbox.has_work


@pytest.mark.asyncio
async def test_a_debounced_signal_an_interrupt_skipped_is_no_longer_waited_for() -> None:
    seen = Recorder()
    inbox = inbox_of(seen)
    inbox.heard("d", 0.5)  # d's request came first: d is announced
    assert inbox._debounce.announcing
    inbox.skip_through("i", 6.0)
    assert inbox._admit(arriving("d", 5.0)) is None  # sent before i: skipped
    assert not inbox._debounce.announcing  # a later held signal does not wait for it
