"""Double-texting policies across real processes sharing one backend.

A burst of coalescing signals from five processes during one run, a send's
policy carried to an owner with another default, and each policy with the
owner killed while signals wait: every signal whose send returned is run or
settled as its policy allows, visibly, and never two runs at once. Persisted
signals outlive their sender and the sweeps of every process, and run first
at the thread's next wake.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from tenure.testing import eventually
from tests.conftest import isolated_url
from tests.support.servers import drop_postgres_schema

from .test_runtime_processes import Doc, Spawner, Worker, _drop_redis_prefix, assert_never_two_runs


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    kind: str = request.param
    yield isolated_url(kind, unique=unique, tmp_path=tmp_path)
    if kind == "redis":
        _drop_redis_prefix(f"tenure-test-{unique}:")
    elif kind == "postgres":
        drop_postgres_schema(f"tenure_test_{unique}")


@pytest_asyncio.fixture
async def spawn(url: str) -> AsyncIterator[Spawner]:
    spawner = Spawner(url)
    try:
        yield spawner
    finally:
        await spawner.cleanup()


def coalesced_events(workers: list[Worker]) -> list[Doc]:
    return [d for w in workers for d in w.of("event", kind="coalesced")]


@pytest.mark.asyncio
async def test_a_burst_of_100_coalescing_signals_from_5_processes_makes_one_more_run(
    spawn: Spawner, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    owner = await spawn("owner", "--idle", "0.5")
    senders = [await spawn(f"s{i}", "--policy", "coalesce") for i in range(5)]
    first = await owner.send("thread", {"hold": str(release)})
    await owner.wait(lambda: bool(owner.of("take", sid=first["signal_id"])))

    async def burst(w: Worker) -> list[Doc]:
        return [await w.send("thread", [w.name, i]) for i in range(20)]

    sent = [d for ds in await asyncio.gather(*(burst(w) for w in senders)) for d in ds]
    assert {d["outcome"] for d in sent} == {"deliver"}
    # The owner learns of every coalescing signal while the run is busy...
    await owner.wait(lambda: len(owner.of("event", kind="coalescing")) == 100, timeout=60)
    release.touch()
    await owner.wait(lambda: len(owner.of("take")) == 2 and bool(owner.of("run_end")))
    # ... and settles every signal but the last in the log as coalesced into it,
    # whatever order the senders' clocks stamped them in.
    assert len(coalesced_events([owner])) == 99
    await asyncio.sleep(0.5)  # nothing else runs
    takes = [d for w in (owner, *senders) for d in w.of("take")]
    assert len(takes) == 2
    last = takes[1]
    assert sorted([last["sid"], *last["coalesced"]]) == sorted(d["signal_id"] for d in sent)
    assert len(last["coalesced"]) == 99
    assert {e["sid"] for e in coalesced_events([owner])} == set(last["coalesced"])


@pytest.mark.asyncio
async def test_debounce_holds_its_window_whatever_the_senders_clocks_say(spawn: Spawner) -> None:
    # Three senders whose clocks are seconds apart take turns on an idle thread,
    # well within the window of one another: the thread runs once, with all of
    # them, a whole window after the last send began. Were the window counted on
    # the signals' send times, the skews alone would split the burst.
    window = 1.5
    skews = ["-5", "5", "-3"]
    senders = [
        await spawn(f"s{i}", "--policy", "debounce", "--window", str(window), "--clock-skew", skew)
        for i, skew in enumerate(skews)
    ]
    sent: list[Doc] = []
    last_began = 0.0
    for n in range(12):
        last_began = time.monotonic()
        sent.append(await senders[n % 3].send("thread", n))
        await asyncio.sleep(0.05)
    assert sent[0]["outcome"] == "wake"
    assert {d["outcome"] for d in sent[1:]} == {"deliver"}

    def takes() -> list[Doc]:
        return [d for w in senders for d in w.of("take")]

    await eventually(lambda: bool(takes()), timeout=60)
    await asyncio.sleep(2 * window)  # nothing else runs
    assert len(takes()) == 1
    take = takes()[0]
    assert [*take["coalesced"], take["sid"]] == [d["signal_id"] for d in sent]
    # The owner heard of the last signal after its send began (one host's clock).
    assert take["t"] >= last_began + window
    assert len(coalesced_events(senders)) == 11


@pytest.mark.asyncio
async def test_signals_discarded_while_a_run_is_busy_never_run_and_are_said_so(
    spawn: Spawner, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    owner = await spawn("owner", "--idle", "0.5")
    sender = await spawn("sender", "--policy", "discard")
    busy = await owner.send("thread", {"hold": str(release)})
    await owner.wait(lambda: bool(owner.of("take", sid=busy["signal_id"])))
    sent = [await sender.send("thread", n) for n in range(5)]
    assert {d["outcome"] for d in sent} == {"deliver"}
    after = await sender.send("thread", "after", policy="enqueue")
    # The owner decides when it hears of each (the request on the control topic):
    # let the requests reach it while the run is still busy.
    await asyncio.sleep(1.0)
    release.touch()
    await owner.wait(lambda: bool(owner.of("done", sid=after["signal_id"])))
    discarded = [e["sid"] for e in owner.of("event", kind="discarded")]
    assert discarded == [d["signal_id"] for d in sent]
    assert [d["payload"] for d in owner.of("take")] == [{"hold": str(release)}, "after"]


@pytest.mark.asyncio
async def test_a_send_s_policy_reaches_an_owner_with_another_default(spawn: Spawner) -> None:
    owner = await spawn("owner", "--policy", "enqueue")
    sender = await spawn("sender", "--policy", "enqueue")
    busy = await owner.send("thread", {"block": True})
    await owner.wait(lambda: bool(owner.of("take", sid=busy["signal_id"])))
    new = await sender.send("thread", "now", policy="interrupt")
    assert new["outcome"] == "deliver"
    await owner.wait(lambda: bool(owner.of("done", sid=new["signal_id"])))
    assert owner.of("run_end")[0]["detail"] == "interrupted"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "policy",
    ["enqueue", "coalesce", "interrupt", "rollback", "reject", "debounce", "discard", "persist"],
)
async def test_the_owner_killed_while_signals_wait_loses_nothing_its_policy_does_not_settle(
    spawn: Spawner, policy: str
) -> None:
    owner = await spawn("owner", "--idle", "0.3")
    heir = await spawn("heir", "--idle", "0.3")
    sender = await spawn("sender", "--policy", policy)
    busy = await owner.send("thread", {"block": True})
    await owner.wait(lambda: bool(owner.of("take", sid=busy["signal_id"])))
    sent = [await sender.send("thread", n) for n in range(5)]
    if policy == "coalesce":
        await owner.wait(lambda: len(owner.of("event", kind="coalescing")) == 5)
    owner.kill()
    stored = [d["signal_id"] for d in sent if d["outcome"] != "rejected"]
    workers = [owner, heir, sender]

    def ran() -> set[str]:
        # interrupt and rollback unblock the owner: it may finish before it is killed.
        return {d["sid"] for w in workers for d in w.of("done")}

    def coalesced() -> set[str]:
        into = {c for w in workers for d in w.of("take") for c in d["coalesced"]}
        return into | {e["sid"] for e in coalesced_events(workers)}

    if policy == "discard":
        # Each runs, or is discarded by an owner that heard of it while busy and
        # lived to read it: one that died first told nobody, and the heir runs it.
        def settled() -> set[str]:
            return ran() | {e["sid"] for w in workers for e in w.of("event", kind="discarded")}

        await eventually(lambda: busy["signal_id"] in ran(), timeout=60)
        await eventually(lambda: set(stored) <= settled(), timeout=60)
        assert_never_two_runs(workers, "thread")
        return
    if policy == "reject":
        assert stored == []
        # The blocked signal, never acknowledged, runs again elsewhere (attempt 2 passes).
        await eventually(lambda: busy["signal_id"] in ran(), timeout=60)
        return
    last = stored[-1]
    await eventually(lambda: last in ran(), timeout=60)
    await asyncio.sleep(0.5)
    if policy in ("enqueue", "persist"):
        # persist: sent while the thread was awake, taken in order like enqueue.
        assert set(stored) <= ran()
    elif policy in ("coalesce", "debounce"):
        assert set(stored) <= ran() | coalesced()
    else:
        # interrupt/rollback: each newer signal may skip the older ones; the newest runs.
        assert last in ran()
    assert_never_two_runs(workers, "thread")


@pytest.mark.asyncio
async def test_an_owner_killed_between_reads_strands_nothing_behind_a_persisted_signal(
    spawn: Spawner,
) -> None:
    # Found by the thread harness's policy mix (SQLite soak): the owner had
    # acknowledged everything it read when it died; behind it a persisted signal,
    # then signals sent to its active run ("deliver"). The next owner read the
    # persisted one first, not awake, ended there, and the rest waited for a
    # send that never came. A persisted signal stored while a run holds the
    # thread is now taken in order by whoever reads it.
    owner = await spawn("owner", "--idle", "30")
    heir = await spawn("heir", "--idle", "0.3")
    sender = await spawn("sender", "--idle", "0.3")
    first = await owner.send("thread", "first")
    await owner.wait(lambda: bool(owner.of("done", sid=first["signal_id"])))
    await asyncio.sleep(0.3)  # the run asked for its next signal: "first" is acknowledged
    owner.pause()  # reads nothing more, and holds the thread until its lease expires
    kept = await sender.send("thread", "kept", policy="persist")
    behind = [await sender.send("thread", n, policy="enqueue") for n in range(2)]
    assert kept["outcome"] == "persisted"
    assert {d["outcome"] for d in behind} == {"deliver"}
    owner.kill()
    workers = [owner, heir, sender]

    def ran() -> list[str]:
        return [d["sid"] for w in workers for d in w.of("done")]

    await eventually(lambda: behind[-1]["signal_id"] in ran(), timeout=60)
    assert ran()[1:] == [kept["signal_id"], *(d["signal_id"] for d in behind)]
    assert_never_two_runs(workers, "thread")


@pytest.mark.asyncio
async def test_persisted_signals_outlive_their_sender_and_run_first_at_the_next_wake(
    spawn: Spawner,
) -> None:
    sender = await spawn("sender", "--idle", "0.3", "--policy", "persist")
    watchers = [await spawn(name, "--idle", "0.3") for name in ("a", "b")]
    kept = [await sender.send("thread", n) for n in range(3)]
    assert {d["outcome"] for d in kept} == {"persisted"}
    sender.kill()
    # Every process sweeps about every 0.7 s (ttl 2 s): several sweeps each.
    await asyncio.sleep(3.0)
    workers = [sender, *watchers]
    assert [(w.name, d) for w in workers for d in w.of("take")] == [], [
        (w.name, w.of("event")) for w in workers
    ]
    assert [e for w in workers for e in w.of("event", kind="takeover")] == []
    woke = await watchers[0].send("thread", "wake")
    assert woke["outcome"] == "wake"
    await watchers[0].wait(lambda: bool(watchers[0].of("done", sid=woke["signal_id"])))
    await asyncio.sleep(0.5)
    takes = [d["sid"] for w in workers for d in w.of("take")]
    assert takes == [d["signal_id"] for d in kept] + [woke["signal_id"]]
    assert_never_two_runs(workers, "thread")
