"""What every lease backend shares (``tenure.backends._core``), beyond the contract suite.

Most of it is reached through the in-memory backend. ``Minimal`` is the least a
backend built on ``LeaseCore`` can be (one read, no operator methods), for what
tenure's own backends never do: a TTL ceiling below the contract's with a reason,
and scanning or revoking without declaring ``OPERATIONS``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import pytest

from tenure import BackendClosed, InvalidArgument, LeaseRecord, MemoryPubSub
from tenure.backends._core import LeaseCore, prefix_range

from .support.forking import in_child
from .support.waiting import until_parked

FORK_MESSAGE = (
    "this MemoryPubSub comes from process {pid} and crossed fork(): it would share its "
    "connections, file and event loop with that process. Make the backend in the child "
    "(after the fork, e.g. in a worker's start hook), or use tenure.sync.from_url(), which "
    "re-initialises itself in a forked child"
)


class Minimal(LeaseCore):
    """A backend with one read and nothing else, and a ceiling of 1000 ms."""

    _max_ttl_reason = "the minimal backend forgets after a second"

    def __init__(self) -> None:
        super().__init__(max_ttl_ms=1000)

    async def _read(self, key: str) -> LeaseRecord | None:
        return None

    async def aclose(self) -> None:
        self._closed = True


def error_of(call: Callable[[], Any]) -> str:
    """The message of the ``BackendClosed`` that running the coroutine ``call()`` raises."""
    try:
        asyncio.run(call())
    except BackendClosed as exc:
        return str(exc)
    raise AssertionError("no BackendClosed raised")


def test_a_backend_that_crossed_fork_refuses_in_the_child_naming_the_fix() -> None:
    crossing = MemoryPubSub()
    closed_before = MemoryPubSub()
    asyncio.run(crossing.acquire_lease("k", "parent", 60_000))
    asyncio.run(closed_before.aclose())

    def child() -> dict[str, Any]:
        async def fresh_backend_works() -> bool:
            async with MemoryPubSub() as mine:
                return (await mine.acquire_lease("k", "child", 60_000)).acquired

        return {
            "crossing": error_of(lambda: crossing.get_lease("k")),
            "acquire": error_of(lambda: crossing.acquire_lease("other", "child", 1000)),
            "closed before": error_of(lambda: closed_before.get_lease("k")),
            "fresh backend works": asyncio.run(fresh_backend_works()),
        }

    seen = in_child(child)
    assert seen == {
        "result": {
            "crossing": FORK_MESSAGE.format(pid=os.getpid()),
            "acquire": FORK_MESSAGE.format(pid=os.getpid()),
            # Closed before the fork: it did not cross it open, so no fork advice.
            "closed before": "MemoryPubSub is closed",
            "fresh backend works": True,
        }
    }
    # The parent's backend is untouched by the child's closing of its copy.
    record = asyncio.run(crossing.get_lease("k"))
    assert record is not None and record.owner == "parent"
    asyncio.run(crossing.aclose())


@pytest.mark.asyncio
async def test_a_closed_backend_says_which_backend_is_closed() -> None:
    backend = MemoryPubSub()
    await backend.aclose()
    with pytest.raises(BackendClosed) as info:
        await backend.renew_leases(["k"], "o", 1000)
    assert str(info.value) == "MemoryPubSub is closed"


@pytest.mark.asyncio
async def test_refused_arguments_of_the_operator_and_batch_calls_are_named() -> None:
    async with MemoryPubSub() as backend:
        with pytest.raises(InvalidArgument) as info:
            await backend.renew_leases(["k"], "", 1000)
        assert str(info.value) == "owner must not be empty"
        with pytest.raises(InvalidArgument) as info:
            backend.scan_leases(limit=0)
        assert str(info.value) == "limit must be None or an int >= 1, got 0"
        with pytest.raises(InvalidArgument) as info:
            await backend.revoke_lease("k", token=0)
        assert str(info.value) == "token must be None or an int >= 1, got 0"


@pytest.mark.asyncio
async def test_a_revoke_wakes_a_waiter_of_the_key() -> None:
    async with MemoryPubSub() as backend:
        await backend.acquire_lease("k", "holder", 60_000)
        waiter = asyncio.create_task(backend.wait_lease_released("k", 30.0))
        await until_parked(backend, "k")
        assert await backend.revoke_lease("k") is True
        # Only the revoke's wake-up ends the wait: the lease had 60 s left, the wait 30 s.
        assert await asyncio.wait_for(waiter, 10.0) is True


@pytest.mark.asyncio
async def test_a_ttl_above_the_backends_ceiling_is_refused_with_its_reason() -> None:
    async with Minimal() as backend:
        # The check every acquire and renew of a backend makes first.
        with pytest.raises(InvalidArgument) as info:
            backend._args("k", "o", 1001)
        assert str(info.value) == (
            "ttl_ms must be at most max_ttl_ms=1000 on this backend, got 1001: the minimal "
            "backend forgets after a second (raise max_ttl_ms for every client of the backend)"
        )
        assert backend._args("k", "o", 1000) == 1000


@pytest.mark.asyncio
async def test_a_backend_without_operations_says_so_when_scanned_or_revoked() -> None:
    async with Minimal() as backend:
        with pytest.raises(NotImplementedError) as info:
            async for _ in backend.scan_leases():
                pass
        assert str(info.value) == "Minimal does not declare OPERATIONS"
        with pytest.raises(NotImplementedError) as info:
            await backend.revoke_lease("k")
        assert str(info.value) == "Minimal does not declare OPERATIONS"


def test_prefix_range_covers_exactly_the_keys_under_the_prefix() -> None:
    assert prefix_range(b"ab") == (b"ab", b"ac")
    assert prefix_range(b"a\x7f") == (b"a\x7f", b"a\x80")
    # No prefix: every key, up to 1024 bytes of UTF-8 (which never holds 0xFF).
    low, high = prefix_range(b"")
    assert low == b"" and high == b"\xff" * 1025
    assert "\U0010ffff".encode() * 256 < high
