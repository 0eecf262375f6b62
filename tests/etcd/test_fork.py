"""etcd across ``fork()``: gRPC's core does not survive it, so a child of a
process that used etcd gets a clear error (never a crash), and the parent
carries on."""

from __future__ import annotations

import asyncio

import pytest

import tenure
import tenure.sync
from tests.support.etcd_server import shared_etcd
from tests.support.forking import in_child


def test_a_forked_child_of_an_etcd_user_gets_a_clear_error(unique: str) -> None:
    url = f"{shared_etcd().url}?prefix=tenure-test-{unique}/"
    with tenure.sync.from_url(url) as backend:
        assert backend.acquire_lease("parent-key", "parent", 60_000).acquired

        def child() -> str:
            try:
                backend.get_lease_owner("parent-key")
            except tenure.ConfigurationError as exc:
                return str(exc)
            return "no error"

        message = in_child(child)["result"]
        assert "forked from process" in message and "'spawn'" in message, message
        assert backend.get_lease_owner("parent-key") == "parent"
        assert backend.renew_lease("parent-key", "parent", 60_000)


@pytest.mark.asyncio
async def test_a_fresh_backend_in_such_a_child_is_refused_too(unique: str) -> None:
    url = f"{shared_etcd().url}?prefix=tenure-test-{unique}/"
    async with tenure.from_url(url) as backend:
        await backend.get_lease_owner("k")

        def child() -> str:
            async def use() -> None:
                async with tenure.from_url(url) as fresh:
                    await fresh.get_lease_owner("k")

            try:
                asyncio.run(use())
            except tenure.ConfigurationError as exc:
                return str(exc)
            return "no error"

        assert "forked from process" in in_child(child)["result"]
        assert await backend.get_lease_owner("k") is None
