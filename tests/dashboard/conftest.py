"""Fixtures of the dashboard's tests: a real Chromium (Debian's, driven by
Playwright) and isolated backend URLs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, async_playwright, expect

from tests.conftest import TARGETS

#: Debian's package ``chromium`` (scripts/setup); Playwright's own download is not used.
CHROMIUM = "/usr/bin/chromium"

# Conditions are waited for, never timed: the default 5 s is short on a loaded machine.
expect.set_options(timeout=30_000)


@pytest.fixture(scope="session")
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup (Debian package chromium)")
    return CHROMIUM


@pytest_asyncio.fixture
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture(params=["sqlite", "redis"])
def live_url(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[str]:
    """A SQLite file, then the shared Redis under a prefix of the test's own."""
    target = TARGETS[request.param]
    yield target.isolated_url(unique, tmp_path)
    if target.cleanup is not None:
        target.cleanup(unique)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tenure.db'}"
