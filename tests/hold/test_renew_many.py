"""``renew_many`` on every backend, and its fallback for providers without ``renew_leases``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import tenure
from tenure import InvalidArgument, MemoryPubSub

from .support import Counting, FiveMethodsOnly


@pytest_asyncio.fixture
async def backend(backend_url: str) -> AsyncIterator[Any]:
    async with tenure.from_url(backend_url) as b:
        yield b


@pytest_asyncio.fixture(params=["extension", "fallback"])
async def provider(request: pytest.FixtureRequest, backend: Any) -> Any:
    return backend if request.param == "extension" else FiveMethodsOnly(backend)


@pytest.mark.asyncio
async def test_returns_the_keys_that_were_lost(provider: Any, backend: Any) -> None:
    await backend.acquire_lease("mine-1", "a", 1500)
    await backend.acquire_lease("mine-2", "a", 1500)
    await backend.acquire_lease("theirs", "b", 60_000)
    await backend.acquire_lease("expired", "a", 1)
    await asyncio.sleep(0.05)
    lost = await tenure.renew_many(
        provider, "a", ["mine-1", "theirs", "mine-2", "expired", "none"], 60_000
    )
    assert lost == {"theirs", "expired", "none"}
    await asyncio.sleep(1.6)  # past the original 1.5 s: only the renewal keeps them
    assert await backend.get_lease_owner("mine-1") == "a"
    assert await backend.get_lease_owner("mine-2") == "a"
    assert await backend.get_lease_owner("theirs") == "b"
    assert await backend.get_lease_owner("expired") is None  # never resurrected
    assert await tenure.renew_many(provider, "a", [], 1000) == set()


@pytest.mark.asyncio
async def test_keeps_ten_thousand_leases_alive(backend: Any) -> None:
    keys = [f"thread-{i}" for i in range(10_000)]
    semaphore = asyncio.Semaphore(32)

    async def acquire(key: str) -> None:
        async with semaphore:
            # A long TTL: acquiring 10,000 keys takes a while on a loaded machine.
            assert (await backend.acquire_lease(key, "proc", 60_000)).acquired

    await asyncio.gather(*(acquire(k) for k in keys))
    # From here on, a 4 s TTL that only renewal keeps alive, for longer than the TTL
    # (generous: one renew_many of 10,000 keys can take a second on a loaded machine).
    assert await tenure.renew_many(backend, "proc", keys, 4000) == set()
    for _ in range(5):
        await asyncio.sleep(1.0)
        assert await tenure.renew_many(backend, "proc", keys, 4000) == set()
    for key in keys[::997]:
        assert await backend.get_lease_owner(key) == "proc"


@pytest.mark.asyncio
async def test_uses_the_batch_extension_when_there_is_one(backend: Any) -> None:
    counted = Counting(backend)
    keys = [f"k{i}" for i in range(50)]
    for key in keys:
        await backend.acquire_lease(key, "a", 60_000)
    assert await tenure.renew_many(counted, "a", keys, 60_000) == set()
    assert counted.calls == {"renew_leases": 1}


@pytest.mark.asyncio
async def test_arguments_are_checked_before_any_call() -> None:
    async with MemoryPubSub() as memory:
        counted = Counting(memory)
        cases: list[tuple[tuple[Any, ...], str]] = [
            (("a", "k", 1000), "keys must be an iterable of str, not a single str"),
            (("a", ["k", ""], 1000), "key must not be empty"),
            (("a", ["k", 3], 1000), "key must be a str, got int"),
            (("", ["k"], 1000), "owner must not be empty"),
            (("a", ["k"], 0), "ttl_ms must be between 1 and 2147483647 milliseconds, got 0"),
        ]
        for args, message in cases:
            with pytest.raises(InvalidArgument) as info:
                await tenure.renew_many(counted, *args)
            assert str(info.value) == message
        assert not counted.calls


class ShortBatch(FiveMethodsOnly):
    """A provider whose ``renew_leases`` answers for one key fewer than it was asked (a bug)."""

    capabilities = frozenset({"renew_many"})

    async def renew_leases(self, keys: list[str], owner: str, ttl_ms: int) -> list[bool]:
        self.calls["renew_leases"] += 1
        return [True] * (len(keys) - 1)


@pytest.mark.asyncio
async def test_a_batch_answer_of_the_wrong_length_is_an_error_naming_the_provider() -> None:
    # Zipped as it is, the answer would leave the last key out of the lost set.
    async with MemoryPubSub() as memory:
        broken = ShortBatch(memory)
        with pytest.raises(RuntimeError) as info:
            await tenure.renew_many(broken, "a", ["k1", "k2"], 1000)
        assert str(info.value) == "ShortBatch.renew_leases returned 1 results for 2 keys"
        assert broken.calls == {"renew_leases": 1}
