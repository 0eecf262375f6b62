"""Cancelling a thread's run from the dashboard, in a real browser: the run is a
runtime worker's in a process of its own, blocked in its handler until stopped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from playwright.async_api import Browser, Page, expect

from tenure import ThreadRun, ThreadRuntime, from_url
from tenure.runtime import OutputItem

from .support import Client, Dashboard, Runner

pytestmark = pytest.mark.asyncio

THREAD = "chat-42"


async def _nothing(run: ThreadRun) -> None:
    async for _ in run.signals():
        pass


@asynccontextmanager
async def _elsewhere(url: str) -> AsyncIterator[ThreadRuntime]:
    """A runtime of another process on ``url``, running no thread of its own."""
    async with from_url(url) as backend:
        runtime = ThreadRuntime(backend, _nothing, output=True)
        try:
            yield runtime
        finally:
            await runtime.aclose()


async def _output_until_the_end_of(url: str, run_id: str) -> list[OutputItem]:
    """The thread's output items of run ``run_id``, once it has ended."""
    async with _elsewhere(url) as reader:
        found: list[OutputItem] = []
        async with asyncio.timeout(30):
            async for item in reader.follow(THREAD):
                if item.run_id == run_id:
                    found.append(item)
                    if item.kind == "run_ended":
                        return found
    raise AssertionError("unreachable")


@asynccontextmanager
async def _a_run_and_a_page(
    browser: Browser, live_url: str, payload: str
) -> AsyncIterator[tuple[Runner, str, int, Dashboard, Page]]:
    """A worker running ``THREAD`` on ``payload`` (the run's id and token), the
    dashboard, and a browser page, closed at the end."""
    with Runner(live_url, THREAD) as runner:
        assert await runner.line() == "ready"
        runner.send(payload)
        run_id, token = await runner.run()
        with Dashboard(live_url) as dashboard:
            page = await browser.new_page()
            yield runner, run_id, token, dashboard, page
            await page.close()


def _audit(base: str) -> list[dict[str, object]]:
    status, text = Client(base).get("/audit.jsonl")
    assert status == 200
    return [json.loads(line) for line in text.splitlines()]


async def test_cancel_from_the_threads_page_stops_the_run_the_operator_saw(
    browser: Browser, live_url: str
) -> None:
    scene = _a_run_and_a_page(browser, live_url, "hello")
    async with scene as (runner, run_id, token, dashboard, page):
        await page.goto(dashboard.base + "/threads")
        await page.locator(f'tr[data-thread="{THREAD}"] a').first.click()
        await expect(page.locator("dd.run")).to_have_text(run_id)
        await expect(page.locator("dd.token")).to_have_text(str(token))
        # The thread's newest output: its run has started.
        started = page.locator("table.output tr.kind-run_started")
        await expect(started).to_have_count(1)
        await page.locator("a.cancel").click()
        # The confirmation names the run, its holder and the token.
        await expect(page.locator("b.run")).to_have_text(run_id)
        await expect(page.locator("b.owner")).to_have_text(f"worker-1/{run_id}")
        await page.locator("#confirm button").click()
        await expect(page.locator("#done")).to_contain_text("Cancel sent")
        assert await runner.line() == f"ended {run_id} interrupted"
        # The page shows the end of the run in the thread's output, live.
        await expect(page.locator("table.output tr.kind-cancel td.data")).to_contain_text(
            "tenure-dashboard"
        )
        await expect(page.locator("table.output tr.kind-run_ended td.data")).to_contain_text(
            "interrupted"
        )
        # The run's output says who stopped it, and that it was interrupted.
        items = await _output_until_the_end_of(live_url, run_id)
        assert [(i.kind, i.data) for i in items][-2:] == [
            ("cancel", {"by": "tenure-dashboard"}),
            ("run_ended", {"end": "interrupted"}),
        ]
        (entry,) = _audit(dashboard.base)
        assert (entry["action"], entry["thread"], entry["run_id"], entry["token"]) == (
            "cancel",
            THREAD,
            run_id,
            token,
        )
        assert entry["owner"] == f"worker-1/{run_id}"
        assert entry["outcome"] == f"asked run {run_id} to stop"
        assert entry["who"] == "local" and str(entry["at"]).endswith("Z")
        await page.goto(dashboard.base + "/audit")
        await expect(page.locator("table.audit tbody tr").first).to_contain_text(run_id)


async def test_a_cancel_of_a_run_that_no_longer_holds_the_thread_changes_nothing(
    browser: Browser, live_url: str
) -> None:
    scene = _a_run_and_a_page(browser, live_url, "first")
    async with scene as (runner, first, first_token, dashboard, page):
        await page.goto(dashboard.base + f"/thread?t={THREAD}")
        await expect(page.locator("dd.run")).to_have_text(first)
        await page.locator("a.cancel").click()
        await expect(page.locator("b.run")).to_have_text(first)
        # While the operator reads the confirmation, that run ends and a newer one starts.
        async with _elsewhere(live_url) as elsewhere:
            assert await elsewhere.cancel(THREAD, run_id=first) == first
        assert await runner.line() == f"ended {first} interrupted"
        runner.send("second")
        second, _ = await runner.run()
        assert second != first
        await page.locator("#confirm button").click()
        await expect(page.locator("#done")).to_contain_text("Nothing cancelled")
        (entry,) = _audit(dashboard.base)
        assert (entry["run_id"], entry["token"]) == (first, first_token)
        assert str(entry["outcome"]).startswith("unchanged")
        # The newer run keeps running: nothing reaches it (a second to show it).
        with pytest.raises(TimeoutError):
            await runner.line(timeout=1.0)
        async with from_url(live_url) as backend:
            record = await backend.get_lease(f"tenure.thread:{THREAD}")
            assert record is not None and record.owner == f"worker-1/{second}"
        # A confirmation opened with the old run says so and offers no action.
        await page.goto(dashboard.base + f"/cancel?t={THREAD}&run={first}&token={first_token}")
        await expect(page.locator("p.warning")).to_contain_text("no longer holds the thread")
        assert await page.locator("#confirm").count() == 0
