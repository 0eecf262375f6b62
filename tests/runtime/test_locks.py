"""The runtime's per-key locks: one holder per key, nothing kept once nobody holds or waits."""

from __future__ import annotations

import asyncio

import pytest

from tenure.runtime._locks import KeyLocks

pytestmark = pytest.mark.asyncio


async def test_one_holder_per_key_and_keys_do_not_block_each_other() -> None:
    locks = KeyLocks()
    inside: list[str] = []
    order: list[str] = []

    async def hold(key: str, name: str, gate: asyncio.Event) -> None:
        async with locks.hold(key):
            inside.append(key)
            assert inside.count(key) == 1, f"two holders of {key!r}"
            order.append(name)
            await gate.wait()
            inside.remove(key)

    gate_a, gate_b = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(hold("a", "first", gate_a))
    second = asyncio.create_task(hold("a", "second", gate_a))
    other = asyncio.create_task(hold("b", "other", gate_b))
    await asyncio.sleep(0.01)
    assert order == ["first", "other"]  # "second" waits for "a"; "b" did not
    gate_a.set()
    await asyncio.gather(first, second)
    assert order == ["first", "other", "second"]
    assert set(locks._locks) == {"b"}
    gate_b.set()
    await other
    assert locks._locks == {}


async def test_a_waiter_cancelled_or_a_body_raising_leaves_nothing_behind() -> None:
    locks = KeyLocks()
    release = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("k"):
            await release.wait()

    held = asyncio.create_task(holder())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    assert locks._locks["k"].users == 2
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert locks._locks["k"].users == 1
    release.set()
    await held
    assert locks._locks == {}

    with pytest.raises(RuntimeError, match="body"):
        async with locks.hold("k"):
            raise RuntimeError("body")
    assert locks._locks == {}
    async with locks.hold("k"):  # still usable: the lock was released
        pass
