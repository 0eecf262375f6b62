"""The contract suite, for any backend: ours or your own.

Subclass :class:`LeaseContract` (and :class:`PubSubContract` if your backend
delivers events) in a test module and provide the backend through a fixture::

    import pytest_asyncio
    from tenure.testing import LeaseContract

    class TestMyBackend(LeaseContract):
        @pytest_asyncio.fixture
        async def lease_provider(self):
            backend = MyBackend(...)
            yield backend
            await backend.aclose()

The suite needs ``pytest`` and ``pytest-asyncio``. It uses short real-time
waits unless you override the ``advance`` fixture with a function that moves
your backend's clock forward (see :class:`ManualClock`). Every test uses keys
of its own, so a shared server is fine.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ._contract import AcquireResult, Capability, LeaseRecord, RefusalReason, capabilities_of
from ._detect import is_lease_provider
from ._errors import BackendClosed, InvalidArgument
from ._pubsub import Event

__all__ = ["Advance", "LeaseContract", "ManualClock", "PubSubContract", "eventually"]

Advance = Callable[[int], Awaitable[None]]


class ManualClock:
    """A clock that only moves when told to: pass it as ``clock=`` to a backend."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000

    async def advance(self, ms: int) -> None:
        self.advance_ms(ms)


async def eventually(
    check: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01
) -> None:
    """Wait until ``check()`` is true; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


def _bad_arguments() -> list[tuple[str, str, tuple[Any, ...], str]]:
    good_key, good_owner = "k", "o"
    too_long = "x" * 1025
    too_long_multibyte = "é" * 513  # 1026 bytes in UTF-8, 513 characters
    cases: list[tuple[str, str, tuple[Any, ...], str]] = []
    bad: object
    for bad, why in [
        (None, "must be a str"),
        (b"bytes", "must be a str"),
        (7, "must be a str"),
        ("", "must not be empty"),
        (too_long, "at most 1024 bytes"),
        (too_long_multibyte, "at most 1024 bytes"),
        ("lone\ud800surrogate", "encodable as UTF-8"),
    ]:
        cases += [
            ("acquire_lease", "key", (bad, good_owner, 1000), why),
            ("acquire_lease", "owner", (good_key, bad, 1000), why),
            ("get_lease_owner", "key", (bad,), why),
            ("release_lease", "key", (bad, good_owner), why),
            ("release_lease", "owner", (good_key, bad), why),
            ("renew_lease", "key", (bad, good_owner, 1000), why),
            ("renew_lease", "owner", (good_key, bad, 1000), why),
            ("transfer_lease", "key", (bad, good_owner, "p", 1000), why),
            ("transfer_lease", "from_owner", (good_key, bad, "p", 1000), why),
            ("transfer_lease", "to_owner", (good_key, good_owner, bad, 1000), why),
        ]
    for bad, why in [
        (0, "between 1 and"),
        (-5, "between 1 and"),
        (2**31, "between 1 and"),
        (True, "must be an int"),
        (1.5, "must be an int"),
        ("100", "must be an int"),
        (None, "must be an int"),
    ]:
        cases += [
            ("acquire_lease", "ttl_ms", (good_key, good_owner, bad), why),
            ("renew_lease", "ttl_ms", (good_key, good_owner, bad), why),
            ("transfer_lease", "ttl_ms", (good_key, good_owner, "p", bad), why),
        ]
    return cases


_BAD = _bad_arguments()

# Events no backend may store, each with the argument its error names.
_BAD_EVENTS: list[tuple[Event, str, str]] = [
    (Event(type=""), "event.type", "must not be empty"),
    (Event(type=7), "event.type", "must be a str"),  # type: ignore[arg-type]  # on purpose
    (Event(type="t\ud800"), "event.type", "encodable as UTF-8"),
    (Event(type="t", id=123), "event.id", "must be a str"),  # type: ignore[arg-type]  # on purpose
    (Event(type="t", id=""), "event.id", "must not be empty"),
    (Event(type="t", id="x" * 1025), "event.id", "at most 1024 bytes"),
    (Event(type="t", id="a\ud800"), "event.id", "encodable as UTF-8"),
    (Event(type="t", run_id="a\udfff"), "event.run_id", "encodable as UTF-8"),
    (Event(type="t", data="a\ud800"), "event.data", "encodable as UTF-8"),
    (Event(type="t", data={"k\ud800": 1}), "event.data", "encodable as UTF-8"),
    (Event(type="t", data=object()), "event.data", "JSON-serialisable"),
    (Event(type="t", created_at=math.nan), "event.created_at", "finite"),
    (Event(type="t", created_at=math.inf), "event.created_at", "finite"),
    (Event(type="t", created_at=10**400), "event.created_at", "finite"),
    (Event(type="t", created_at="1"), "event.created_at", "number of seconds"),  # type: ignore[arg-type]  # on purpose
    (Event(type="t", created_at=True), "event.created_at", "number of seconds"),
]


# The methods each capability promises (CONTRACT section 3).
_METHODS: dict[Capability, tuple[str, ...]] = {
    Capability.RECORD: ("get_lease",),
    Capability.RENEW_MANY: ("renew_leases",),
    Capability.RENEW_OWNED: ("renew_owned",),
    Capability.RELEASE_WAKEUPS: ("wait_lease_released",),
    Capability.EVENTS: ("publish", "subscribe", "unsubscribe", "flush"),
    Capability.OPERATIONS: ("scan_leases", "revoke_lease"),
    Capability.RECLAIM: ("reclaim",),
    Capability.BACKLOG: ("backlog",),
}


def _assert_declared_methods(backend: object, declared: Capability) -> None:
    for capability, names in _METHODS.items():
        if capability in declared:
            for name in names:
                assert callable(getattr(backend, name, None)), (
                    f"{type(backend).__name__} declares {capability.name} but has no {name}()"
                )


def _require(backend: object, capability: Capability) -> None:
    if capability not in capabilities_of(backend):
        pytest.skip(f"{type(backend).__name__} does not declare Capability.{capability.name}")


async def _record(provider: Any, key: str) -> LeaseRecord:
    """``key``'s live lease, which the test expects to be there."""
    record: LeaseRecord | None = await provider.get_lease(key)
    assert record is not None
    return record


async def _expired(provider: Any, key: str, owner: str, advance: Advance) -> Any:
    """The result of a grant of ``key`` to ``owner`` that has run out when it is returned."""
    granted = await provider.acquire_lease(key, owner, 100)
    await advance(300)
    return granted


class _Contract:
    """What every part of the lease contract suite shares: the TTL of its real-time
    waits, the clock and a fresh key per test."""

    ttl_ms = 800

    @pytest.fixture
    def advance(self) -> Advance:
        async def sleep(ms: int) -> None:
            await asyncio.sleep(ms / 1000)

        return sleep

    @pytest.fixture
    def key(self) -> str:
        return f"contract-{uuid.uuid4().hex}"


class _GrantsAndRenewals(_Contract):
    """Detection, acquire, release and renew (CONTRACT section 2)."""

    @pytest.mark.asyncio
    async def test_is_detected_structurally(self, lease_provider: Any) -> None:
        assert is_lease_provider(lease_provider)

    @pytest.mark.asyncio
    async def test_declares_record_reads_and_every_declared_method_exists(
        self, lease_provider: Any
    ) -> None:
        declared = capabilities_of(lease_provider)
        # get_lease is part of the contract (section 3), and this suite reads it.
        assert Capability.RECORD in declared, "declare Capability.RECORD and provide get_lease"
        _assert_declared_methods(lease_provider, declared)

    @pytest.mark.asyncio
    async def test_free_key_is_granted(self, lease_provider: Any, key: str) -> None:
        result = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        assert isinstance(result, AcquireResult)
        assert result.acquired is True
        assert result.owner == "alice"
        assert isinstance(result.token, int)
        assert result.reason is None
        assert await lease_provider.get_lease_owner(key) == "alice"

    @pytest.mark.asyncio
    async def test_other_owner_is_denied_and_told_the_holder(
        self, lease_provider: Any, key: str
    ) -> None:
        await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        result = await lease_provider.acquire_lease(key, "bob", self.ttl_ms)
        assert result == AcquireResult(
            acquired=False, owner="alice", token=None, reason=RefusalReason.HELD
        )
        assert result.reason == "held"  # a StrEnum: the value reads as the reason
        assert await lease_provider.get_lease_owner(key) == "alice"

    @pytest.mark.asyncio
    async def test_same_owner_reacquire_refreshes_ttl_and_keeps_token(
        self, lease_provider: Any, key: str, advance: Advance
    ) -> None:
        first = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        await advance(self.ttl_ms * 6 // 10)
        again = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        assert again.acquired and again.owner == "alice"
        assert again.token == first.token
        assert again.reason is None
        await advance(self.ttl_ms * 6 // 10)  # past the first grant's deadline
        assert await lease_provider.get_lease_owner(key) == "alice"

    @pytest.mark.asyncio
    async def test_expired_lease_goes_to_a_new_owner_with_a_higher_token(
        self, lease_provider: Any, key: str, advance: Advance
    ) -> None:
        first = await _expired(lease_provider, key, "alice", advance)
        assert await lease_provider.get_lease_owner(key) is None
        second = await lease_provider.acquire_lease(key, "bob", self.ttl_ms)
        assert second.acquired and second.owner == "bob"
        assert second.token > first.token

    @pytest.mark.asyncio
    async def test_release_by_non_owner_does_nothing(self, lease_provider: Any, key: str) -> None:
        granted = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        assert await lease_provider.release_lease(key, "bob") is None
        record = await _record(lease_provider, key)
        assert (record.owner, record.token) == ("alice", granted.token)

    @pytest.mark.asyncio
    async def test_release_by_owner_frees_the_key(self, lease_provider: Any, key: str) -> None:
        first = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        await lease_provider.release_lease(key, "alice")
        assert await lease_provider.get_lease_owner(key) is None
        assert await lease_provider.get_lease(key) is None
        second = await lease_provider.acquire_lease(key, "bob", self.ttl_ms)
        assert second.acquired and second.token > first.token

    @pytest.mark.asyncio
    async def test_release_of_missing_key_does_nothing(self, lease_provider: Any, key: str) -> None:
        assert await lease_provider.release_lease(key, "alice") is None
        assert await lease_provider.get_lease_owner(key) is None

    @pytest.mark.asyncio
    async def test_renew_extends_past_the_original_deadline(
        self, lease_provider: Any, key: str, advance: Advance
    ) -> None:
        granted = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        await advance(self.ttl_ms * 6 // 10)
        assert await lease_provider.renew_lease(key, "alice", self.ttl_ms) is True
        await advance(self.ttl_ms * 6 // 10)
        record = await _record(lease_provider, key)
        assert (record.owner, record.token) == ("alice", granted.token)

    @pytest.mark.asyncio
    async def test_renew_by_other_owner_fails(self, lease_provider: Any, key: str) -> None:
        await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        assert await lease_provider.renew_lease(key, "bob", self.ttl_ms) is False
        assert await lease_provider.get_lease_owner(key) == "alice"

    @pytest.mark.asyncio
    async def test_renew_after_expiry_fails_and_does_not_resurrect(
        self, lease_provider: Any, key: str, advance: Advance
    ) -> None:
        await _expired(lease_provider, key, "alice", advance)
        assert await lease_provider.renew_lease(key, "alice", self.ttl_ms) is False
        assert await lease_provider.get_lease_owner(key) is None
        assert await lease_provider.get_lease(key) is None

    @pytest.mark.asyncio
    async def test_renew_of_missing_key_fails(self, lease_provider: Any, key: str) -> None:
        assert await lease_provider.renew_lease(key, "alice", self.ttl_ms) is False
        assert await lease_provider.get_lease_owner(key) is None

    @pytest.mark.asyncio
    async def test_renew_owned_decides_each_pair_on_its_own(
        self, lease_provider: Any, key: str, advance: Advance
    ) -> None:
        _require(lease_provider, Capability.RENEW_OWNED)
        a, b, c, gone, none = (f"{key}-{x}" for x in ("a", "b", "c", "gone", "none"))
        for k, owner in ((a, "alice"), (b, "bob"), (c, "carol")):
            assert (await lease_provider.acquire_lease(k, owner, self.ttl_ms)).acquired
        assert (await lease_provider.acquire_lease(gone, "dave", 100)).acquired
        await advance(self.ttl_ms // 2)
        pairs = [(a, "alice"), (b, "bob"), (c, "mallory"), (gone, "dave"), (none, "erin")]
        assert await lease_provider.renew_owned(pairs, self.ttl_ms) == [
            True,
            True,
            False,
            False,
            False,
        ]
        await advance(self.ttl_ms * 6 // 10)  # past every first grant's deadline
        assert await lease_provider.get_lease_owner(a) == "alice"
        assert await lease_provider.get_lease_owner(b) == "bob"
        assert await lease_provider.get_lease_owner(c) is None  # mallory's renewal did nothing
        assert await lease_provider.get_lease(gone) is None  # not resurrected
        assert await lease_provider.renew_owned([], self.ttl_ms) == []
        for bad in ("ab", [(a,)], [(a, "")]):
            with pytest.raises(InvalidArgument):
                await lease_provider.renew_owned(bad, self.ttl_ms)


class _TransfersAndTokens(_Contract):
    """Transfer, reads, races, fencing tokens and key encoding (CONTRACT sections 2 to 4)."""

    @pytest.mark.asyncio
    async def test_transfer_moves_ownership_resets_ttl_and_raises_token(
        self, lease_provider: Any, key: str, advance: Advance
    ) -> None:
        granted = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        await advance(self.ttl_ms * 6 // 10)
        assert await lease_provider.transfer_lease(key, "alice", "bob", self.ttl_ms) is True
        after = await _record(lease_provider, key)
        assert after.owner == "bob"
        assert after.token > granted.token
        assert after.ttl_ms > self.ttl_ms * 6 // 10  # a fresh full window, not the remainder
        await advance(self.ttl_ms * 6 // 10)  # past alice's original deadline
        assert await lease_provider.get_lease_owner(key) == "bob"
        assert (await lease_provider.acquire_lease(key, "alice", self.ttl_ms)).owner == "bob"

    @pytest.mark.asyncio
    async def test_transfer_by_non_owner_fails(self, lease_provider: Any, key: str) -> None:
        granted = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        assert await lease_provider.transfer_lease(key, "bob", "carol", self.ttl_ms) is False
        record = await _record(lease_provider, key)
        assert (record.owner, record.token) == ("alice", granted.token)

    @pytest.mark.asyncio
    async def test_transfer_after_expiry_fails(
        self, lease_provider: Any, key: str, advance: Advance
    ) -> None:
        await _expired(lease_provider, key, "alice", advance)
        assert await lease_provider.transfer_lease(key, "alice", "bob", self.ttl_ms) is False
        assert await lease_provider.get_lease_owner(key) is None

    @pytest.mark.asyncio
    async def test_transfer_of_missing_key_fails(self, lease_provider: Any, key: str) -> None:
        assert await lease_provider.transfer_lease(key, "alice", "bob", self.ttl_ms) is False
        assert await lease_provider.get_lease_owner(key) is None

    @pytest.mark.asyncio
    async def test_transfer_to_self_keeps_ownership(self, lease_provider: Any, key: str) -> None:
        granted = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        assert await lease_provider.transfer_lease(key, "alice", "alice", self.ttl_ms) is True
        record = await _record(lease_provider, key)
        assert record.owner == "alice"
        assert record.token > granted.token

    @pytest.mark.asyncio
    async def test_missing_key_has_no_owner(self, lease_provider: Any, key: str) -> None:
        assert await lease_provider.get_lease_owner(key) is None
        assert await lease_provider.get_lease(key) is None

    @pytest.mark.asyncio
    async def test_get_lease_reports_owner_token_and_remaining_ttl(
        self, lease_provider: Any, key: str
    ) -> None:
        granted = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        record = await _record(lease_provider, key)
        assert record.owner == "alice"
        assert record.token == granted.token
        assert 0 < record.ttl_ms <= self.ttl_ms

    @pytest.mark.asyncio
    async def test_concurrent_acquirers_produce_exactly_one_winner(
        self, lease_provider: Any, key: str
    ) -> None:
        owners = [f"owner-{i}" for i in range(100)]
        results = await asyncio.gather(
            *(lease_provider.acquire_lease(key, o, 30_000) for o in owners)
        )
        winners = [o for o, r in zip(owners, results, strict=True) if r.acquired]
        assert len(winners) == 1
        assert all(r.owner == winners[0] for r in results)
        assert await lease_provider.get_lease_owner(key) == winners[0]

    @pytest.mark.asyncio
    async def test_tokens_strictly_increase_across_every_change_of_owner(
        self, lease_provider: Any, key: str, advance: Advance
    ) -> None:
        tokens: list[int] = []
        tokens.append((await lease_provider.acquire_lease(key, "a", self.ttl_ms)).token)
        await lease_provider.release_lease(key, "a")
        tokens.append((await _expired(lease_provider, key, "b", advance)).token)
        tokens.append((await lease_provider.acquire_lease(key, "c", self.ttl_ms)).token)
        assert await lease_provider.transfer_lease(key, "c", "d", self.ttl_ms)
        tokens.append(int((await _record(lease_provider, key)).token))
        assert await lease_provider.transfer_lease(key, "d", "a", self.ttl_ms)
        tokens.append(int((await _record(lease_provider, key)).token))
        await lease_provider.release_lease(key, "a")
        tokens.append((await lease_provider.acquire_lease(key, "a", self.ttl_ms)).token)
        assert all(isinstance(t, int) for t in tokens)
        assert tokens == sorted(set(tokens)), tokens

    @pytest.mark.asyncio
    async def test_renew_and_reacquire_keep_the_token(self, lease_provider: Any, key: str) -> None:
        granted = await lease_provider.acquire_lease(key, "a", self.ttl_ms)
        assert await lease_provider.renew_lease(key, "a", self.ttl_ms)
        again = await lease_provider.acquire_lease(key, "a", self.ttl_ms)
        record = await _record(lease_provider, key)
        assert granted.token == again.token == record.token

    @pytest.mark.asyncio
    async def test_keys_are_independent(self, lease_provider: Any, key: str) -> None:
        assert (await lease_provider.acquire_lease(key + "-1", "a", self.ttl_ms)).acquired
        assert (await lease_provider.acquire_lease(key + "-2", "b", self.ttl_ms)).acquired
        await lease_provider.release_lease(key + "-1", "a")
        assert await lease_provider.get_lease_owner(key + "-2") == "b"

    @pytest.mark.asyncio
    @pytest.mark.parametrize(
        ("name", "owner"),
        [
            ("thread\0one", "worker\0a"),
            ("日本語のスレッド", "작업자-1"),
            ("emoji 🧵 thread", "owner 🦀"),
            ("\0", "\0"),
            ("trailing\0", "tab\there"),
            ("é" * 512, "ü" * 512),  # exactly 1024 bytes each
            ("x" * 1024, "y" * 1024),
        ],
    )
    async def test_any_unicode_key_and_owner_round_trip(
        self, lease_provider: Any, key: str, name: str, owner: str
    ) -> None:
        prefix = key[-32:]  # unique per test, so a shared server is fine
        while len((prefix + name).encode()) > 1024:
            name = name[:-1]
        full = prefix + name
        granted = await lease_provider.acquire_lease(full, owner, self.ttl_ms)
        assert granted.acquired and granted.owner == owner
        assert await lease_provider.get_lease_owner(full) == owner
        denied = await lease_provider.acquire_lease(full, "someone else", self.ttl_ms)
        assert denied.owner == owner
        record = await _record(lease_provider, full)
        assert record.owner == owner
        assert await lease_provider.renew_lease(full, owner, self.ttl_ms)
        successor = owner[:-6] + "\0next" if len(owner.encode()) > 1000 else owner + "\0next"
        assert await lease_provider.transfer_lease(full, owner, successor, self.ttl_ms)
        assert await lease_provider.get_lease_owner(full) == successor
        await lease_provider.release_lease(full, successor)
        assert await lease_provider.get_lease_owner(full) is None

    @pytest.mark.asyncio
    async def test_keys_differing_after_nul_are_distinct(
        self, lease_provider: Any, key: str
    ) -> None:
        names = [key, key + "\0", key + "\0a", key + "\0b", key + "\0\0"]
        for i, name in enumerate(names):
            assert (await lease_provider.acquire_lease(name, f"o{i}", self.ttl_ms)).acquired
        for i, name in enumerate(names):
            assert await lease_provider.get_lease_owner(name) == f"o{i}"


class _Operations(_Contract):
    """``scan_leases`` and ``revoke_lease`` (``Capability.OPERATIONS``)."""

    @pytest.mark.asyncio
    async def test_scan_lists_the_live_leases_under_a_prefix(
        self, lease_provider: Any, key: str, advance: Advance
    ) -> None:
        _require(lease_provider, Capability.OPERATIONS)
        assert (await _expired(lease_provider, f"{key}/gone", "carol", advance)).acquired
        a = await lease_provider.acquire_lease(f"{key}/a", "alice", self.ttl_ms)
        b = await lease_provider.acquire_lease(f"{key}/b\0é", "bob", self.ttl_ms)
        assert (await lease_provider.acquire_lease(f"{key}-other", "dave", self.ttl_ms)).acquired
        listed = [pair async for pair in lease_provider.scan_leases(f"{key}/")]
        assert sorted((k, r.owner, r.token) for k, r in listed) == [
            (f"{key}/a", "alice", a.token),
            (f"{key}/b\0é", "bob", b.token),
        ]
        assert all(0 < r.ttl_ms <= self.ttl_ms for _, r in listed)
        everything = {k async for k, _ in lease_provider.scan_leases()}
        assert {f"{key}/a", f"{key}/b\0é", f"{key}-other"} <= everything
        assert f"{key}/gone" not in everything
        one = [k async for k, _ in lease_provider.scan_leases(f"{key}/", limit=1)]
        assert len(one) == 1 and one[0] in {f"{key}/a", f"{key}/b\0é"}

    @pytest.mark.asyncio
    async def test_scan_reads_past_one_page(self, lease_provider: Any, key: str) -> None:
        _require(lease_provider, Capability.OPERATIONS)
        names = [f"{key}/{i:04d}" for i in range(1200)]
        for name in names:
            assert (await lease_provider.acquire_lease(name, "alice", 60_000)).acquired
        listed = [k async for k, _ in lease_provider.scan_leases(f"{key}/")]
        assert sorted(listed) == names
        assert len([k async for k, _ in lease_provider.scan_leases(f"{key}/", limit=1001)]) == 1001

    @pytest.mark.asyncio
    async def test_revoke_frees_the_key_for_a_higher_token(
        self, lease_provider: Any, key: str
    ) -> None:
        _require(lease_provider, Capability.OPERATIONS)
        first = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        assert await lease_provider.revoke_lease(key) is True
        assert await lease_provider.get_lease(key) is None
        assert await lease_provider.renew_lease(key, "alice", self.ttl_ms) is False
        assert await lease_provider.revoke_lease(key) is False  # nothing left to revoke
        second = await lease_provider.acquire_lease(key, "bob", self.ttl_ms)
        assert second.acquired and second.token > first.token

    @pytest.mark.asyncio
    async def test_revoke_with_a_token_spares_a_newer_holder(
        self, lease_provider: Any, key: str
    ) -> None:
        _require(lease_provider, Capability.OPERATIONS)
        first = await lease_provider.acquire_lease(key, "alice", self.ttl_ms)
        assert await lease_provider.transfer_lease(key, "alice", "bob", self.ttl_ms)
        record = await _record(lease_provider, key)
        assert record.token > first.token
        assert await lease_provider.revoke_lease(key, token=first.token) is False
        assert await lease_provider.get_lease_owner(key) == "bob"
        assert await lease_provider.revoke_lease(key, token=record.token) is True
        assert await lease_provider.get_lease_owner(key) is None

    @pytest.mark.asyncio
    async def test_revoke_of_an_expired_lease_does_nothing(
        self, lease_provider: Any, key: str, advance: Advance
    ) -> None:
        _require(lease_provider, Capability.OPERATIONS)
        assert (await _expired(lease_provider, key, "alice", advance)).acquired
        assert await lease_provider.revoke_lease(key) is False
        assert (await lease_provider.acquire_lease(key, "bob", self.ttl_ms)).acquired

    @pytest.mark.asyncio
    async def test_operations_check_their_arguments(self, lease_provider: Any) -> None:
        _require(lease_provider, Capability.OPERATIONS)
        for prefix in (None, 3, b"k", "x" * 1025):
            with pytest.raises(InvalidArgument, match="prefix"):
                lease_provider.scan_leases(prefix)
        for limit in (0, -1, True, 1.5, "10"):
            with pytest.raises(InvalidArgument, match="limit"):
                lease_provider.scan_leases("", limit)
        for token in (0, -3, True, 2.0, "7"):
            with pytest.raises(InvalidArgument, match="token"):
                await lease_provider.revoke_lease("k", token)
        with pytest.raises(InvalidArgument, match="key"):
            await lease_provider.revoke_lease("")


class _Arguments(_Contract):
    """Bad arguments: ``InvalidArgument``, before anything is sent (CONTRACT section 5)."""

    @pytest.mark.asyncio
    @pytest.mark.parametrize(("method", "arg", "args", "why"), _BAD)
    async def test_bad_argument_raises_invalid_argument(
        self, lease_provider: Any, method: str, arg: str, args: tuple[Any, ...], why: str
    ) -> None:
        with pytest.raises(InvalidArgument) as info:
            await getattr(lease_provider, method)(*args)
        assert isinstance(info.value, ValueError)
        assert str(info.value).startswith(arg + " "), str(info.value)
        assert why in str(info.value)
        assert await lease_provider.get_lease_owner("k") is None

    @pytest.mark.asyncio
    async def test_arguments_are_checked_before_the_backend_is_touched(
        self, lease_provider: Any, key: str
    ) -> None:
        # A closed backend can no longer do any I/O: if a bad argument still
        # raises InvalidArgument (not BackendClosed), it was checked first.
        # A backend without aclose() is checked by the bad-argument tests only.
        aclose = getattr(lease_provider, "aclose", None)
        if callable(aclose):
            await aclose()
        with pytest.raises(InvalidArgument):
            await lease_provider.acquire_lease("", "alice", 1000)
        with pytest.raises(InvalidArgument):
            await lease_provider.renew_lease(key, "alice", 0)
        if not callable(aclose):
            return
        with pytest.raises(BackendClosed):
            await lease_provider.acquire_lease(key, "alice", 1000)
        with pytest.raises(BackendClosed):
            await lease_provider.get_lease_owner(key)


class LeaseContract(_GrantsAndRenewals, _TransfersAndTokens, _Operations, _Arguments):
    """The lease contract (CONTRACT sections 2 to 5) as tests.

    Provide ``lease_provider``; override ``advance`` for a controllable clock
    and ``ttl_ms`` to scale the real-time waits (default 800 ms).
    """


class PubSubContract:
    """The event-delivery contract (CONTRACT section 6) as tests. Provide ``pubsub``.

    The tests of ``DEDUPE``, ``RECLAIM`` and ``BACKLOG`` run when the backend
    declares them, and are reported as skipped (naming the capability) when it
    does not.
    """

    @pytest.fixture
    def topic(self) -> str:
        return f"contract-{uuid.uuid4().hex}"

    @pytest.mark.asyncio
    async def test_declares_events_and_every_declared_method_exists(self, pubsub: Any) -> None:
        declared = capabilities_of(pubsub)
        assert Capability.EVENTS in declared, "declare Capability.EVENTS"
        _assert_declared_methods(pubsub, declared)

    @pytest.mark.asyncio
    async def test_a_retried_publish_is_stored_once(self, pubsub: Any, topic: str) -> None:
        _require(pubsub, Capability.DEDUPE)
        got: list[Event] = []

        async def callback(event: Event) -> None:
            got.append(event)

        await pubsub.subscribe(topic, callback, group="g")
        first = await pubsub.publish(topic, Event(type="t", data=1, id="signal-1"))
        again = await pubsub.publish(topic, Event(type="t", data=1, id="signal-1"))
        other = await pubsub.publish(topic, Event(type="t", data=2, id="signal-2"))
        assert again.id == first.id == "signal-1" and again.created_at == first.created_at
        await eventually(lambda: len(got) >= 2)
        await asyncio.sleep(0.3)
        assert [e.id for e in got] == ["signal-1", other.id]
        await pubsub.unsubscribe(topic, callback)

    @pytest.mark.asyncio
    async def test_reclaim_hands_a_stuck_members_events_back_first(
        self, pubsub: Any, topic: str
    ) -> None:
        # The API and the order. That a *killed* member's events come back at once
        # is shown per backend, with a real process killed (tests/<backend>/).
        _require(pubsub, Capability.RECLAIM)
        stuck: list[Event] = []
        got: list[Event] = []
        release = asyncio.Event()

        async def dead(event: Event) -> None:
            stuck.append(event)
            await release.wait()  # stands for a consumer that died holding it

        async def successor(event: Event) -> None:
            got.append(event)

        assert await pubsub.reclaim(topic, "g") == 0  # no group yet: nothing to do
        await pubsub.subscribe(topic, dead, group="g")
        first = await pubsub.publish(topic, Event(type="t", data=0))
        await eventually(lambda: len(stuck) == 1)
        assert await pubsub.reclaim(topic, "g") == 1
        release.set()  # the old delivery ends: it settles nothing any more
        await pubsub.unsubscribe(topic, dead)
        await pubsub.subscribe(topic, successor, group="g")
        later = await pubsub.publish(topic, Event(type="t", data=1))
        await eventually(lambda: len(got) >= 2, timeout=10)
        await asyncio.sleep(0.3)
        assert [e.id for e in got] == [first.id, later.id]
        assert got[0].attempt >= 2
        await pubsub.unsubscribe(topic, successor)

    @pytest.mark.asyncio
    async def test_backlog_lists_topics_with_unacknowledged_events(
        self, pubsub: Any, topic: str
    ) -> None:
        _require(pubsub, Capability.BACKLOG)
        waiting, drained, busy = f"{topic}/waiting", f"{topic}/drained", f"{topic}/busy"
        handled: list[Event] = []
        release = asyncio.Event()

        async def handle(event: Event) -> None:
            handled.append(event)

        async def hold(event: Event) -> None:
            await release.wait()

        for name in (waiting, drained):
            await pubsub.subscribe(name, handle, group="g")
        await pubsub.unsubscribe(waiting, handle)  # the group stays
        await pubsub.subscribe(busy, hold, group="g")
        await pubsub.publish(waiting, Event(type="t"))
        await pubsub.publish(drained, Event(type="t"))
        await pubsub.publish(busy, Event(type="t"))
        await eventually(lambda: len(handled) == 1)

        async def listed() -> list[str]:
            return sorted(await pubsub.backlog(f"{topic}/", "g"))

        for _ in range(100):
            if await listed() == [busy, waiting]:
                break
            await asyncio.sleep(0.05)
        assert await listed() == [busy, waiting]
        # A runtime does not ask about the threads it owns.
        assert await pubsub.backlog(f"{topic}/", "g", skip={busy}) == [waiting]
        assert await pubsub.backlog(f"{topic}/", "other") == []
        release.set()
        await pubsub.unsubscribe(drained, handle)
        await pubsub.unsubscribe(busy, hold)

    @pytest.mark.asyncio
    async def test_publish_sets_id_and_created_at(self, pubsub: Any, topic: str) -> None:
        published = await pubsub.publish(topic, Event(type="t", data={"n": 1}, run_id="r"))
        assert isinstance(published.id, str) and published.id
        assert isinstance(published.created_at, float)
        assert (published.type, published.data, published.run_id) == ("t", {"n": 1}, "r")

    @pytest.mark.asyncio
    async def test_an_event_with_an_old_created_at_is_kept_until_handled(
        self, pubsub: Any, topic: str
    ) -> None:
        # A replay publishes events as old as they are: retention and the dedupe
        # window count from when the backend stored one, not from its created_at.
        eight_days_ago = time.time() - 8 * 24 * 3600
        got: list[Event] = []

        async def callback(event: Event) -> None:
            got.append(event)

        await pubsub.subscribe(topic, callback, group="g")
        old = [
            await pubsub.publish(topic, Event(type="t", data=i, created_at=eight_days_ago + i))
            for i in range(3)
        ]
        await pubsub.flush()
        await eventually(lambda: len(got) == 3)
        assert [(e.data, e.created_at) for e in got] == [(e.data, e.created_at) for e in old]
        if Capability.DEDUPE in capabilities_of(pubsub):
            kept = Event(type="t", data="kept", id=f"{topic}-old", created_at=eight_days_ago)
            first = await pubsub.publish(topic, kept)
            await pubsub.publish(topic, Event(type="t", data="new"))
            again = await pubsub.publish(topic, kept)
            assert (again.id, again.created_at) == (first.id, eight_days_ago)
            await pubsub.flush()
            await eventually(lambda: len(got) == 5)
            assert [e.data for e in got[3:]] == ["kept", "new"]
        await pubsub.unsubscribe(topic, callback)

    @pytest.mark.asyncio
    async def test_fan_out_reaches_every_subscriber(self, pubsub: Any, topic: str) -> None:
        got_a: list[Event] = []
        got_b: list[Event] = []

        async def a(event: Event) -> None:
            got_a.append(event)

        async def b(event: Event) -> None:
            got_b.append(event)

        await pubsub.subscribe(topic, a)
        await pubsub.subscribe(topic, b)
        sent = [await pubsub.publish(topic, Event(type="t", data=i)) for i in range(5)]
        await pubsub.flush()
        await eventually(lambda: len(got_a) == 5 and len(got_b) == 5)
        assert [e.data for e in got_a] == [0, 1, 2, 3, 4]
        assert [e.id for e in got_b] == [e.id for e in sent]
        await pubsub.unsubscribe(topic, a)
        await pubsub.unsubscribe(topic, b)

    @pytest.mark.asyncio
    async def test_group_members_compete(self, pubsub: Any, topic: str) -> None:
        got: dict[str, list[int]] = {"a": [], "b": []}

        def member(name: str) -> Callable[[Event], Awaitable[None]]:
            async def callback(event: Event) -> None:
                got[name].append(event.data)
                await asyncio.sleep(0.001)

            return callback

        a, b = member("a"), member("b")
        await pubsub.subscribe(topic, a, group="workers")
        await pubsub.subscribe(topic, b, group="workers")
        for i in range(40):
            await pubsub.publish(topic, Event(type="t", data=i))
        await pubsub.flush()
        await eventually(lambda: len(got["a"]) + len(got["b"]) >= 40)
        await asyncio.sleep(0.2)
        assert sorted(got["a"] + got["b"]) == list(range(40))
        await pubsub.unsubscribe(topic, a)
        await pubsub.unsubscribe(topic, b)

    @pytest.mark.asyncio
    async def test_returning_acknowledges(self, pubsub: Any, topic: str) -> None:
        got: list[Event] = []

        async def callback(event: Event) -> None:
            got.append(event)

        await pubsub.subscribe(topic, callback, group="g")
        await pubsub.publish(topic, Event(type="t", data="once"))
        await pubsub.flush()
        await eventually(lambda: len(got) == 1)
        await asyncio.sleep(0.3)
        await pubsub.flush()
        assert [(e.data, e.attempt) for e in got] == [("once", 1)]
        await pubsub.unsubscribe(topic, callback)

    @pytest.mark.asyncio
    async def test_raising_callback_gets_the_event_again(self, pubsub: Any, topic: str) -> None:
        attempts: list[int] = []

        async def flaky(event: Event) -> None:
            attempts.append(event.attempt)
            if len(attempts) < 3:
                raise RuntimeError("transient failure (expected by the test)")

        await pubsub.subscribe(topic, flaky)
        sent = await pubsub.publish(topic, Event(type="t", data="retry me"))
        await pubsub.flush()
        await eventually(lambda: len(attempts) >= 3)
        await asyncio.sleep(0.2)
        assert attempts == [1, 2, 3]
        assert sent.id is not None
        await pubsub.unsubscribe(topic, flaky)

    @pytest.mark.asyncio
    async def test_a_cancellation_the_callback_lets_out_is_its_failure(
        self, pubsub: Any, topic: str
    ) -> None:
        # A CancelledError that nobody asked of the delivery (here: from awaiting
        # a task someone else cancelled) is a raise like any other: the event
        # comes again, and the subscription goes on.
        got: dict[str, list[tuple[Any, int]]] = {"fan-out": [], "group": []}

        def member(name: str) -> Callable[[Event], Awaitable[None]]:
            async def callback(event: Event) -> None:
                got[name].append((event.data, event.attempt))
                if event.data == 0 and event.attempt == 1:
                    other = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
                    other.cancel()
                    await other

            return callback

        fan_out, grouped = member("fan-out"), member("group")
        await pubsub.subscribe(topic, fan_out)
        await pubsub.subscribe(topic, grouped, group="g")
        await pubsub.publish(topic, Event(type="t", data=0))
        await eventually(lambda: all((0, 2) in g for g in got.values()), timeout=10)
        await pubsub.publish(topic, Event(type="t", data=1))
        await eventually(lambda: all((1, 1) in g for g in got.values()), timeout=10)
        assert got == {"fan-out": [(0, 1), (0, 2), (1, 1)], "group": [(0, 1), (0, 2), (1, 1)]}
        await pubsub.unsubscribe(topic, fan_out)
        await pubsub.unsubscribe(topic, grouped)

    @pytest.mark.asyncio
    async def test_unsubscribed_callback_gets_nothing_more(self, pubsub: Any, topic: str) -> None:
        got: list[Any] = []

        async def callback(event: Event) -> None:
            got.append(event.data)

        await pubsub.subscribe(topic, callback)
        await pubsub.publish(topic, Event(type="t", data=1))
        await pubsub.flush()
        await eventually(lambda: got == [1])
        await pubsub.unsubscribe(topic, callback)
        await pubsub.publish(topic, Event(type="t", data=2))
        await pubsub.flush()
        await asyncio.sleep(0.1)
        assert got == [1]

    @pytest.mark.asyncio
    async def test_events_a_member_was_handling_when_it_unsubscribed_go_to_another_member(
        self, pubsub: Any, topic: str
    ) -> None:
        held: list[Event] = []
        got: list[Event] = []

        async def leaving(event: Event) -> None:
            held.append(event)
            await asyncio.Event().wait()  # never finishes: unsubscribe interrupts it

        async def staying(event: Event) -> None:
            got.append(event)

        await pubsub.subscribe(topic, leaving, group="workers")
        first = await pubsub.publish(topic, Event(type="t", data=0))
        await eventually(lambda: len(held) == 1)
        await pubsub.subscribe(topic, staying, group="workers")
        sent = [first] + [await pubsub.publish(topic, Event(type="t", data=i)) for i in (1, 2)]
        await pubsub.unsubscribe(topic, leaving)
        # Not after a redelivery timeout (30 s by default on the durable backends).
        await eventually(lambda: len(got) >= 3, timeout=10)
        await asyncio.sleep(0.2)
        assert sorted(e.data for e in got) == [0, 1, 2]
        assert {e.id for e in got} == {e.id for e in sent}
        await pubsub.unsubscribe(topic, staying)

    @pytest.mark.asyncio
    async def test_bad_event_is_rejected(self, pubsub: Any, topic: str) -> None:
        with pytest.raises(InvalidArgument):
            await pubsub.publish(topic, Event(type="t", data={1, 2}))
        with pytest.raises(InvalidArgument):
            await pubsub.publish(topic, {"type": "t"})
        with pytest.raises(InvalidArgument):
            await pubsub.publish("", Event(type="t"))

    @pytest.mark.asyncio
    @pytest.mark.parametrize(("event", "arg", "why"), _BAD_EVENTS)
    async def test_bad_event_field_raises_invalid_argument_before_any_io(
        self, pubsub: Any, topic: str, event: Event, arg: str, why: str
    ) -> None:
        got: list[Event] = []

        async def callback(received: Event) -> None:
            got.append(received)

        await pubsub.subscribe(topic, callback, group="g")
        with pytest.raises(InvalidArgument) as info:
            await pubsub.publish(topic, event)
        assert str(info.value).startswith(arg + " "), str(info.value)
        assert why in str(info.value)
        await pubsub.publish(topic, Event(type="t", data="good"))
        await pubsub.flush()
        await eventually(lambda: len(got) == 1)
        assert [e.data for e in got] == ["good"]
        await pubsub.unsubscribe(topic, callback)
        # A closed backend does no I/O: InvalidArgument, not BackendClosed, shows
        # that the event was checked first.
        await pubsub.aclose()
        with pytest.raises(InvalidArgument):
            await pubsub.publish(topic, event)
