"""The Health page's telemetry: tenure's metrics as this process recorded them.

Read from an OpenTelemetry SDK metric reader that can be read on demand
(``InMemoryMetricReader``; ``tenure dashboard --telemetry`` installs one and
wraps its backend with :func:`tenure.telemetry.instrument`, so every lease call
the dashboard makes is counted). Only this process's records: a worker's
counters are in the worker's process (export them to Prometheus there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MetricRow", "metric_rows"]


@dataclass(frozen=True, slots=True)
class MetricRow:
    name: str
    attributes: str
    value: str


def metric_rows(reader: Any) -> list[MetricRow]:
    """The ``tenure.*`` metrics ``reader`` has now: a counter's total, a histogram's
    count and mean, one row per set of attributes, by name."""
    data = reader.get_metrics_data()
    rows = []
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if not metric.name.startswith("tenure."):
                    continue
                for point in metric.data.data_points:
                    attributes = ", ".join(
                        f"{name.removeprefix('tenure.')}={value}"
                        for name, value in sorted((point.attributes or {}).items())
                    )
                    rows.append(MetricRow(metric.name, attributes, _value(point, metric.unit)))
    return sorted(rows, key=lambda row: (row.name, row.attributes))


def _value(point: Any, unit: str) -> str:
    if hasattr(point, "bucket_counts"):  # a histogram
        if not point.count:
            return "0"
        mean = point.sum / point.count
        shown = f"{mean * 1000:.2f} ms" if unit == "s" else f"{mean:g} {unit}"
        return f"{point.count} (mean {shown})"
    return str(point.value)
