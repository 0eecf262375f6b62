"""The public surface changes only on purpose: update this list in the same commit."""

from __future__ import annotations

import tenure

EXPECTED = [
    "AcquireResult",
    "BackendClosed",
    "BackendUnavailable",
    "ConfigurationError",
    "Event",
    "HeldLease",
    "InvalidArgument",
    "LeaseLost",
    "LeaseProvider",
    "LeaseRecord",
    "LeaseUnavailable",
    "MemoryPubSub",
    "NoopLeaseProvider",
    "PubSub",
    "RuntimeEvent",
    "SendResult",
    "Signal",
    "SqlitePubSub",
    "TenureError",
    "ThreadRun",
    "ThreadRuntime",
    "acquire_wait",
    "default_url",
    "from_url",
    "hold",
    "is_lease_provider",
    "lease_provider_for",
    "renew_many",
]


def test_all_is_exactly_the_expected_surface() -> None:
    assert sorted(tenure.__all__) == sorted(EXPECTED)


def test_every_name_in_all_exists() -> None:
    for name in tenure.__all__:
        assert hasattr(tenure, name), name


def test_error_tree() -> None:
    for cls in (
        tenure.InvalidArgument,
        tenure.BackendUnavailable,
        tenure.BackendClosed,
        tenure.ConfigurationError,
        tenure.LeaseUnavailable,
        tenure.LeaseLost,
    ):
        assert issubclass(cls, tenure.TenureError)
    assert issubclass(tenure.InvalidArgument, ValueError)
    assert issubclass(tenure.TenureError, Exception)


def test_package_ships_type_information() -> None:
    from importlib.resources import files

    assert files("tenure").joinpath("py.typed").is_file()
