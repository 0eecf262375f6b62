"""The dashboard in a real browser: Chromium driven by Playwright, the dashboard
served by uvicorn in a process of its own, leases held by other processes."""

from __future__ import annotations

import json

import pytest
from playwright.async_api import Browser, Page, expect

from tenure import from_url

from .support import Client, Dashboard, Holder, until

pytestmark = pytest.mark.asyncio


async def _ttl_seconds(page: Page, key: str) -> float:
    text = await page.locator(f'tr[data-key="{key}"] td.ttl').inner_text()
    return float(text.rstrip("s"))


async def test_a_lease_granted_elsewhere_appears_live_and_counts_down(
    browser: Browser, live_url: str
) -> None:
    with Dashboard(live_url) as dashboard:
        page = await browser.new_page()
        await page.goto(dashboard.base + "/leases")
        await expect(page.locator("p.summary")).to_contain_text("0 of 0 live leases")
        await expect(page.locator("#live-status")).to_have_text("live")
        await page.evaluate("window.notReloaded = true")
        with Holder(live_url, "jobs/report", "worker-a", ttl_ms=60_000) as holder:
            token = await holder.held()
            row = page.locator('tr[data-key="jobs/report"]')
            await expect(row).to_be_visible()
            await expect(row.locator("td.owner")).to_have_text("worker-a")
            await expect(row.locator("td.token")).to_have_text(str(token))
            assert await page.evaluate("window.notReloaded === true")
            # The countdown runs in the page, between the server's updates too.
            first = await _ttl_seconds(page, "jobs/report")

            async def lower() -> bool:
                return await _ttl_seconds(page, "jobs/report") < first

            await until(lower)
        await page.close()


async def test_revoke_with_the_token_seen_takes_the_lease_and_the_holder_sees_it(
    browser: Browser, live_url: str
) -> None:
    with (
        Dashboard(live_url) as dashboard,
        Holder(live_url, "jobs/nightly", "host-7:4242") as holder,
    ):
        token = await holder.held()
        page = await browser.new_page()
        await page.goto(dashboard.base + "/leases")
        await page.locator('tr[data-key="jobs/nightly"] a.revoke').click()
        # The confirmation names the holder and the token.
        await expect(page.locator("h1")).to_contain_text("jobs/nightly")
        await expect(page.locator("b.owner")).to_have_text("host-7:4242")
        await expect(page.locator("#confirm button")).to_contain_text("host-7:4242")
        await page.locator("#confirm button").click()
        await expect(page.locator("#done")).to_contain_text("Revoked")
        said = await holder.line()
        assert said.startswith("lost ") and "refused" in said, said
        async with from_url(live_url) as backend:
            assert await backend.get_lease("jobs/nightly") is None
        await expect(page.locator("#no-holder")).to_be_visible()
        await expect(page.locator("tr.event-revoked")).to_contain_text(f"token {token}")
        # The audit log has it, in the UI and as JSON Lines.
        await page.goto(dashboard.base + "/audit")
        await expect(page.locator("table.audit tbody tr").first).to_contain_text("jobs/nightly")
        status, text = Client(dashboard.base).get("/audit.jsonl")
        entries = [json.loads(line) for line in text.splitlines()]
        assert status == 200
        assert [(e["action"], e["key"], e["token"], e["owner"], e["outcome"]) for e in entries] == [
            ("revoke", "jobs/nightly", token, "host-7:4242", "revoked")
        ]
        assert entries[0]["who"] == "local" and entries[0]["at"].endswith("Z")
        await page.close()


async def test_revoke_with_a_stale_token_changes_nothing(browser: Browser, live_url: str) -> None:
    async with from_url(live_url) as backend:
        first = await backend.acquire_lease("jobs/stale", "old-owner", 60_000)
        with Dashboard(live_url) as dashboard:
            page = await browser.new_page()
            await page.goto(dashboard.base + "/leases")
            await page.locator('tr[data-key="jobs/stale"] a.revoke').click()
            await expect(page.locator("b.owner")).to_have_text("old-owner")
            # While the operator reads the confirmation, the lease changes hands.
            assert await backend.revoke_lease("jobs/stale", first.token)
            second = await backend.acquire_lease("jobs/stale", "new-owner", 60_000)
            assert second.acquired and second.token != first.token
            await page.locator("#confirm button").click()
            await expect(page.locator("#done")).to_contain_text("Nothing revoked")
            record = await backend.get_lease("jobs/stale")
            assert record is not None
            assert (record.owner, record.token) == ("new-owner", second.token)
            _, text = Client(dashboard.base).get("/audit.jsonl")
            (entry,) = [json.loads(line) for line in text.splitlines()]
            assert entry["token"] == first.token and entry["outcome"].startswith("unchanged")
            # A confirmation opened with the old token says so and offers no action.
            await page.goto(dashboard.base + f"/revoke?k=jobs/stale&token={first.token}")
            await expect(page.locator("p.warning")).to_contain_text("changed since you saw it")
            assert await page.locator("#confirm").count() == 0
            await page.close()


async def test_a_filter_survives_a_reload_and_pages(browser: Browser, sqlite_url: str) -> None:
    async with from_url(sqlite_url) as backend:
        for i in range(60):
            await backend.acquire_lease(f"a/{i:03d}", "alpha", 60_000)
        for i in range(5):
            await backend.acquire_lease(f"b/{i}", "beta", 60_000)
        with Dashboard(sqlite_url) as dashboard:
            page = await browser.new_page()
            await page.goto(dashboard.base + "/leases")
            await page.fill('input[name="prefix"]', "a/")
            await page.fill('input[name="owner"]', "alp")
            await page.click("#filters button")
            await expect(page.locator("p.summary")).to_contain_text("60 of 65")
            await page.reload()
            assert "prefix=a%2F" in page.url and "owner=alp" in page.url
            await expect(page.locator('input[name="prefix"]')).to_have_value("a/")
            await expect(page.locator('input[name="owner"]')).to_have_value("alp")
            await expect(page.locator("p.summary")).to_contain_text("60 of 65")
            await expect(page.locator("table.leases tbody tr")).to_have_count(50)
            await page.click('a[rel="next"]')
            await expect(page.locator("table.leases tbody tr")).to_have_count(10)
            await expect(page.locator('input[name="prefix"]')).to_have_value("a/")
            await expect(page.locator("tbody tr").first).to_have_attribute("data-key", "a/050")
            await page.close()


async def test_bulk_revoke_lists_exactly_what_it_revokes_and_keeps_the_filter(
    browser: Browser, sqlite_url: str
) -> None:
    async with from_url(sqlite_url) as backend:
        tokens = {}
        for key, owner in [("q/1", "w1"), ("q/2", "w2"), ("r/1", "w1")]:
            tokens[key] = (await backend.acquire_lease(key, owner, 60_000)).token
        with Dashboard(sqlite_url) as dashboard:
            page = await browser.new_page()
            await page.goto(dashboard.base + "/leases?prefix=q%2F")
            await page.click("#bulk-link")
            await expect(page.locator("#dry-run-count")).to_contain_text("These 2 leases")
            listed = await page.locator("table.leases tbody tr").evaluate_all(
                "rows => rows.map(r => r.dataset.key)"
            )
            assert listed == ["q/1", "q/2"]
            # Nothing happens in a dry run.
            assert await backend.get_lease("q/1") is not None
            await page.click("#bulk-confirm button")
            await expect(page.locator("#bulk-summary")).to_contain_text("2 revoked, 0 unchanged")
            assert await backend.get_lease("q/1") is None
            assert await backend.get_lease("q/2") is None
            assert await backend.get_lease("r/1") is not None
            _, text = Client(dashboard.base).get("/audit.jsonl")
            entries = [json.loads(line) for line in text.splitlines()]
            assert {(e["key"], e["token"]) for e in entries} == {
                ("q/1", tokens["q/1"]),
                ("q/2", tokens["q/2"]),
            }
            assert all(e["filter"] == {"prefix": "q/"} for e in entries)
            await page.click("text=Back to the leases")
            await expect(page.locator('input[name="prefix"]')).to_have_value("q/")
            await page.close()


async def test_read_only_shows_no_action(browser: Browser, sqlite_url: str) -> None:
    async with from_url(sqlite_url) as backend:
        await backend.acquire_lease("k/1", "w", 60_000)
        with Dashboard(sqlite_url, "--read-only") as dashboard:
            page = await browser.new_page()
            await page.goto(dashboard.base + "/leases")
            await expect(page.locator('tr[data-key="k/1"]')).to_be_visible()
            await expect(page.locator("#read-only")).to_be_visible()
            assert await page.locator("a.revoke, #bulk-link, form[method=post]").count() == 0
            await page.goto(dashboard.base + "/key?k=k/1")
            await expect(page.locator("dd.owner")).to_have_text("w")
            assert await page.locator("a.revoke").count() == 0
            await page.close()


async def test_basic_authentication_in_the_browser(browser: Browser, sqlite_url: str) -> None:
    with Dashboard(sqlite_url, auth="ops:correct-horse-battery") as dashboard:
        context = await browser.new_context(
            http_credentials={"username": "ops", "password": "correct-horse-battery"}
        )
        page = await context.new_page()
        await page.goto(dashboard.base + "/leases")
        await expect(page.locator("header .who")).to_have_text("ops")
        await expect(page.locator("#live-status")).to_have_text("live")
        await context.close()
        status, _ = Client(dashboard.base).get("/leases")
        assert status == 401
