"""The public surface changes only on purpose: update this list in the same commit."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import tenure

EXPECTED = [
    "AcquireResult",
    "RefusalReason",
    "Backend",
    "BackendClosed",
    "BackendUnavailable",
    "Capability",
    "ConfigurationError",
    "Debounce",
    "Event",
    "EventBackend",
    "HeldLease",
    "InvalidArgument",
    "LeaseFence",
    "Fenced",
    "LeaseLost",
    "OutputTruncated",
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
    "capabilities_of",
    "default_url",
    "events_of",
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


def test_import_loads_no_backend_and_no_driver() -> None:
    code = (
        "import sys, tenure\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('tenure.backends') "
        "or m in ('sqlite3', 'redis', 'psycopg'))\n"
        "print(','.join(loaded))\n"
        "tenure.MemoryPubSub\n"
        "print('tenure.backends.memory' in sys.modules, 'sqlite3' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["", "True False"]


def test_errors_show_as_tenure_names() -> None:
    assert repr(tenure.InvalidArgument("x")) == "InvalidArgument('x')"
    assert tenure.InvalidArgument.__module__ == "tenure"
    assert tenure.LeaseLost.__module__ == "tenure"


def test_the_package_logger_has_a_null_handler() -> None:
    handlers = logging.getLogger("tenure").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)


def test_mypy_catches_a_string_ttl_on_a_from_url_result(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import tenure\n\n\n"
        "async def main() -> None:\n"
        "    backend = tenure.from_url('memory://')\n"
        "    await backend.acquire_lease('k', 'o', '10')\n"
    )
    good = tmp_path / "good.py"
    good.write_text(
        "import tenure\n\n\n"
        "async def main() -> None:\n"
        "    async with tenure.from_url('memory://') as backend:\n"
        "        result = await backend.acquire_lease('k', 'o', 10)\n"
        "        record = await backend.get_lease('k')\n"
        "        assert result.acquired and record is not None\n"
    )
    for path, expect_ok in ((bad, False), (good, True)):
        proc = subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert (proc.returncode == 0) == expect_ok, proc.stdout
        if not expect_ok:
            assert 'incompatible type "str"; expected "int"' in proc.stdout, proc.stdout


def test_the_blocking_api_is_loaded_on_first_use_and_starts_no_thread_until_called() -> None:
    code = (
        "import sys, threading, tenure\n"
        "print('tenure.sync' in sys.modules)\n"
        "sync = tenure.sync\n"
        "print('tenure.sync' in sys.modules, threading.active_count())\n"
        "print(sorted(sync.__all__))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[:2] == ["False", "True 1"]
    assert out[2] == str(
        [
            "SyncBackend",
            "SyncCallInEventLoop",
            "SyncCallback",
            "SyncHeldLease",
            "SyncThreadRuntime",
            "acquire_wait",
            "current_lease",
            "from_url",
            "hold",
            "renew_many",
            "singleton",
        ]
    )
