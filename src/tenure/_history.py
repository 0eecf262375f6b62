"""The two checks every lease history must pass: one owner at a time, and rising tokens.

Written once and used by both judges of recorded evidence: ``tenure demo``'s
verdict (runs of a thread, recorded by worker processes) and the repository's
safety harness (safe windows derived from lease operations). Each caller turns
its own evidence into :class:`Window` and :class:`Sighting` values and words
the problems for its readers; what counts as a problem is decided here.

Pure computation, no I/O: O(n log n) in the number of windows or sightings.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Handoff", "Sighting", "TokenClash", "Window", "handoffs", "token_clashes"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Window(Generic[T]):
    """``owner`` held the lease, as far as the evidence proves, from ``start`` to ``end``.

    Windows of one owner may overlap each other (a renewal extends a window);
    windows of two owners must not. ``item`` is the caller's evidence for it.
    """

    start: float
    end: float
    owner: Hashable
    item: T


@dataclass(frozen=True, slots=True)
class Handoff(Generic[T]):
    """``after`` began while or after ``before`` was the latest-ending window of another owner."""

    before: Window[T]
    after: Window[T]

    @property
    def gap(self) -> float:
        """Time from ``before``'s end to ``after``'s start; negative: two owners at once."""
        return self.after.start - self.before.end


def handoffs(windows: Iterable[Window[T]]) -> list[Handoff[T]]:
    """Each window (in start order) paired with the latest-ending earlier window of another owner.

    A pair with a negative :attr:`Handoff.gap` is an exclusivity violation. A
    window that follows only windows of its own owner has no pair. Sweeps the
    windows once, keeping the latest-ending windows of two distinct owners:
    whatever the new window's owner, one of them is its predecessor.
    """
    out: list[Handoff[T]] = []
    best: list[Window[T]] = []  # latest end first, distinct owners, at most two
    for window in sorted(windows, key=lambda w: w.start):
        before = next((b for b in best if b.owner != window.owner), None)
        if before is not None:
            out.append(Handoff(before, window))
        candidates = sorted([window, *best], key=lambda w: -w.end)
        best = []
        for c in candidates:
            if all(c.owner != b.owner for b in best):
                best.append(c)
            if len(best) == 2:
                break
    return out


@dataclass(frozen=True, slots=True)
class Sighting(Generic[T]):
    """An operation that ran from ``inv`` to ``ret`` saw ``owner`` holding ``token``.

    A point in time (a run that started at ``t``) is ``inv == ret == t``.
    """

    inv: float
    ret: float
    owner: Hashable
    token: int
    item: T


@dataclass(frozen=True, slots=True)
class TokenClash(Generic[T]):
    """Two sightings that no correct backend can produce.

    ``shared``: ``earlier`` and ``later`` show one token held by two owners.
    Otherwise ``later``'s token was first seen after ``earlier``, whose token is
    equal or higher, had already been returned: tokens went back or stood still.
    """

    earlier: Sighting[T]
    later: Sighting[T]
    shared: bool


def token_clashes(sightings: Iterable[Sighting[T]]) -> list[TokenClash[T]]:
    """Fencing tokens strictly increase in real-time order, and each names one owner.

    An *identity* is an (owner, token) pair; it is first invoked at its
    earliest sighting's ``inv`` and known at its earliest ``ret``. For every
    identity B, no identity with an equal or higher token may have been known
    before B was first invoked. Overlapping sightings are not ordered, so
    concurrent operations never clash by accident of timing.
    """
    out: list[TokenClash[T]] = []
    owner_of: dict[int, Sighting[T]] = {}
    # identity -> (its first-invoked sighting, its earliest-returned sighting)
    first: dict[tuple[Hashable, int], tuple[Sighting[T], Sighting[T]]] = {}
    for s in sorted(sightings, key=lambda s: s.inv):
        seen = owner_of.setdefault(s.token, s)
        if seen.owner != s.owner:
            out.append(TokenClash(seen, s, shared=True))
            continue
        ident = (s.owner, s.token)
        known = first.get(ident)
        if known is None:
            first[ident] = (s, s)
        elif s.ret < known[1].ret:
            first[ident] = (known[0], s)
    ids = list(first.values())
    by_ret = sorted(ids, key=lambda pair: pair[1].ret)
    j = 0
    top: Sighting[T] | None = None  # the highest token known so far
    for began, _ in sorted(ids, key=lambda pair: pair[0].inv):
        while j < len(by_ret) and by_ret[j][1].ret < began.inv:
            known_at = by_ret[j][1]
            if top is None or known_at.token > top.token:
                top = known_at
            j += 1
        if top is not None and top.token >= began.token:
            out.append(TokenClash(top, began, shared=False))
    return out
