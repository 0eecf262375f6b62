from __future__ import annotations

import logging
import re

import pytest

from tenure import (
    AcquireResult,
    InvalidArgument,
    MemoryPubSub,
    NoopLeaseProvider,
    is_lease_provider,
    lease_provider_for,
)
from tests.support import foreign


def test_foreign_module_does_not_import_tenure() -> None:
    source = foreign.__file__
    assert source is not None
    with open(source, encoding="utf-8") as f:
        text = f.read()
    assert not re.search(r"^\s*(import|from)\s+tenure\b", text, re.MULTILINE)


def test_five_async_methods_are_detected() -> None:
    assert is_lease_provider(foreign.FiveMethods())


def test_four_of_five_are_not_a_provider() -> None:
    assert not is_lease_provider(foreign.FourMethods())
    assert not is_lease_provider(foreign.AttributeNotCallable())
    assert not is_lease_provider(object())
    assert not is_lease_provider(None)


def test_our_backends_are_detected() -> None:
    assert is_lease_provider(MemoryPubSub())
    assert is_lease_provider(NoopLeaseProvider())


def test_provider_for_returns_the_backend_itself() -> None:
    backend = foreign.FiveMethods()
    assert lease_provider_for(backend) is backend


def test_provider_for_four_methods_falls_back_to_noop_with_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="tenure"):
        provider = lease_provider_for(foreign.FourMethods())
    assert isinstance(provider, NoopLeaseProvider)
    records = [r for r in caplog.records if r.name == "tenure"]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    message = records[0].getMessage()
    assert "leases are disabled" in message
    assert "single-process" in message


def test_provider_for_honours_the_wrapper_hook() -> None:
    inner = foreign.FiveMethods()
    assert lease_provider_for(foreign.Wrapper(inner)) is inner


def test_provider_for_honours_a_hook_that_returns_none(caplog: pytest.LogCaptureFixture) -> None:
    backend = foreign.WrapperWithoutLeases()
    assert is_lease_provider(backend)
    with caplog.at_level(logging.INFO, logger="tenure"):
        provider = lease_provider_for(backend)
    assert isinstance(provider, NoopLeaseProvider)
    assert any("leases are disabled" in r.getMessage() for r in caplog.records)


def test_provider_for_rejects_a_hook_that_returns_a_non_provider() -> None:
    with pytest.raises(TypeError, match="lacks the lease methods"):
        lease_provider_for(foreign.Wrapper(object()))


@pytest.mark.asyncio
async def test_detected_foreign_provider_is_called() -> None:
    backend = foreign.FiveMethods()
    provider = lease_provider_for(backend)
    await provider.acquire_lease("k", "o", 100)
    assert backend.calls == ["acquire_lease"]


@pytest.mark.asyncio
async def test_noop_provider_behaviour() -> None:
    noop = NoopLeaseProvider()
    assert await noop.acquire_lease("k", "a", 10) == AcquireResult(True, "a", None)
    assert await noop.acquire_lease("k", "b", 10) == AcquireResult(True, "b", None)
    assert await noop.get_lease_owner("k") is None
    assert await noop.get_lease("k") is None
    await noop.release_lease("k", "a")
    assert await noop.renew_lease("k", "a", 10) is True
    assert await noop.transfer_lease("k", "a", "b", 10) is True
    with pytest.raises(InvalidArgument, match="ttl_ms"):
        await noop.acquire_lease("k", "a", 0)
    with pytest.raises(InvalidArgument, match="to_owner"):
        await noop.transfer_lease("k", "a", "", 10)
    assert repr(noop) == "NoopLeaseProvider()"
