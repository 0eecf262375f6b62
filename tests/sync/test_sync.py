"""``tenure.sync``: the blocking facade, holding, waiting, the decorator and the runtime, from threads."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import tenure
import tenure.sync
from tenure import Event, LeaseLost, LeaseUnavailable, SqlitePubSub, ThreadRun
from tenure.sync import SyncBackend, SyncCallInEventLoop
from tenure.testing import eventually


@pytest.fixture
def backend() -> Iterator[SyncBackend]:
    with tenure.sync.from_url("memory://") as backend:
        yield backend


def test_importing_tenure_does_not_import_sync_and_importing_sync_starts_no_thread() -> None:
    code = (
        "import sys, threading, tenure\n"
        "print('tenure.sync' in sys.modules)\n"
        "import tenure.sync\n"
        "print(threading.active_count())\n"
        "b = tenure.sync.from_url('memory://')\n"
        "print(sorted(t.name for t in threading.enumerate() if t.name.startswith('tenure')))\n"
        "b.close()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["False", "1", "['tenure-sync-loop']"]


def test_the_lease_methods_block_and_return_what_the_async_ones_return(
    backend: SyncBackend,
) -> None:
    granted = backend.acquire_lease("k", "alice", 10_000)
    assert granted.acquired and granted.owner == "alice" and isinstance(granted.token, int)
    assert backend.acquire_lease("k", "bob", 10_000).owner == "alice"
    assert backend.get_lease_owner("k") == "alice"
    assert backend.renew_lease("k", "alice", 10_000) is True
    assert backend.renew_leases(["k", "other"], "alice", 10_000) == [True, False]
    assert backend.renew_owned([("k", "alice"), ("k", "bob")], 10_000) == [True, False]
    assert backend.transfer_lease("k", "alice", "bob", 10_000) is True
    record = backend.get_lease("k")
    assert record is not None and record.owner == "bob" and record.token > granted.token
    backend.release_lease("k", "bob")
    assert backend.get_lease("k") is None
    assert backend.wait_lease_released("k", 1) is True
    assert backend.capabilities == tenure.capabilities_of(backend.backend)
    assert tenure.is_lease_provider(backend)


def test_errors_are_the_async_ones_and_a_closed_backend_says_so() -> None:
    backend = tenure.sync.from_url("memory://")
    with pytest.raises(tenure.InvalidArgument, match=r"^ttl_ms "):
        backend.acquire_lease("k", "alice", 0)
    backend.close()
    backend.close()
    with pytest.raises(tenure.BackendClosed):
        backend.acquire_lease("k", "alice", 1000)
    with pytest.raises(tenure.ConfigurationError, match="unknown URL scheme"):
        tenure.sync.from_url("nope://")


@pytest.mark.asyncio
async def test_a_blocking_call_inside_a_running_event_loop_raises_naming_the_fix() -> None:
    backend = await asyncio.to_thread(tenure.sync.from_url, "memory://")
    with pytest.raises(SyncCallInEventLoop, match=r"asyncio\.to_thread") as info:
        backend.acquire_lease("k", "alice", 1000)
    assert isinstance(info.value, tenure.TenureError) and isinstance(info.value, RuntimeError)
    with pytest.raises(SyncCallInEventLoop):
        tenure.sync.from_url("memory://")
    with pytest.raises(SyncCallInEventLoop), tenure.sync.hold(backend, "k", "alice", 1000):
        pass
    # The fix it names works.
    assert (await asyncio.to_thread(backend.acquire_lease, "k", "alice", 1000)).acquired
    await asyncio.to_thread(backend.close)


def test_many_threads_share_one_backend_and_one_of_them_wins_each_key(
    backend: SyncBackend,
) -> None:
    def race(n: int) -> list[bool]:
        return [backend.acquire_lease(f"key-{k}", f"owner-{n}", 10_000).acquired for k in range(20)]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(race, range(16)))
    for k in range(20):
        assert sum(r[k] for r in results) == 1


def test_hold_renews_and_releases(backend: SyncBackend) -> None:
    with tenure.sync.hold(backend, "job", "worker-a", 300) as lease:
        assert lease.held and lease.token is not None
        assert tenure.sync.current_lease() is lease
        granted = lease.token
        # Past one and a half TTLs, the lease is still there: it was renewed.
        threading.Event().wait(0.45)
        record = backend.get_lease("job")
        assert record is not None and (record.owner, record.token) == ("worker-a", granted)
        lease.ensure_held()
        with pytest.raises(LeaseUnavailable) as info:
            tenure.sync.hold(backend, "job", "worker-b", 300).__enter__()
        assert info.value.holder == "worker-a"
    assert backend.get_lease("job") is None
    assert not lease.held
    assert backend.acquire_lease("job", "worker-b", 300).token > granted
    with pytest.raises(tenure.TenureError, match="outside"):
        tenure.sync.current_lease()


def test_a_lost_lease_is_seen_in_the_body_thread_and_raised_at_exit(backend: SyncBackend) -> None:
    called: list[tuple[str, str]] = []
    on_lost_ran = threading.Event()

    def on_lost(lease: tenure.sync.SyncHeldLease) -> None:
        called.append((lease.key, threading.current_thread().name))
        on_lost_ran.set()

    hold = tenure.sync.hold(backend, "job", "worker-a", 300, on_lost=on_lost)
    lease = hold.__enter__()
    backend.release_lease("job", "worker-a")  # taken away behind the holder's back
    assert lease.lost.wait(10)
    assert not lease.held
    with pytest.raises(LeaseLost):
        lease.ensure_held()
    assert on_lost_ran.wait(10)
    with pytest.raises(LeaseLost, match="refused"):
        hold.__exit__(None, None, None)
    assert called == [("job", called[0][1])]
    assert called[0][1].startswith("tenure-sync-callback")


def test_acquire_wait_wakes_when_another_thread_releases(backend: SyncBackend) -> None:
    backend.acquire_lease("busy", "holder", 60_000)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(tenure.sync.acquire_wait, backend, "busy", "waiter", 1000, timeout=30)
        assert backend.get_lease_owner("busy") == "holder"
        backend.release_lease("busy", "holder")
        granted = waiting.result()
    assert granted.acquired and granted.owner == "waiter"
    with pytest.raises(LeaseUnavailable):
        tenure.sync.acquire_wait(backend, "busy", "third", 1000, timeout=0)


def test_renew_many_returns_the_lost_keys(backend: SyncBackend) -> None:
    backend.acquire_lease("a", "o", 1000)
    assert tenure.sync.renew_many(backend, "o", ["a", "b"], 1000) == {"b"}
    with pytest.raises(tenure.InvalidArgument):
        tenure.sync.renew_many(backend, "o", "a", 1000)


def test_the_helpers_refuse_an_async_backend() -> None:
    with pytest.raises(tenure.InvalidArgument, match=r"tenure\.sync\.from_url"):
        tenure.sync.hold(tenure.NoopLeaseProvider(), "k", "o", 1000)  # type: ignore[arg-type]


def test_singleton_runs_one_call_per_key_at_a_time_with_increasing_tokens(
    backend: SyncBackend,
) -> None:
    active: dict[str, int] = {}
    most = 0
    tokens: dict[str, list[int]] = {"a": [], "b": []}
    guard = threading.Lock()

    @tenure.sync.singleton(backend, key=lambda name, n: f"job:{name}", ttl_ms=5_000)
    def job(name: str, n: int) -> int:
        nonlocal most
        token = tenure.sync.current_lease().token
        assert token is not None
        with guard:
            active[name] = active.get(name, 0) + 1
            most = max(most, active[name])
            tokens[name].append(token)
        threading.Event().wait(0.002)
        with guard:
            active[name] -= 1
        return n

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(job, ["a", "b"] * 20, range(40)))
    assert results == list(range(40))
    assert most == 1
    for name in ("a", "b"):
        assert len(tokens[name]) == 20 and tokens[name] == sorted(set(tokens[name]))
    assert job.__name__ == "job"


def test_singleton_with_a_url_and_wait_zero_refuses_a_busy_key() -> None:
    entered = threading.Event()
    leave = threading.Event()

    @tenure.sync.singleton("memory://", key="report", wait=0)
    def report() -> str:
        entered.set()
        leave.wait(10)
        return "done"

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(report)
        assert entered.wait(10)
        with pytest.raises(LeaseUnavailable):
            report()
        leave.set()
        assert first.result() == "done"
    assert report() == "done"


def test_subscribe_runs_a_plain_callback_in_a_worker_thread(backend: SyncBackend) -> None:
    got: list[tuple[Any, str]] = []
    done = threading.Event()

    def callback(event: Event) -> None:
        got.append((event.data, threading.current_thread().name))
        if event.data == 1:
            # A callback may block and may call the backend: it is not on the loop.
            backend.publish("replies", Event(type="reply", data=2))
        else:
            done.set()

    backend.subscribe("questions", callback, group="g")
    backend.subscribe("replies", callback)
    backend.publish("questions", Event(type="ask", data=1))
    assert done.wait(10)
    backend.unsubscribe("questions", callback)
    backend.unsubscribe("replies", callback)
    assert [data for data, _ in got] == [1, 2]
    assert all(name.startswith("tenure-sync-callback") for _, name in got)


def test_a_sync_thread_runtime_takes_signals_from_many_threads(backend: SyncBackend) -> None:
    handled: dict[str, list[int]] = {}
    all_in = threading.Event()

    async def agent(run: ThreadRun) -> None:
        async for signal in run.signals():
            handled.setdefault(run.thread_key, []).append(signal.payload["n"])
            if sum(len(v) for v in handled.values()) == 40:
                all_in.set()

    with tenure.sync.SyncThreadRuntime(backend, agent, ttl_ms=3_000, idle_timeout=0.2) as rt:

        def send(n: int) -> str:
            return rt.send_signal(f"thread-{n % 4}", {"n": n}, signal_id=f"s-{n}").outcome

        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(send, range(40)))
        assert set(outcomes) <= {"wake", "deliver"}
        assert all_in.wait(20)
    assert sorted(n for v in handled.values() for n in v) == list(range(40))
    # One sender thread per thread key would keep send order; here only the set is checked.
    assert set(handled) == {f"thread-{i}" for i in range(4)}


def test_a_stalled_loop_thread_cannot_hide_a_loss_from_the_body(backend: SyncBackend) -> None:
    from tenure.sync import _portal

    hold = tenure.sync.hold(backend, "job", "worker-a", 300)
    lease = hold.__enter__()
    stalled = threading.Event()

    def stall() -> None:  # the loop thread stops: no renewal can run
        stalled.set()
        threading.Event().wait(0.5)

    _portal.portal().loop.call_soon_threadsafe(stall)
    assert stalled.wait(10)
    threading.Event().wait(0.25)  # past the renew deadline (200 ms), the loop still stalled
    assert not lease.held
    with pytest.raises(LeaseLost, match="renew deadline"):
        lease.ensure_held()
    with pytest.raises(LeaseLost):
        hold.__exit__(None, None, None)
    assert lease.lost.is_set()  # declared by the loop once it ran again


def test_a_duplicate_subscription_is_refused_and_unsubscribe_removes_the_one_there_is(
    backend: SyncBackend,
) -> None:
    got: list[Any] = []
    other: list[Any] = []

    def callback(event: Event) -> None:
        got.append(event.data)

    backend.subscribe("jobs", callback, group="g")
    with pytest.raises(tenure.InvalidArgument, match="already subscribed to topic 'jobs'"):
        backend.subscribe("jobs", callback, group="g")
    with pytest.raises(tenure.InvalidArgument, match="already subscribed"):
        backend.subscribe("jobs", callback)
    backend.unsubscribe("jobs", callback)
    backend.subscribe("jobs", other.append, group="g")
    for i in range(10):
        backend.publish("jobs", Event(type="job", data=i))
    backend.flush()
    backend.unsubscribe("jobs", other.append)
    # No hidden member was left behind to take a share of the group's events.
    assert (got, [e.data for e in other]) == ([], list(range(10)))


_SHUTDOWN_CHILD = """
import logging, sys, threading, time
import tenure.sync
from tenure import Event

logging.basicConfig(level=logging.ERROR)
db, log = sys.argv[1], sys.argv[2]
backend = tenure.sync.from_url(f"sqlite:///{db}")

def callback(event):
    with open(log, "a") as f:
        f.write(f"{event.data}\\n")

backend.subscribe("jobs", callback, group="g")

def publisher():
    for i in range(40):
        backend.publish("jobs", Event(type="job", data=i))
        time.sleep(0.01)
    time.sleep(0.5)

threading.Thread(target=publisher).start()
# The main thread returns now, while the publisher (a non-daemon thread) runs:
# concurrent.futures takes no new work from here on.
"""


@pytest.mark.asyncio
async def test_a_subscriber_whose_interpreter_is_shutting_down_leaves_its_events_to_the_group(
    tmp_path: Path,
) -> None:
    db, log = tmp_path / "events.db", tmp_path / "handled"
    script = tmp_path / "child.py"
    script.write_text(_SHUTDOWN_CHILD)
    async with SqlitePubSub(db) as events:

        async def nothing(event: Event) -> None:
            raise AssertionError("only creates the group")

        await events.subscribe("jobs", nothing, group="g")
        await events.unsubscribe("jobs", nothing)
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(db), str(log), stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, err.decode()
    handled = [int(line) for line in log.read_text().split()] if log.exists() else []
    got: list[int] = []

    async def member(event: Event) -> None:
        got.append(event.data)

    async with SqlitePubSub(db) as events:
        await events.subscribe("jobs", member, group="g")
        # Handed back at once, not after visibility_timeout: well within it.
        await eventually(lambda: len(set(handled) | set(got)) == 40, timeout=15)
        await events.unsubscribe("jobs", member)
    assert sorted(set(handled) | set(got)) == list(range(40))
    assert "cannot run the callback subscribed to topic 'jobs'" in err.decode()


_EXIT_CHILD = """
import sys, threading
import tenure, tenure.sync
from tenure import Event

with tenure.sync.from_url("memory://") as backend:
    attempts = []
    done = threading.Event()

    def callback(event):
        attempts.append(event.attempt)
        if event.attempt == 1:
            sys.exit(3)  # must not reach tenure's loop thread
        done.set()

    backend.subscribe("jobs", callback, group="g")
    backend.publish("jobs", Event(type="job"))
    assert done.wait(10), attempts
    with tenure.sync.hold(backend, "k", "me", 5000) as lease:  # the facade still works
        assert lease.token
    backend.unsubscribe("jobs", callback)
print("attempts", attempts)

# A loop thread that dies anyway is reported, not waited for.
from tenure.sync import _portal
_portal.portal().loop.call_soon_threadsafe(sys.exit, 4)
_portal.portal().thread.join(10)
try:
    tenure.sync.from_url("memory://")
except _portal.SyncLoopDied as exc:
    print("died:", exc)
"""


def test_sys_exit_in_a_callback_is_its_failure_and_a_dead_loop_thread_is_reported(
    tmp_path: Path,
) -> None:
    script = tmp_path / "child.py"
    script.write_text(_EXIT_CHILD)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "attempts [1, 2]" in out.stdout
    assert "died: tenure.sync's loop thread has ended (SystemExit(4) reached it)" in out.stdout


_LOST_AT_SHUTDOWN_CHILD = """
import threading, time
import tenure.sync

backend = tenure.sync.from_url("memory://")

def on_lost(lease):
    print("on_lost ran for", lease.key, flush=True)

def worker():
    try:
        with tenure.sync.hold(backend, "k", "me", 600, on_lost=on_lost) as lease:
            backend.revoke_lease("k")
            deadline = time.monotonic() + 10
            while lease.held and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.5)
    except tenure.LeaseLost:
        print("body saw the loss", flush=True)

threading.Thread(target=worker).start()
# The main thread returns now: concurrent.futures takes no new work from here on.
"""


def test_on_lost_runs_while_the_interpreter_is_shutting_down(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_LOST_AT_SHUTDOWN_CHILD)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "body saw the loss" in out.stdout
    assert "on_lost ran for k" in out.stdout, out.stderr
