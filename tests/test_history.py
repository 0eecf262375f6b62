"""The shared exclusivity and token checker (used by the demo's verdict and by safety/)."""

from __future__ import annotations

from tenure._history import Sighting, Window, handoffs, token_clashes


def test_handoffs_pair_each_window_with_the_latest_ending_window_of_another_owner() -> None:
    windows = [
        Window(0, 10, "a", "a1"),
        Window(5, 30, "a", "a2"),  # a renewed: its own windows may overlap
        Window(30, 40, "b", "b1"),
        Window(35, 50, "c", "c1"),
    ]
    pairs = [(h.before.item, h.after.item, h.gap) for h in handoffs(windows)]
    assert pairs == [("a2", "b1", 0), ("b1", "c1", -5)]


def test_a_window_that_only_follows_its_own_owner_has_no_pair() -> None:
    assert handoffs([Window(0, 10, "a", 1), Window(20, 30, "a", 2)]) == []
    assert handoffs([]) == []


def test_the_predecessor_skips_the_new_windows_own_owner() -> None:
    # b's latest window ends last, but the overlap that matters for b is a's.
    windows = [Window(0, 25, "a", "a"), Window(1, 100, "b", "b1"), Window(20, 30, "b", "b2")]
    pairs = [(h.before.item, h.after.item, h.gap) for h in handoffs(windows)]
    assert pairs == [("a", "b1", -24), ("a", "b2", -5)]


def test_tokens_rising_in_real_time_pass() -> None:
    sightings = [
        Sighting(0, 1, "a", 1, None),
        Sighting(2, 3, "a", 1, None),  # seen again: same owner, same token
        Sighting(4, 5, "b", 2, None),
    ]
    assert token_clashes(sightings) == []


def test_a_token_given_to_two_owners_clashes() -> None:
    (clash,) = token_clashes([Sighting(0, 1, "a", 5, "first"), Sighting(9, 9, "b", 5, "second")])
    assert clash.shared and (clash.earlier.item, clash.later.item) == ("first", "second")


def test_a_token_seen_after_a_higher_one_was_returned_clashes() -> None:
    (clash,) = token_clashes([Sighting(0, 1, "a", 5, "high"), Sighting(2, 3, "b", 4, "low")])
    assert not clash.shared and (clash.earlier.item, clash.later.item) == ("high", "low")


def test_concurrent_sightings_are_not_ordered() -> None:
    # b's operation began before a's returned: either may have been first.
    assert token_clashes([Sighting(0, 10, "a", 5, None), Sighting(5, 12, "b", 4, None)]) == []
