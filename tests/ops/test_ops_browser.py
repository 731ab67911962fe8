"""The status page in a real browser (Debian's chromium, driven by Playwright; never Playwright's
own browser): `rsnotify hub` started as a new user would, real traffic with one healthy and one
failing subscriber, then the numbers on the page are checked against the admin API, the failing
subscriber shows up in trouble with its last status, and a screenshot is kept in test-artifacts/."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .conftest import TOPIC, body
from .test_ops_scaleout import (
    GatedSubscriber,
    Processes,
    http,
    listening_port,
    wait_for,
)

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} is absent: install Debian's chromium package "
                                       "(apt-get install -y chromium) to run the browser test")


class Subscribers(GatedSubscriber):
    """Loopback subscribers: /good answers 204, /bad answers 500; never holds an answer."""

    async def handle(self, request):
        from aiohttp import web
        if request.method == "GET":
            return web.Response(text=request.query.get("hub.challenge", ""))
        await request.read()
        with self.lock:
            self.sequences.append(request.path)
        return web.Response(status=204 if request.path == "/good" else 500)


def test_status_page_shows_what_happened(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (a test extra)")
    subscribers = Subscribers()
    subscribers.start()
    processes = Processes()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RSNOTIFY_")}
        env.update(RSNOTIFY_MAX_ATTEMPTS="2", RSNOTIFY_RETRY_BASE="0.05", RSNOTIFY_RETRY_CAP="0.1")
        log = tmp_path / "hub.log"
        hub = processes.start(["hub", "--port", "0", "--workers", "1", "--data-dir", str(tmp_path / "data")],
                              env, log)
        url = f"http://127.0.0.1:{listening_port(log, hub)}/"
        wait_for(lambda: http("GET", url + "health")[0] == 200, 60, "the embedded hub and its worker")

        form = "application/x-www-form-urlencoded"
        for path in ("/good", "/bad"):
            data = f"hub.mode=subscribe&hub.topic={TOPIC}&hub.callback={subscribers.base}{path}".encode()
            assert http("POST", url, data, {"Content-Type": form})[0] == 202

        def overview() -> dict:
            status, answer = http("GET", url + "admin/overview")
            assert status == 200, answer
            return json.loads(answer)
        wait_for(lambda: overview()["subscriptions"] == 2, 30, "both subscriptions to be verified")
        link = f'<{TOPIC}>; rel="self", <{url}>; rel="hub"'
        for n in range(5):
            assert http("POST", url, body(n), {"Content-Type": "application/xml", "Link": link})[0] == 200
        def settled() -> bool:      # deliveries ended, and the web process's 2-second scan cache caught up
            o = overview()
            return (o["deliveries"].get("dead") == 5 and o["deliveries"].get("delivered") == 5
                    and o["subscriptions_by_state"]["active"] == 2 and o["trouble_count"] == 1)
        wait_for(settled, 60, "every delivery to end (5 delivered, 5 dead letters)")
        expected = overview()

        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url)
            page.wait_for_selector("#m-delivered")
            page.wait_for_timeout(2500)       # a second poll, so the live chart has a point
            shown = {key: int(page.get_attribute(f"#m-{key}", "data-value")) for key in
                     ("topics", "subscriptions", "published", "published-hour", "delivered", "retry", "dead",
                      "trouble", "backlog")}
            assert shown == {
                "topics": expected["topics"], "subscriptions": expected["subscriptions_by_state"]["active"],
                "published": expected["published"], "published-hour": expected["published_last_hour"],
                "delivered": expected["deliveries"]["delivered"], "retry": expected["deliveries"]["retry"],
                "dead": expected["deliveries"]["dead"], "trouble": expected["trouble_count"],
                "backlog": expected["backlog"]}
            assert shown["published"] == 5 and shown["delivered"] == 5 and shown["dead"] == 5 and shown["trouble"] == 1
            trouble = page.inner_text("#trouble")
            assert f"{subscribers.base}/bad" in trouble and "HTTP 500" in trouble and "5 dead letter(s)" in trouble
            assert TOPIC in page.inner_text("#busiest")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "status-page.png"), full_page=True)

            page.click("#trouble a[href^='/subscriptions/']")
            page.wait_for_selector("#dead-letters")
            assert page.inner_text("#s-state") == "active"
            assert len(page.query_selector_all("#dead-letters button[data-resend]")) == 5
            assert "HTTP 500" in page.inner_text("#main")
            page.screenshot(path=str(ARTIFACTS / "subscription-page.png"), full_page=True)
            assert errors == []
            browser.close()
    finally:
        processes.stop_all()
        subscribers.stop()
    if (tmp_path / "data").exists():
        shutil.rmtree(tmp_path / "data", ignore_errors=True)
