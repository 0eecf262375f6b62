"""What tenure records through OpenTelemetry, read back with the SDK's in-memory
reader and exporter, under real outcomes: refusals, revocations, a paused Redis
server, a busy key handed over, a thread runtime's run."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tenure
from tenure.runtime import ThreadRun, ThreadRuntime
from tenure.telemetry import instrument
from tenure.testing import eventually

from .support.redis_server import RedisServer

_READER = InMemoryMetricReader()
_SPANS = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _sdk() -> None:
    # The global providers can be set once per process; tenure's proxies follow them.
    # (A runner that runs this module twice in one process, as mutmut does, finds
    # them set already: a reader joins only one MeterProvider.)
    if isinstance(metrics.get_meter_provider(), MeterProvider):
        return
    metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(_SPANS))
    trace.set_tracer_provider(tracer_provider)


def _total(name: str, **attributes: str) -> float:
    """The sum (counters) or count (histograms) of ``name`` over the points with ``attributes``."""
    data = _READER.get_metrics_data()
    total = 0.0
    for resource in data.resource_metrics if data is not None else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                for point in metric.data.data_points:
                    attrs: Any = point.attributes or {}
                    if all(attrs.get(k) == v for k, v in attributes.items()):
                        # A counter's point has a value, a histogram's a count.
                        total += float(getattr(point, "value", getattr(point, "count", 0)))
    return total


def test_tenure_works_without_opentelemetry_and_imports_it_only_to_record() -> None:
    code = (
        "import asyncio, sys\n"
        "if sys.argv[1] == 'absent':\n"
        "    sys.modules['opentelemetry'] = None  # as if the extra were not installed\n"
        "import tenure\n"
        "from tenure.telemetry import instrument\n"
        "assert not any(m.startswith('opentelemetry.') for m in sys.modules), 'at import'\n"
        "async def main():\n"
        "    async with tenure.from_url('memory://') as b:\n"
        "        b = instrument(b)\n"
        "        await b.acquire_lease('k', 'a', 100)\n"
        "        assert not (await b.acquire_lease('k', 'b', 100)).acquired\n"
        "        await tenure.acquire_wait(b, 'k', 'b', 100, timeout=5)\n"
        "        assert await b.revoke_lease('k')\n"
        "asyncio.run(main())\n"
        "print(any(m.startswith('opentelemetry.') for m in sys.modules))\n"
    )
    for mode, imported in (("absent", "False"), ("present", "True")):
        done = subprocess.run(
            [sys.executable, "-c", code, mode], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == imported


@pytest.mark.asyncio
async def test_instrumented_calls_record_outcomes_durations_and_spans(backend_url: str) -> None:
    _SPANS.clear()
    kind_before = _total("tenure.lease.acquires", **{"tenure.outcome": "refused"})
    granted_before = _total("tenure.lease.acquires", **{"tenure.outcome": "granted"})
    async with tenure.from_url(backend_url) as raw:
        backend = instrument(raw)
        assert (await backend.acquire_lease("job", "alice", 5000)).acquired
        assert not (await backend.acquire_lease("job", "bob", 5000)).acquired
        assert not await backend.renew_lease("job", "bob", 5000)
        with pytest.raises(tenure.InvalidArgument):
            await backend.acquire_lease("", "bob", 5000)
        await backend.release_lease("job", "alice")
    assert _total("tenure.lease.acquires", **{"tenure.outcome": "refused"}) == kind_before + 1
    assert _total("tenure.lease.acquires", **{"tenure.outcome": "granted"}) == granted_before + 1
    assert _total("tenure.lease.operation.duration", **{"tenure.operation": "renew_lease"}) >= 1
    spans = _SPANS.get_finished_spans()
    names = [s.name for s in spans]
    assert names[:5] == [
        "tenure acquire_lease",
        "tenure acquire_lease",
        "tenure renew_lease",
        "tenure acquire_lease",
        "tenure release_lease",
    ]
    assert spans[0].attributes is not None and spans[0].attributes["tenure.lease.key"] == "job"
    assert spans[1].attributes is not None and spans[1].attributes["tenure.outcome"] == "refused"
    assert spans[3].attributes is not None and spans[3].attributes["tenure.outcome"] == "error"


@pytest.mark.asyncio
async def test_a_revoked_hold_counts_a_revocation_and_a_loss() -> None:
    revoked, lost = _total("tenure.lease.revocations"), _total("tenure.lease.lost")
    async with (
        tenure.from_url("memory://") as backend,
        tenure.hold(
            backend, "job", "alice", 3000, renew_every_ms=20, cancel_on_loss=False
        ) as lease,
    ):
        assert await backend.revoke_lease("job")
        await asyncio.wait_for(lease.lost.wait(), 10)
    assert _total("tenure.lease.revocations") == revoked + 1
    assert _total("tenure.lease.lost") == lost + 1


@pytest.mark.asyncio
async def test_renewals_hanging_on_a_paused_server_are_counted_as_failures() -> None:
    failures = _total("tenure.lease.renew.failures", **{"tenure.error": "TimeoutError"})
    with RedisServer() as server:
        async with (
            tenure.from_url(f"{server.url}?quarantine=off") as backend,
            tenure.hold(
                backend, "job", "alice", 1500, renew_every_ms=100, cancel_on_loss=False
            ) as lease,
        ):
            server.pause()
            try:
                await asyncio.wait_for(lease.lost.wait(), 10)
            finally:
                server.resume()
    assert _total("tenure.lease.renew.failures", **{"tenure.error": "TimeoutError"}) > failures


@pytest.mark.asyncio
async def test_a_waiter_handed_a_busy_key_records_the_handoff() -> None:
    handoffs = _total("tenure.lease.handoff.duration")
    backend: Any
    async with tenure.from_url("memory://") as backend:
        await backend.acquire_lease("job", "alice", 60_000)
        waiter = asyncio.create_task(tenure.acquire_wait(backend, "job", "bob", 5000, timeout=10))
        await eventually(lambda: backend._waiters.parked("job") == 1)
        assert _total("tenure.lease.handoff.duration") == handoffs  # a free key is no hand-off
        await backend.release_lease("job", "alice")
        assert (await waiter).acquired
        await tenure.acquire_wait(backend, "free", "carol", 5000, timeout=1)
    assert _total("tenure.lease.handoff.duration") == handoffs + 1


@pytest.mark.asyncio
async def test_the_runtime_counts_its_steps() -> None:
    before = {
        k: _total("tenure.runtime.events", **{"tenure.runtime.event": k})
        for k in ("wake", "deliver", "signal", "run_end")
    }
    done = asyncio.Event()
    seen: list[ThreadRun] = []

    async def handler(run: ThreadRun) -> None:
        seen.append(run)
        async for signal in run.signals():
            if signal.payload == 2:
                done.set()
                return

    async with tenure.from_url("memory://") as backend, ThreadRuntime(backend, handler) as rt:
        await rt.send_signal("t", 1)
        await rt.send_signal("t", 2)
        await asyncio.wait_for(done.wait(), 10)
        await eventually(lambda: not rt.owned_threads())
    after = {k: _total("tenure.runtime.events", **{"tenure.runtime.event": k}) for k in before}
    [run] = seen
    runs = [s for s in _SPANS.get_finished_spans() if s.name == "tenure run"]
    assert runs and runs[-1].attributes is not None
    assert dict(runs[-1].attributes) == {
        "tenure.thread": "t",
        "tenure.run_id": run.run_id,
        "tenure.token": run.token,
        "tenure.run.end": "ok",
    }
    assert after["wake"] == before["wake"] + 1
    assert after["deliver"] == before["deliver"] + 1
    assert after["signal"] == before["signal"] + 2
    assert after["run_end"] >= before["run_end"] + 1


@pytest.mark.asyncio
async def test_a_run_cancelled_by_aclose_ends_its_span_cancelled() -> None:
    busy = asyncio.Event()
    seen: list[ThreadRun] = []

    async def handler(run: ThreadRun) -> None:
        seen.append(run)
        async for _ in run.signals():
            busy.set()
            await asyncio.sleep(3600)

    async with tenure.from_url("memory://") as backend, ThreadRuntime(backend, handler) as rt:
        await rt.send_signal("cancelled-run", 1)
        await asyncio.wait_for(busy.wait(), 10)
    [run] = seen
    [span] = [
        s
        for s in _SPANS.get_finished_spans()
        if s.name == "tenure run" and s.attributes and s.attributes["tenure.run_id"] == run.run_id
    ]
    assert span.attributes is not None and span.attributes["tenure.run.end"] == "cancelled"


def _histogram(name: str) -> Any:
    """The one data point of histogram ``name`` (tenure's calls here carry no attributes
    that differ), as the SDK's exporter hands it over."""
    data = _READER.get_metrics_data()
    for resource in data.resource_metrics if data is not None else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    return metric.data.data_points
    return []


def _buckets_hit(before: list[int], after: list[int]) -> list[int]:
    return [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a > b]


@pytest.mark.asyncio
async def test_histograms_have_buckets_that_tell_subsecond_durations_apart() -> None:
    """The SDK's default bounds (0, 5, 10, 25, ...) put every sub-second duration in
    one bucket; tenure's advice splits milliseconds for calls and seconds for hand-offs."""
    backend: Any
    async with tenure.from_url("memory://") as raw:
        backend = instrument(raw)
        for _ in range(20):
            await backend.acquire_lease("job", "alice", 5000)
    for point in _histogram("tenure.lease.operation.duration"):
        bounds = list(point.explicit_bounds)
        assert bounds[0] <= 0.001 and bounds[-1] >= 5 and len(bounds) >= 10
        # A memory call takes well under a second: it lands in a bucket whose upper bound is too.
        hit = [i for i, n in enumerate(point.bucket_counts) if n]
        assert hit and all(i < len(bounds) and bounds[i] < 1 for i in hit), (bounds, hit)

    def handoffs() -> list[int]:
        points = list(_histogram("tenure.lease.handoff.duration"))
        return list(points[0].bucket_counts) if points else [0] * 17

    before = handoffs()
    async with tenure.from_url("memory://") as backend:
        await backend.acquire_lease("job", "alice", 60_000)
        waiter = asyncio.create_task(tenure.acquire_wait(backend, "job", "bob", 5000, timeout=30))
        await eventually(lambda: backend._waiters.parked("job") == 1)
        await asyncio.sleep(0.3)  # a hand-off of at least 0.3 s
        await backend.release_lease("job", "alice")
        assert (await waiter).acquired
    bounds = list(_histogram("tenure.lease.handoff.duration")[0].explicit_bounds)
    [bucket] = _buckets_hit(before, handoffs())
    assert bucket > 0 and bounds[bucket - 1] >= 0.25, (bounds, bucket)  # not in (0, 5]


_PROMETHEUS = """\
import asyncio

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import generate_latest

metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))

import tenure
from tenure.telemetry import instrument


async def main() -> None:
    async with tenure.from_url("memory://") as raw:
        backend = instrument(raw)
        for _ in range(20):
            await backend.acquire_lease("job", "alice", 5000)


asyncio.run(main())
print(generate_latest().decode())
"""


def test_prometheus_scrapes_subsecond_calls_into_buckets_of_their_own() -> None:
    """Through the real Prometheus exporter, in a process of its own (a reader joins one
    MeterProvider): calls of well under a millisecond fill the low buckets, not (0, 5]."""
    done = subprocess.run(
        [sys.executable, "-c", _PROMETHEUS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    counts = {
        float(line.split('le="', 1)[1].split('"', 1)[0]): float(line.rsplit(" ", 1)[1])
        for line in done.stdout.splitlines()
        if line.startswith("tenure_lease_operation_duration_seconds_bucket{")
        and 'tenure_operation="acquire_lease"' in line
    }
    assert min(counts) <= 0.001 and counts[max(b for b in counts if b <= 0.01)] == 20
    assert any(n > 0 for b, n in counts.items() if b <= 0.0025), counts
