"""Metrics and traces through OpenTelemetry (the optional extra ``tenure[otel]``).

tenure records through the OpenTelemetry *API*: without an SDK configured by
the application every record is a no-op, and without the extra installed
nothing is imported at all. What is recorded:

Always (cheap, off the hot path):

- ``tenure.lease.renew.failures`` (counter): renewals that failed or hung and
  were retried, by ``tenure.error``;
- ``tenure.lease.lost`` (counter): held leases declared lost (``hold`` and
  the runtime's runs);
- ``tenure.lease.revocations`` (counter): leases revoked with ``revoke_lease``;
- ``tenure.lease.handoff.duration`` (histogram, s, buckets from 1 ms to 300 s):
  how long ``acquire_wait`` (and ``hold(wait=...)``) waited for a busy key
  before it was granted;
- ``tenure.runtime.events`` (counter): the thread runtime's steps by
  ``tenure.runtime.event`` (``wake``, ``deliver``, ``signal``, ``takeover``,
  ``lost``, ``run_end``, ...), i.e. signals sent, delivered and handled, runs
  and takeovers;
- a span ``tenure run`` around each run of a thread's handler (its thread, run
  id and token, and how it ended: ``tenure.run.end``, the ``run_end`` event's
  detail, ``ok``, ``failed``, ``lost``, ``interrupted`` or ``cancelled``), so
  the handler's own spans nest under it.

Per backend call, only for a backend wrapped with :func:`instrument` (every
call then pays for a span and a histogram record, so it is a choice):

- ``tenure.lease.operation.duration`` (histogram, s, buckets from 0.1 ms to
  10 s) by ``tenure.operation``, ``tenure.backend`` and ``tenure.outcome``;

The histograms' bucket bounds are given as advice
(``explicit_bucket_boundaries_advisory``, OpenTelemetry API 1.23 and later);
an SDK View configured by the application takes precedence over it.
- ``tenure.lease.acquires`` (counter) by ``tenure.outcome``: ``granted``,
  ``refused`` (held by another owner), ``quarantined`` (refused with no
  holder: a Redis that may have lost leases), ``error``;
- one span per call, named ``tenure <operation>``, with the lease key as
  ``tenure.lease.key`` and the outcome.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ._contract import AcquireResult, Backend, Capability, LeaseRecord, capabilities_of
from ._lifecycle import AsyncCloseable

__all__ = ["InstrumentedBackend", "instrument"]

_UNSET: Any = object()
_meter: Any = _UNSET
_tracer: Any = _UNSET
_instruments: dict[str, Any] = {}


class _Nothing:
    """Stands in for a meter, tracer, instrument or span without OpenTelemetry."""

    def __getattr__(self, name: str) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self

    # What every count, observation and run calls, spelled out: a lookup that
    # falls through to __getattr__ costs more than the OpenTelemetry API's no-op.
    def add(self, *args: Any, **kwargs: Any) -> None:
        return None

    record = add
    set_attribute = add

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NOTHING = _Nothing()


def _otel() -> tuple[Any, Any]:
    """The meter and tracer (OpenTelemetry's proxies: they follow an SDK set later)."""
    global _meter, _tracer
    if _meter is _UNSET:
        try:
            from opentelemetry import metrics, trace
        except ImportError:
            _meter = _tracer = _NOTHING
        else:
            from ._version import __version__

            _meter = metrics.get_meter("tenure", __version__)
            _tracer = trace.get_tracer("tenure", __version__)
    return _meter, _tracer


def _instrument(kind: str, name: str, unit: str, description: str, **advice: Any) -> Any:
    found = _instruments.get(name)
    if found is None:
        meter, _ = _otel()
        create = getattr(meter, f"create_{kind}")
        found = create(name, unit=unit, description=description, **advice)
        _instruments[name] = found
    return found


def span(name: str, attributes: dict[str, str | int]) -> Any:
    """A context manager: a span named ``name`` around the block (a no-op without OpenTelemetry)."""
    _, tracer = _otel()
    return tracer.start_as_current_span(name, attributes=attributes)


def count(name: str, attributes: dict[str, str] | None = None, amount: int = 1) -> None:
    """Add to one of tenure's counters (see the module docstring for the names)."""
    unit, description = _COUNTERS[name]
    _instrument("counter", name, unit, description).add(amount, attributes)


def observe(name: str, value: float, attributes: dict[str, str] | None = None) -> None:
    """Record in one of tenure's histograms."""
    unit, description, bounds = _HISTOGRAMS[name]
    histogram = _instrument(
        "histogram", name, unit, description, explicit_bucket_boundaries_advisory=bounds
    )
    histogram.record(value, attributes)


_COUNTERS = {
    "tenure.lease.renew.failures": ("{renewal}", "Renewals that failed or hung and were retried"),
    "tenure.lease.lost": ("{lease}", "Held leases declared lost"),
    "tenure.lease.revocations": ("{lease}", "Leases revoked with revoke_lease"),
    "tenure.lease.acquires": ("{call}", "acquire_lease calls by outcome"),
    "tenure.runtime.events": ("{event}", "Thread runtime steps by kind"),
}
# Bucket bounds in seconds, given to the SDK as advice (a View set by the
# application still wins): its default bounds (0, 5, 10, 25, ... 10000) would put
# every sub-second call in one bucket. A backend call takes from a fraction of
# a millisecond (memory, a local Redis) to seconds (a server failing over); a
# hand-off waits for a holder's release or its TTL, up to minutes.
_OPERATION_BOUNDS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
_HANDOFF_BOUNDS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
_HISTOGRAMS = {
    "tenure.lease.handoff.duration": (
        "s",
        "Time a waiter waited for a busy key",
        _HANDOFF_BOUNDS,
    ),
    "tenure.lease.operation.duration": (
        "s",
        "Duration of backend lease calls",
        _OPERATION_BOUNDS,
    ),
}


class InstrumentedBackend(AsyncCloseable):
    """A backend whose lease calls each record a span, a duration and an outcome.

    Everything else (pub/sub, ``capabilities``, ...) is the wrapped backend's.
    """

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self._kind = type(inner).__name__
        self.capabilities: Capability = capabilities_of(inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"instrument({self.inner!r})"

    async def _call(self, operation: str, key: str | None, call: Any) -> Any:
        _, tracer = _otel()
        attributes = {"tenure.operation": operation, "tenure.backend": self._kind}
        started = time.perf_counter()
        outcome = "ok"
        with tracer.start_as_current_span(f"tenure {operation}") as span:
            if key is not None:
                span.set_attribute("tenure.lease.key", key)
            try:
                result = await call
            except BaseException as exc:
                outcome = "error"
                span.set_attribute("tenure.outcome", "error")
                span.set_attribute("tenure.error", type(exc).__name__)
                raise
            else:
                if isinstance(result, AcquireResult):
                    if result.acquired:
                        outcome = "granted"
                    elif result.owner is None:
                        outcome = "quarantined"
                    else:
                        outcome = "refused"
                elif isinstance(result, bool):
                    outcome = "ok" if result else "refused"
                span.set_attribute("tenure.outcome", outcome)
                return result
            finally:
                attributes["tenure.outcome"] = outcome
                observe(
                    "tenure.lease.operation.duration", time.perf_counter() - started, attributes
                )
                if operation == "acquire_lease":
                    count(
                        "tenure.lease.acquires",
                        {"tenure.outcome": outcome, "tenure.backend": self._kind},
                    )

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        result: AcquireResult = await self._call(
            "acquire_lease", key, self.inner.acquire_lease(key, owner, ttl_ms)
        )
        return result

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        result: bool = await self._call(
            "renew_lease", key, self.inner.renew_lease(key, owner, ttl_ms)
        )
        return result

    async def release_lease(self, key: str, owner: str) -> None:
        await self._call("release_lease", key, self.inner.release_lease(key, owner))

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        result: bool = await self._call(
            "transfer_lease", key, self.inner.transfer_lease(key, from_owner, to_owner, ttl_ms)
        )
        return result

    async def get_lease_owner(self, key: str) -> str | None:
        result: str | None = await self._call(
            "get_lease_owner", key, self.inner.get_lease_owner(key)
        )
        return result

    async def get_lease(self, key: str) -> LeaseRecord | None:
        result: LeaseRecord | None = await self._call("get_lease", key, self.inner.get_lease(key))
        return result

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        result: list[bool] = await self._call(
            "renew_leases", None, self.inner.renew_leases(keys, owner, ttl_ms)
        )
        return result

    async def renew_owned(self, leases: Sequence[tuple[str, str]], ttl_ms: int) -> list[bool]:
        result: list[bool] = await self._call(
            "renew_owned", None, self.inner.renew_owned(leases, ttl_ms)
        )
        return result

    async def wait_lease_released(self, key: str, timeout: float) -> bool:
        return await self.inner.wait_lease_released(key, timeout)

    def scan_leases(
        self, prefix: str = "", limit: int | None = None
    ) -> AsyncIterator[tuple[str, LeaseRecord]]:
        return self.inner.scan_leases(prefix, limit)

    async def revoke_lease(self, key: str, token: int | None = None) -> bool:
        result: bool = await self._call("revoke_lease", key, self.inner.revoke_lease(key, token))
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()


def instrument(backend: Backend) -> InstrumentedBackend:
    """``backend`` with a span, a duration and an outcome recorded for each lease call."""
    return InstrumentedBackend(backend)
