"""What the etcd backend adds to the contract suite: its URL, errors, the
clean-up leases, the watch, and its refusal by the runtime and the demo."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import tenure
from tenure.backends.etcd import EtcdLeases
from tenure.cli import main
from tests.support.etcd_server import EtcdCluster, shared_etcd
from tests.support.waiting import until_parked


@pytest_asyncio.fixture
async def backend(unique: str) -> AsyncIterator[EtcdLeases]:
    made = tenure.from_url(f"{shared_etcd().url}?prefix=tenure-test-{unique}/")
    assert isinstance(made, EtcdLeases)
    async with made:
        yield made


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("etcd://user:s3cret@127.0.0.1:2379", "not supported yet"),
        ("etcd://127.0.0.1:2379/some/path", "has no path"),
        ("etcd://127.0.0.1:notaport", "bad port"),
        ("etcd://127.0.0.1:2379,", "host:port for every member"),
        ("etcd://127.0.0.1:2379?colour=red", "unknown etcd:// option 'colour'"),
        ("etcd://127.0.0.1:2379?timeout=0", "bad value for etcd:// option 'timeout'"),
        ("etcd://127.0.0.1:2379?ca=/no/such/file", "ca"),
        ("etcds://127.0.0.1:2379?cert=/etc/hostname", "cert and key go together"),
        ("etcd://127.0.0.1:2379?prefix=a&prefix=b", "given twice"),
    ],
)
def test_bad_urls_are_refused_without_showing_a_password(url: str, message: str) -> None:
    with pytest.raises(tenure.ConfigurationError, match=message) as caught:
        tenure.from_url(url)
    assert "s3cret" not in str(caught.value)


def test_every_member_of_the_url_is_an_endpoint() -> None:
    backend = tenure.from_url("etcd://10.0.0.1:2379,[::1]:2380,127.0.0.1?prefix=p/&timeout=2")
    assert isinstance(backend, EtcdLeases)
    assert "10.0.0.1:2379,::1:2380,127.0.0.1:2379" in repr(backend)
    assert "prefix='p/'" in repr(backend)


@pytest.mark.asyncio
async def test_an_unreachable_cluster_raises_backend_unavailable(unique: str) -> None:
    async with tenure.from_url(f"etcd://127.0.0.1:1?timeout=1&prefix={unique}/") as backend:
        with pytest.raises(tenure.BackendUnavailable, match=r"127\.0\.0\.1:1") as caught:
            await backend.acquire_lease("k", "o", 1000)
        assert caught.value.__cause__ is not None


@pytest.mark.asyncio
async def test_a_closed_backend_refuses_calls(backend: EtcdLeases) -> None:
    await backend.aclose()
    with pytest.raises(tenure.BackendClosed):
        await backend.get_lease("k")


@pytest.mark.asyncio
async def test_a_key_the_owner_forgot_is_deleted_by_etcd_after_its_clean_up_lease(
    backend: EtcdLeases, unique: str
) -> None:
    # 300 ms asked: the clean-up lease is 2·⌈0.3⌉ + 1 = 3 s (the server may raise
    # it to its minimum); the record is free at once after 300 ms, and gone
    # from etcd once its clean-up lease ends (nobody reads it through get_lease
    # here, which would delete a lapsed record itself).
    granted = await backend.acquire_lease("k", "alice", 300)
    assert granted.acquired
    await asyncio.sleep(0.4)
    name = f"tenure-test-{unique}/k".encode()
    assert await backend._keys.get("test", name) is not None  # still stored, treated as free
    deadline = asyncio.get_running_loop().time() + 8
    while await backend._keys.get("test", name) is not None:
        assert asyncio.get_running_loop().time() < deadline, "etcd kept the forgotten key"
        await asyncio.sleep(0.2)
    assert await backend.get_lease("k") is None


@pytest.mark.asyncio
async def test_a_transfer_wakes_a_waiter_and_a_grant_does_not(unique: str) -> None:
    url = f"{shared_etcd().url}?prefix=tenure-test-{unique}/"
    async with tenure.from_url(url) as holder, tenure.from_url(url) as watcher:
        assert (await holder.acquire_lease("k", "alice", 10_000)).acquired
        waiting = asyncio.ensure_future(watcher.wait_lease_released("k", 10))
        await until_parked(watcher, "k")
        # A grant of another key and a renewal wake nobody.
        assert (await holder.acquire_lease("k2", "bob", 10_000)).acquired
        assert await holder.renew_lease("k", "alice", 10_000)
        await asyncio.sleep(0.3)
        assert not waiting.done()
        assert await holder.transfer_lease("k", "alice", "carol", 10_000)
        assert await asyncio.wait_for(waiting, 5) is True


def test_the_demo_refuses_etcd_for_its_signals(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"{shared_etcd().url}?prefix=tenure-test-demo/"
    assert main(["demo", "--url", url]) == 2
    err = capsys.readouterr()
    assert "cannot carry signals" in err.out + err.err


@pytest.mark.asyncio
async def test_the_runtime_refuses_etcd(backend: EtcdLeases) -> None:
    async def handler(run: object) -> None:
        return None

    with pytest.raises(tenure.ConfigurationError, match=r"Capability\.EVENTS"):
        tenure.ThreadRuntime(backend, handler)


@pytest.mark.asyncio
async def test_a_client_clock_stepped_ahead_ends_a_lease_early_and_fencing_covers_it(
    unique: str,
) -> None:
    """The limit the docstring states: deadlines are on the clients' wall clocks.
    A client whose clock was stepped 60 s ahead takes a 30 s lease at once, but
    with a higher token, and the old holder learns of the loss at its next renewal."""
    url = f"{shared_etcd().url}?prefix=tenure-test-{unique}/"
    ahead = 60.0
    async with (
        tenure.from_url(url) as holder,
        tenure.from_url(url, clock=lambda: time.time() + ahead) as stepped,
    ):
        granted = await holder.acquire_lease("k", "holder", 30_000)
        taken = await stepped.acquire_lease("k", "stepped", 30_000)
        assert taken.acquired and taken.token is not None and granted.token is not None
        assert taken.token > granted.token
        assert await holder.renew_lease("k", "holder", 30_000) is False
        # The stepped client wrote its deadline on its own clock: to the others
        # the lease now lasts 60 s longer than asked.
        record = await holder.get_lease("k")
        assert record is not None and record.owner == "stepped"
        assert record.ttl_ms > 30_000 + ahead * 1000 * 0.9


@pytest.mark.asyncio
async def test_doctor_warns_of_a_single_member_and_of_members_missing_from_the_url() -> None:
    with EtcdCluster(size=3) as cluster:
        async with EtcdLeases.from_url(cluster.member_url(0)) as partial:
            found = {f.check: f for f in await partial.diagnose()}
        async with EtcdLeases.from_url(cluster.url) as full:
            healthy = {f.check: f for f in await full.diagnose()}
    assert found["endpoints"].level == "warn" and "lists 1 of 3" in found["endpoints"].detail
    assert healthy["members"].level == "ok" and "1 may fail" in healthy["members"].detail
    assert "endpoints" not in healthy
    assert healthy["alarms"].level == "ok" and healthy["server"].detail.startswith("etcd 3.")
    async with EtcdLeases.from_url(shared_etcd().url) as single:
        alone = {f.check: f for f in await single.diagnose()}
    assert alone["members"].level == "warn" and "1 voting member" in alone["members"].detail


@pytest.mark.asyncio
async def test_a_read_that_calls_a_lapsed_lease_free_stops_a_late_renew_reviving_it(
    unique: str,
) -> None:
    """A renew decided before its lease's deadline can reach etcd after it (a slow
    call, a leader election): if a reader called the key free in between, the
    renew must fail, or the lease lives again after it was seen expired (a P2
    violation the faulty-cluster safety run found). The reader's clock, 60 s
    ahead, stands for the time that passes while the holder's renew is on its way."""
    url = f"{shared_etcd().url}?prefix=tenure-test-{unique}/"
    async with (
        tenure.from_url(url) as holder,
        tenure.from_url(url, clock=lambda: time.time() + 60.0) as later,
    ):
        assert (await holder.acquire_lease("k", "holder", 30_000)).acquired
        assert await later.get_lease("k") is None
        assert await holder.renew_lease("k", "holder", 30_000) is False
        assert await holder.get_lease("k") is None
        # A live lease is read without a write: nothing changes for its holder.
        assert (await holder.acquire_lease("k", "holder", 30_000)).acquired
        record = await holder.get_lease("k")
        assert record is not None and record.owner == "holder"
        assert await holder.renew_lease("k", "holder", 30_000)
