"""Shared fixtures: where the test servers are, and per-test isolated backend URLs.

Tests that need a server fail loudly when it is missing: they never skip.
The shared servers (Redis on 6379, PostgreSQL on 5432) are only used with a
prefix or schema of the test's own. Tests that kill, pause or restart a
server start their own (see ``tests/support``).
"""

from __future__ import annotations

import gc
import shutil
import sys
import tempfile
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.support.servers import (
    POSTGRES_URL,
    REDIS_URL,
    drop_postgres_schema,
    leftovers,
    require_tcp,
    unique_name,
)
from tests.support.targets import targets

__all__ = ["BACKENDS", "POSTGRES_URL", "REDIS_URL", "drop_postgres_schema", "isolated_url"]

TARGETS = targets()
BACKENDS = list(TARGETS)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The shared Redis server's URL (``TENURE_TEST_REDIS_URL``); fails if unreachable.

    Once the server grants a new prefix at once (a server just started, or
    just flushed, quarantines new prefixes for a while): tests that keep the
    quarantine on then pass or fail whatever the server's uptime.
    """
    from tests.redis.helpers import wait_out_quarantine

    url = require_tcp(REDIS_URL, "Redis")
    wait_out_quarantine(url)
    return url


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The shared PostgreSQL server's URL (``TENURE_TEST_POSTGRES_URL``); fails if unreachable."""
    return require_tcp(POSTGRES_URL, "PostgreSQL")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh directory with a short path (``/tmp/tw-XXXXXXXX``), removed after.

    For files whose path must stay short whatever pytest's own temporary tree
    is called: a Unix socket's path holds at most 107 bytes, and
    ``/tmp/pytest-of-root/pytest-NNN/<test name>/`` grows with the run counter.
    """
    path = Path(tempfile.mkdtemp(prefix="tw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def unique() -> str:
    """A short name no other test uses (for key prefixes, schemas, topics)."""
    return unique_name()


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "tenure.db"


def isolated_url(kind: str, *, unique: str, tmp_path: Path) -> str:
    """A URL of backend ``kind`` that shares no state with any other test (see its ``TARGET``)."""
    return TARGETS[kind].isolated_url(unique, tmp_path)


@pytest.fixture
def isolated_redis_url(redis_url: str, unique: str, tmp_path: Path) -> Iterator[str]:
    """A Redis URL that shares no state with any other test; its keys go afterwards."""
    target = TARGETS["redis"]
    yield target.isolated_url(unique, tmp_path)
    if target.cleanup is not None:
        target.cleanup(unique)


def _isolated(name: str, unique: str, tmp_path: Path) -> Iterator[str]:
    """An isolated URL of backend ``name``; its state goes afterwards."""
    target = TARGETS[name]
    yield target.isolated_url(unique, tmp_path)
    if target.cleanup is not None:
        target.cleanup(unique)


@pytest.fixture(params=[name for name in BACKENDS if name != "memory"])
def shared_url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    """One isolated URL per backend that processes can share (every one but memory://)."""
    yield from _isolated(request.param, unique, tmp_path)


@pytest.fixture(params=BACKENDS)
def backend_url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    """One isolated URL per backend; tests using it run once for each backend."""
    yield from _isolated(request.param, unique, tmp_path)


@pytest.fixture(params=[name for name in BACKENDS if name != "etcd"])
def signals_url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    """One isolated URL per backend that carries signals (every one but etcd://, lease-only)."""
    yield from _isolated(request.param, unique, tmp_path)


def _unclosed_now() -> list[str]:
    """What a full garbage collection finds unclosed (sockets, files, transports)."""
    found: list[str] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: found.append(f"{u.exc_value}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            gc.collect()
    finally:
        sys.unraisablehook = hook
    return found + [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """After a module's last test, fail it if the module left sockets or files unclosed.

    Without this an unclosed socket warns only when the garbage collector gets to
    it, in whichever later test is running then (in a random order, anywhere).
    Collecting here names the module that leaked it; the check costs one full
    collection per module.
    """
    yield
    if nextitem is not None and nextitem.path == item.path:
        return
    unclosed = _unclosed_now()
    if unclosed:
        shown = "; ".join(unclosed[:5]) + (
            f"; and {len(unclosed) - 5} more" if len(unclosed) > 5 else ""
        )
        pytest.fail(
            f"{item.path.name} left {len(unclosed)} object(s) unclosed: {shown}", pytrace=False
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if its tests left keys on the shared Redis or schemas on the
    shared PostgreSQL: every fixture must delete what it made there."""
    if session.config.option.collectonly or not session.testscollected:
        return
    left = leftovers()
    if left:
        shown = ", ".join(left[:20]) + (f" and {len(left) - 20} more" if len(left) > 20 else "")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"this run left {len(left)} names on the shared servers: {shown}"
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(message, red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
