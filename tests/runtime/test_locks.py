"""The runtime's per-key locks: one holder per key, nothing kept once nobody holds or waits."""

from __future__ import annotations

import asyncio

import pytest

from tenure.runtime._locks import KeyLocks

pytestmark = pytest.mark.asyncio


def waiting(locks: KeyLocks, key: str) -> int:
    """How many tasks wait for ``key``'s lock (0 also when it is free)."""
    return sum(not w.done() for w in locks._locks.get(key, ()))


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
    assert waiting(locks, "k") == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert waiting(locks, "k") == 0
    release.set()
    await held
    assert locks._locks == {}

    with pytest.raises(RuntimeError, match="body"):
        async with locks.hold("k"):
            raise RuntimeError("body")
    assert locks._locks == {}
    async with locks.hold("k"):  # still usable: the lock was released
        pass


async def test_a_waiter_cancelled_as_the_lock_is_handed_to_it_passes_it_on() -> None:
    """The release hands the lock to the first waiter; if that waiter is cancelled
    before it runs, the lock goes to the next one, not lost with the cancelled task."""
    locks = KeyLocks()
    release = asyncio.Event()
    got: list[str] = []

    async def holder(name: str) -> None:
        async with locks.hold("k"):
            got.append(name)
            if name == "first":
                await release.wait()

    first = asyncio.create_task(holder("first"))
    await asyncio.sleep(0)
    second = asyncio.create_task(holder("second"))
    third = asyncio.create_task(holder("third"))
    await asyncio.sleep(0.01)
    assert waiting(locks, "k") == 2
    release.set()
    await asyncio.sleep(0)  # "first" ran and released in this turn, before "second" could run
    assert first.done() and not second.done()
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    await asyncio.wait_for(third, 1)
    assert got == ["first", "third"]
    assert locks._locks == {}
