"""Replies on the memory backend: the output contract, quickly, in one process.

The same contract across real processes and backends is in
``test_output_processes.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tenure import ConfigurationError, Fenced, InvalidArgument, MemoryPubSub, OutputTruncated
from tenure.runtime import OutputItem, Retention, SendResult, ThreadRun, ThreadRuntime


@pytest_asyncio.fixture
async def backend() -> AsyncIterator[MemoryPubSub]:
    async with MemoryPubSub() as b:
        yield b


async def echo(run: ThreadRun) -> None:
    async for signal in run.signals():
        for word in str(signal.payload).split():
            await run.append(word)
        await run.append({"text": signal.payload}, kind="final")


def kinds(items: list[OutputItem]) -> list[str]:
    return [i.kind for i in items]


@pytest.mark.asyncio
async def test_reply_reaches_the_sender_with_positions_run_and_token(
    backend: MemoryPubSub,
) -> None:
    async with ThreadRuntime(backend, echo, output=True, idle_timeout=0.05) as rt:
        sent = await rt.send_signal("t1", "hello there")
        assert sent.output_after == 0
        items = await rt.wait_reply(sent, timeout=10)
    assert kinds(items) == ["signal_taken", "token", "token", "final", "signal_finished"]
    assert [i.data for i in items[1:4]] == ["hello", "there", {"text": "hello there"}]
    assert all(i.signal_id == sent.signal_id for i in items)
    assert all(i.run_id == sent.run_id and i.token is not None for i in items)
    positions = [i.position for i in items]
    assert positions == sorted(set(positions))


@pytest.mark.asyncio
async def test_follow_reads_lifecycle_in_order_and_resumes_exactly_once(
    backend: MemoryPubSub,
) -> None:
    async with ThreadRuntime(backend, echo, output=True, idle_timeout=0.05) as rt:
        first = await rt.send_signal("t1", "a b")
        await rt.wait_reply(first, timeout=10)
        second = await rt.send_signal("t1", "c")
        await rt.wait_reply(second, timeout=10)
        seen: list[OutputItem] = []
        async for item in rt.follow("t1"):
            seen.append(item)
            if item.position == 4:
                break
        async for item in rt.follow("t1", after=seen[-1].position):
            seen.append(item)
            if item.kind == "signal_finished" and item.signal_id == second.signal_id:
                break
    assert [i.position for i in seen] == list(range(1, len(seen) + 1))
    assert seen[0].kind == "run_started"
    assert seen[0].data["token"] == seen[0].token
    assert "run_ended" in kinds(seen) or seen.count(seen[0]) == 1
    assert sum(1 for i in seen if i.kind == "final") == 2


@pytest.mark.asyncio
async def test_a_run_that_lost_its_lease_is_fenced_and_nothing_lands(
    backend: MemoryPubSub,
) -> None:
    started = asyncio.Event()
    go_on = asyncio.Event()
    outcome: list[BaseException] = []
    tried = asyncio.Event()

    async def stale(run: ThreadRun) -> None:
        async for _ in run.signals():
            started.set()
            await go_on.wait()
            try:
                await run.append("late")
            except Fenced as exc:
                outcome.append(exc)
            tried.set()
            return

    async with ThreadRuntime(
        backend, stale, output=True, idle_timeout=0.05, cancel_on_loss=False
    ) as rt:
        sent = await rt.send_signal("t1", "x")
        await asyncio.wait_for(started.wait(), 10)
        key = rt.lease_key("t1")
        record = await backend.get_lease(key)
        assert record is not None
        assert await backend.revoke_lease(key, record.token)
        assert (await backend.acquire_lease(key, "someone-else", 60_000)).acquired
        before = await rt._replies().head("t1")
        go_on.set()
        await asyncio.wait_for(tried.wait(), 10)
        assert await rt._replies().head("t1") == before
        assert sent.output_after == 0
    assert isinstance(outcome[0], Fenced)


@pytest.mark.asyncio
async def test_a_reader_behind_retention_is_told(backend: MemoryPubSub) -> None:
    async def chatty(run: ThreadRun) -> None:
        async for _ in run.signals():
            await run.append_many(list(range(20)))

    async with ThreadRuntime(
        backend, chatty, output=Retention(max_items=5), idle_timeout=0.05
    ) as rt:
        sent = await rt.send_signal("t1", "x")
        with pytest.raises(OutputTruncated) as caught:
            await rt.wait_reply(sent, timeout=10)
        assert caught.value.after == 0 and caught.value.first > 1
        tail = []
        async for item in rt.follow("t1", after=caught.value.first - 1):
            tail.append(item)
            if len(tail) == 3:
                break
        assert [i.position for i in tail] == list(range(caught.value.first, caught.value.first + 3))


@pytest.mark.asyncio
async def test_bad_items_and_settings_get_tenure_errors(backend: MemoryPubSub) -> None:
    errors: list[BaseException] = []

    async def bad(run: ThreadRun) -> None:
        async for _ in run.signals():
            for data, kind in ((object(), "token"), ("x", "run_ended"), ("x", "")):
                try:
                    await run.append(data, kind=kind)
                except InvalidArgument as exc:
                    errors.append(exc)

    async with ThreadRuntime(backend, bad, output=True, idle_timeout=0.05) as rt:
        sent = await rt.send_signal("t1", "x")
        await rt.wait_reply(sent, timeout=10)
        with pytest.raises(InvalidArgument):
            rt.follow("t1", after=-1)
    assert len(errors) == 3
    with pytest.raises(InvalidArgument):
        Retention(max_items=0)
    with pytest.raises(InvalidArgument):
        ThreadRuntime(backend, bad, output="yes")  # type: ignore[arg-type]  # checked at run time
    async with ThreadRuntime(backend, bad) as plain:
        with pytest.raises(ConfigurationError):
            plain.follow("t1")


@pytest.mark.asyncio
async def test_a_backend_that_does_not_hold_the_leases_is_refused(backend: MemoryPubSub) -> None:
    async with MemoryPubSub() as leases:
        with pytest.raises(ConfigurationError, match="cannot keep thread output"):
            ThreadRuntime(backend, echo, lease_provider=leases, output=True)


@pytest.mark.asyncio
async def test_bytes_round_trip(backend: MemoryPubSub) -> None:
    async def raw(run: ThreadRun) -> None:
        async for _ in run.signals():
            await run.append(b"\x00\xff", kind="audio")

    async with ThreadRuntime(backend, raw, output=True, idle_timeout=0.05) as rt:
        items = await rt.wait_reply(await rt.send_signal("t1", "x"), timeout=10)
    assert [i.data for i in items if i.kind == "audio"] == [b"\x00\xff"]


@pytest.mark.asyncio
async def test_cancel_stops_the_named_run_only(backend: MemoryPubSub) -> None:
    async def endless(run: ThreadRun) -> None:
        async for signal in run.signals():
            for i in range(signal.payload):
                await run.append(i)
                await asyncio.sleep(0.01)

    async with (
        ThreadRuntime(backend, endless, output=True, idle_timeout=0.05) as owner,
        ThreadRuntime(backend, endless, output=True, idle_timeout=0.05) as other,
    ):
        sent = await owner.send_signal("t1", 1_000_000)
        async for item in other.reply(sent):
            if item.kind == "token":
                break
        assert await other.cancel("t1") == sent.run_id
        items = await other.wait_reply(sent, timeout=10)
        assert [i.kind for i in items][-2:] == ["cancel", "run_ended"]
        assert items[-1].data == {"end": "interrupted"}
        assert items[-2].data == {"by": other.process_id}
        # Late: it names the first run, while a later one runs.
        again = await owner.send_signal("t1", 20)
        async for item in other.reply(again):
            assert item.run_id != sent.run_id
            break
        assert await other.cancel("t1", run_id=sent.run_id) == sent.run_id
        done = await other.wait_reply(again, timeout=10)
        assert [i.kind for i in done][-1] == "signal_finished"
        assert sum(1 for i in done if i.kind == "token") == 20
        assert await other.cancel("nobody") is None


@pytest.mark.asyncio
async def test_an_interrupted_signal_has_a_complete_reply(backend: MemoryPubSub) -> None:
    async def endless(run: ThreadRun) -> None:
        async for signal in run.signals():
            for i in range(signal.payload):
                await run.append(i)
                await asyncio.sleep(0.01)

    async with ThreadRuntime(
        backend, endless, output=True, idle_timeout=0.05, policy="interrupt"
    ) as rt:
        first = await rt.send_signal("t1", 1_000_000)
        async for item in rt.reply(first):
            if item.kind == "token":
                break
        second = await rt.send_signal("t1", 3)
        cut = await rt.wait_reply(first, timeout=10)
        assert cut[-1].kind == "run_ended" and cut[-1].data == {"end": "interrupted"}
        done = await rt.wait_reply(second, timeout=10)
        assert [i.kind for i in done][-1] == "signal_finished"


@pytest.mark.asyncio
async def test_a_rejected_signal_has_no_reply(backend: MemoryPubSub) -> None:
    async with ThreadRuntime(backend, echo, output=True, policy="reject") as rt:
        rejected = SendResult("rejected", None, "s1", "t1", 0)
        with pytest.raises(InvalidArgument, match="rejected"):
            rt.reply(rejected)
