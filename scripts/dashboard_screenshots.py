"""Regenerate the dashboard's screenshots in docs/ (docs/dashboard-*.png).

Usage: ``.venv/bin/python scripts/dashboard_screenshots.py``

Builds a small scene on a fresh SQLite file (leases held and renewed, one
that stopped renewing, a runtime namespace's threads, a revoke, a bulk dry
run and a run's cancel), serves ``tenure dashboard --telemetry`` on it and photographs each page with
Debian's Chromium driven by Playwright.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from playwright.async_api import async_playwright

from tenure import HeldLease, from_url, hold
from tenure.runtime._names import ThreadNames

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CHROMIUM = "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve(url: str, port: int) -> subprocess.Popen[bytes]:
    """``tenure dashboard`` on ``url``, once it accepts connections."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tenure",
            "dashboard",
            "--url",
            url,
            "--port",
            str(port),
            "--telemetry",
        ],
        cwd=ROOT,
    )
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)


async def scene(backend: Any) -> list[HeldLease]:
    """Leases held and renewed by this process (kept until the pictures are taken)."""
    held: list[HeldLease] = []
    for i, worker in enumerate(["billing-7f9c:4121", "billing-7f9c:4122", "etl-02:881"]):
        jobs = ("invoices", "reminders", "exports")[: 3 - i % 2]
        held += [await hold(backend, f"jobs/{job}-{i}", worker, 15_000).start() for job in jobs]
    held.append(await hold(backend, "cron/nightly-report", "cron-01:77", 30_000).start())
    held.append(await hold(backend, "leader/scheduler", "sched-a:310", 10_000).start())
    names = ThreadNames("support.agents")
    for n, owner in enumerate(["agents-1:900/s1.1", "agents-2:901/s4.3", "agents-1:900/s2.1"]):
        await backend.acquire_lease(names.name(f"ticket-{4810 + n}"), owner, 20_000)
    return held


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/tenure.db"
        backend = from_url(url)
        held = await scene(backend)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = await asyncio.to_thread(serve, url, port)
        try:
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=CHROMIUM)
                page = await browser.new_page(viewport={"width": 1200, "height": 640})
                await page.goto(base + "/leases")
                await page.wait_for_selector("#live-status:text('live')")
                # One that stops renewing: the dashboard marks it stalled (a third of its
                # TTL left without a renewal), then expiring.
                await backend.acquire_lease("jobs/reindex", "search-03:5150", 12_000)
                await page.wait_for_selector("tr.state-stalled", timeout=20_000)
                await page.screenshot(path=DOCS / "dashboard-leases.png")
                # A revoke, so that a key's history and the audit log have something.
                await page.locator('tr[data-key="jobs/exports-0"] a.revoke').click()
                await page.screenshot(path=DOCS / "dashboard-revoke.png")
                await page.locator("#confirm button").click()
                await page.wait_for_selector("tr.event-revoked")
                await page.screenshot(path=DOCS / "dashboard-key.png")
                await page.goto(base + "/bulk?prefix=jobs%2F&owner=billing")
                await page.screenshot(path=DOCS / "dashboard-bulk.png")
                # A thread changes hands, with a moment without an owner between.
                thread = ThreadNames("support.agents").name("ticket-4812")
                record = await backend.get_lease(thread)
                assert record is not None
                await backend.revoke_lease(thread, record.token)
                await asyncio.sleep(1.5)
                await backend.acquire_lease(thread, "agents-3:902/s1.1", 20_000)
                await page.goto(base + "/threads?ns=support.agents")
                await page.wait_for_selector("td.handover:has-text('without owner')")
                await page.screenshot(path=DOCS / "dashboard-threads.png")
                # A thread's page, and the cancel of its run (audited).
                await page.goto(base + "/thread?ns=support.agents&t=ticket-4810")
                await page.wait_for_selector("a.cancel")
                await page.screenshot(path=DOCS / "dashboard-thread.png")
                await page.locator("a.cancel").click()
                await page.screenshot(path=DOCS / "dashboard-cancel.png")
                await page.locator("#confirm button").click()
                await page.wait_for_selector("#done")
                await page.goto(base + "/health")
                await page.screenshot(path=DOCS / "dashboard-health.png", full_page=True)
                await page.goto(base + "/audit")
                await page.screenshot(path=DOCS / "dashboard-audit.png")
                await browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            for lease in held:
                await lease.release()
            await backend.aclose()
    print("\n".join(str(p.relative_to(ROOT)) for p in sorted(DOCS.glob("dashboard-*.png"))))


if __name__ == "__main__":
    asyncio.run(main())
