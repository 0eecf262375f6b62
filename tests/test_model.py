"""Model-based test: the memory backend agrees with a pure model of the contract.

Hypothesis drives both with the same operations and one controlled clock. The
model keeps time in integer milliseconds; the clock never lands exactly on a
deadline, so float rounding in the backend cannot make the comparison flaky.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tenure import AcquireResult, LeaseRecord, MemoryPubSub, RefusalReason
from tenure.testing import ManualClock

KEYS = st.sampled_from(["a", "b", "thread\0x", "日本"])
OWNERS = st.sampled_from(["x", "y", "z\0"])
TTLS = st.integers(min_value=1, max_value=60)
T = TypeVar("T")


@dataclass
class _Lease:
    owner: str
    token: int
    deadline: int  # ms


class Model:
    """The contract, written as plainly as possible (one global token counter)."""

    def __init__(self) -> None:
        self.now = 0
        self.leases: dict[str, _Lease] = {}
        self.last_token = 0

    def live(self, key: str) -> _Lease | None:
        lease = self.leases.get(key)
        return lease if lease is not None and lease.deadline > self.now else None

    def acquire(self, key: str, owner: str, ttl: int) -> AcquireResult:
        lease = self.live(key)
        if lease is not None and lease.owner != owner:
            return AcquireResult(False, lease.owner, None, reason=RefusalReason.HELD)
        if lease is None:
            self.last_token += 1
            lease = self.leases[key] = _Lease(owner, self.last_token, 0)
        lease.deadline = self.now + ttl
        return AcquireResult(True, owner, lease.token)

    def release(self, key: str, owner: str) -> None:
        lease = self.live(key)
        if lease is not None and lease.owner == owner:
            del self.leases[key]

    def renew(self, key: str, owner: str, ttl: int) -> bool:
        lease = self.live(key)
        if lease is None or lease.owner != owner:
            return False
        lease.deadline = self.now + ttl
        return True

    def transfer(self, key: str, src: str, dst: str, ttl: int) -> bool:
        lease = self.live(key)
        if lease is None or lease.owner != src:
            return False
        self.last_token += 1
        self.leases[key] = _Lease(dst, self.last_token, self.now + ttl)
        return True


class MemoryAgreesWithModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock(start=0.0)
        self.backend = MemoryPubSub(clock=self.clock)
        self.model = Model()

    def teardown(self) -> None:
        self.loop.run_until_complete(self.backend.aclose())
        self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    @rule(ms=st.integers(min_value=1, max_value=40))
    def advance(self, ms: int) -> None:
        deadlines = {lease.deadline for lease in self.model.leases.values()}
        while self.model.now + ms in deadlines:
            ms += 1
        self.model.now += ms
        self.clock.now = self.model.now / 1000

    @rule(key=KEYS, owner=OWNERS, ttl=TTLS)
    def acquire(self, key: str, owner: str, ttl: int) -> None:
        assert self.run(self.backend.acquire_lease(key, owner, ttl)) == self.model.acquire(
            key, owner, ttl
        )

    @rule(key=KEYS, owner=OWNERS)
    def release(self, key: str, owner: str) -> None:
        self.run(self.backend.release_lease(key, owner))
        self.model.release(key, owner)

    @rule(key=KEYS, owner=OWNERS, ttl=TTLS)
    def renew(self, key: str, owner: str, ttl: int) -> None:
        assert self.run(self.backend.renew_lease(key, owner, ttl)) == self.model.renew(
            key, owner, ttl
        )

    @rule(keys=st.lists(KEYS, max_size=4), owner=OWNERS, ttl=TTLS)
    def renew_many(self, keys: list[str], owner: str, ttl: int) -> None:
        got = self.run(self.backend.renew_leases(keys, owner, ttl))
        assert got == [self.model.renew(k, owner, ttl) for k in keys]

    @rule(key=KEYS, src=OWNERS, dst=OWNERS, ttl=TTLS)
    def transfer(self, key: str, src: str, dst: str, ttl: int) -> None:
        assert self.run(self.backend.transfer_lease(key, src, dst, ttl)) == self.model.transfer(
            key, src, dst, ttl
        )

    @invariant()
    def every_key_agrees(self) -> None:
        for key in ["a", "b", "thread\0x", "日本"]:
            lease = self.model.live(key)
            owner = self.run(self.backend.get_lease_owner(key))
            record = self.run(self.backend.get_lease(key))
            if lease is None:
                assert owner is None
                assert record is None
            else:
                assert owner == lease.owner
                assert isinstance(record, LeaseRecord)
                assert (record.owner, record.token) == (lease.owner, lease.token)
                assert abs(record.ttl_ms - (lease.deadline - self.model.now)) <= 1
                assert record.ttl_ms == max(1, math.ceil(record.ttl_ms))


MemoryAgreesWithModel.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None
)
TestMemoryAgreesWithModel = MemoryAgreesWithModel.TestCase
