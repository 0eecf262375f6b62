"""The negative controls break exactly their rule, on a real backend, through its public face."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

import tenure
from safety import mutants
from safety.mutants import BACKEND_MUTANTS, Mutant, open_backend
from tenure._contract import Backend, Capability


def _wrap(name: str, inner: Backend) -> Mutant:
    backend = open_backend("memory://", name)
    assert isinstance(backend, Mutant) and backend.name == name
    return type(backend)(inner)


@pytest.mark.asyncio
async def test_every_backend_mutant_is_a_wrapper_that_declares_only_what_it_keeps() -> None:
    for name in BACKEND_MUTANTS:
        async with open_backend("memory://", name) as backend:
            assert isinstance(backend, Mutant)
            assert backend.capabilities == Capability.RECORD
            # Untouched methods behave as the real backend's.
            assert (await backend.transfer_lease("t", "a", "b", 1000)) is False
    async with open_backend("memory://", "no-fencing") as plain:
        assert not isinstance(plain, Mutant)
    with pytest.raises(ValueError, match="unknown mutant"):
        open_backend("memory://", "nope")


@pytest.mark.asyncio
async def test_release_plain_delete_frees_someone_elses_lease() -> None:
    async with tenure.from_url("memory://") as inner:
        backend = _wrap("release-plain-delete", inner)
        assert (await inner.acquire_lease("k", "a", 10_000)).acquired
        await backend.release_lease("k", "stale")
        assert await inner.get_lease_owner("k") is None


@pytest.mark.asyncio
async def test_renew_no_owner_check_says_yes_to_anyone() -> None:
    async with tenure.from_url("memory://") as inner:
        backend = _wrap("renew-no-owner-check", inner)
        assert await backend.renew_lease("k", "a", 10_000) is False  # nobody holds it
        assert (await inner.acquire_lease("k", "a", 10_000)).acquired
        assert await backend.renew_lease("k", "stale", 10_000) is True
        assert await backend.renew_leases(["k"], "stale", 10_000) == [True]
        assert await inner.get_lease_owner("k") == "a"


def _in_the_race_window(
    monkeypatch: pytest.MonkeyPatch, step: Callable[[], Awaitable[object]]
) -> None:
    async def window(ttl_ms: int) -> None:
        await step()

    monkeypatch.setattr(mutants, "_race_window", window)


@pytest.mark.asyncio
async def test_acquire_read_then_write_overwrites_whoever_came_in_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with tenure.from_url("memory://") as inner:
        backend = _wrap("acquire-read-then-write", inner)
        _in_the_race_window(monkeypatch, lambda: inner.acquire_lease("k", "b", 10_000))
        got = await backend.acquire_lease("k", "a", 10_000)
        assert got.acquired  # although b was granted the key in the window
        assert await inner.get_lease_owner("k") == "a"
        refused = await backend.acquire_lease("k", "c", 10_000)
        assert not refused.acquired and refused.owner == "a"


@pytest.mark.asyncio
async def test_token_outside_atomic_hands_out_a_stale_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def nothing() -> None:
        return None

    _in_the_race_window(monkeypatch, nothing)
    async with tenure.from_url("memory://") as inner:
        # Two processes' views of one backend: each remembers only what it saw.
        first = _wrap("token-outside-atomic", inner)
        second = _wrap("token-outside-atomic", inner)
        a = await first.acquire_lease("k", "a", 10_000)
        await first.release_lease("k", "a")
        b = await second.acquire_lease("k", "b", 10_000)
        assert a.acquired and b.acquired
        assert b.token == a.token  # a correct backend never repeats a token
        record = await inner.get_lease("k")
        assert record is not None and record.token != b.token
        # Re-acquiring what it holds is passed through unchanged.
        again = await second.acquire_lease("k", "b", 10_000)
        assert again.token == record.token


@pytest.mark.asyncio
async def test_a_backend_without_records_is_refused() -> None:
    async with tenure.from_url("memory://") as inner:

        class Plain:
            capabilities = Capability.NONE

            def __getattr__(self, name: str) -> object:
                return getattr(inner, name)

        with pytest.raises(ValueError, match="RECORD"):
            Mutant(Plain())  # type: ignore[arg-type]  # deliberately not a full Backend
