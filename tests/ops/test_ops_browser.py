"""The status page in a real browser (Debian's chromium, driven by Playwright; never Playwright's
own browser): `rsnotify hub` started as a new user would, real traffic with one healthy and one
failing subscriber, then the numbers on the page are checked against the admin API, the failing
subscriber shows up in trouble with its last status, and a screenshot is kept in test-artifacts/."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.support.http import get_json, http, post_form
from tests.support.hubproc import start_hub
from tests.support.subscribers import RecordingSubscriber
from tests.support.waiting import wait_until

from .conftest import TOPIC, body

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

# how many pixels of the chart canvas are the "delivered" green
GREEN_PIXELS = """(id) => {
  const canvas = document.getElementById(id);
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let n = 0;
  for (let i = 0; i < data.length; i += 4) if (data[i] === 6 && data[i + 1] === 118 && data[i + 2] === 71) n++;
  return n;
}"""

# where the delivered bars are: the leftmost green column as a fraction of the canvas width
GREEN_LEFTMOST = """(id) => {
  const canvas = document.getElementById(id);
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let left = canvas.width;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i] === 6 && data[i + 1] === 118 && data[i + 2] === 71) left = Math.min(left, (i / 4) % canvas.width);
  }
  return left / canvas.width;
}"""
# nothing wider than the window: no sideways scrolling of the page itself
FITS = "() => document.documentElement.scrollWidth <= window.innerWidth"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} is absent: install Debian's chromium package "
                                       "(apt-get install -y chromium) to run the browser test")


def test_status_page_shows_what_happened(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (a test extra)")
    subscribers = RecordingSubscriber(default_status=204)     # /good answers 204, /bad 500
    subscribers.on("/bad", 500)
    server = subscribers.serve_in_thread()
    hub = None
    try:
        env = {"RSNOTIFY_MAX_ATTEMPTS": "2", "RSNOTIFY_RETRY_BASE": "0.05", "RSNOTIFY_RETRY_CAP": "0.1"}
        hub = start_hub(tmp_path, data_dir=tmp_path / "data", workers=1, env=env)
        url = hub.url

        for path in ("/good", "/bad"):
            form = {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": f"{subscribers.base}{path}"}
            assert post_form(url, form)[0] == 202

        def overview() -> dict:
            status, answer = get_json(url + "admin/overview")
            assert status == 200, answer
            return answer
        wait_until(lambda: overview()["subscriptions"] == 2, 30, "both subscriptions to be verified")
        link = f'<{TOPIC}>; rel="self", <{url}>; rel="hub"'
        for n in range(5):
            assert http("POST", url, body(n), {"Content-Type": "application/xml", "Link": link})[0] == 200
        def settled() -> bool:      # deliveries ended, and the web process's 2-second scan cache caught up
            o = overview()
            return (o["deliveries"].get("dead") == 5 and o["deliveries"].get("delivered") == 5
                    and o["subscriptions_by_state"]["active"] == 2 and o["trouble_count"] == 1)
        wait_until(settled, 60, "every delivery to end (5 delivered, 5 dead letters)")
        expected = overview()

        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url)
            page.wait_for_selector("#m-delivered")
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
            # the chart is drawn from the hub's per-minute history at once, not from this tab's polls
            rows = get_json(url + "admin/history")[1]["history"]
            assert sum(row["delivered"] for row in rows) == 5
            assert sum(row["failed"] for row in rows) == 10      # 2 attempts x 5, all failed
            assert page.evaluate(GREEN_PIXELS, "history") > 0
            # a young hub: the chart opens zoomed to its data, not with it in the axis's last 2 %
            assert "the data's span" in page.inner_text("#main h2")
            assert page.evaluate(GREEN_LEFTMOST, "history") < 0.75     # at least the last third of 3+ minutes
            page.click("#span-choice button[data-span='360']")
            page.wait_for_function("() => document.querySelector('#main h2').textContent.includes('last 6 hours')")
            assert page.evaluate(GREEN_LEFTMOST, "history") > 0.9
            page.click("#span-choice button[data-span='data']")
            page.wait_for_function("() => document.querySelector('#main h2').textContent.includes(\"the data's span\")")
            trouble = page.inner_text("#trouble")
            assert f"{subscribers.base}/bad" in trouble and TOPIC in trouble
            assert "5 dead letters · last HTTP 500" in trouble and trouble.count("HTTP 500") == 1
            assert TOPIC in page.inner_text("#busiest")
            [worker] = expected["workers"]
            workers = page.inner_text("#workers")
            assert worker["name"] in workers and worker["host"] in workers and "UTC" in workers
            assert worker["claims"] is not None and "delivery slots" in workers
            assert page.inner_text("#updated").endswith(" UTC")
            assert "looked at" not in page.inner_text("#main")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "status-page.png"), full_page=True)
            page.screenshot(path=str(ARTIFACTS / "status-page-1280.png"), full_page=True)
            phone = browser.new_page(viewport={"width": 390, "height": 844})
            phone.on("pageerror", lambda exc: errors.append(str(exc)))
            phone.goto(url)
            phone.wait_for_selector("#m-delivered")
            assert phone.evaluate(FITS), "the status page scrolls sideways at 390 px"
            phone.screenshot(path=str(ARTIFACTS / "status-page-390.png"), full_page=True)

            page.fill("#search-input", "/bad")                  # search by callback
            page.press("#search-input", "Enter")
            page.wait_for_selector("#search-subscriptions")
            found = page.inner_text("#search-results")
            assert f"{subscribers.base}/bad" in found and f"{subscribers.base}/good" not in found
            page.fill("#search-input", "source.example")        # search by topic
            page.press("#search-input", "Enter")
            page.wait_for_selector("#search-topics a[href^='/topics/']")
            assert TOPIC in page.inner_text("#search-topics")
            assert "2 subscription(s)" in page.inner_text("#search-results h2")
            page.screenshot(path=str(ARTIFACTS / "status-search.png"), full_page=True)
            page.click("#search-clear")

            page.click("#busiest a[href^='/topics/']")
            page.wait_for_selector("#recent a[data-body]")
            recent = page.inner_text("#recent")     # each notification: its change count, from and until
            assert recent.count("2013-01-03T00:00:00Z") == 5 and recent.count("2013-01-03T00:10:00Z") == 5, recent
            assert [c.strip() for c in page.eval_on_selector_all(
                "#recent tbody tr td:nth-child(4)", "cells => cells.map((c) => c.textContent)")] == ["1"] * 5
            page.click("#recent a[data-body]")
            page.wait_for_selector("#body-view:not([hidden])")
            assert "<urlset" in page.inner_text("#body-view pre") and "rs:md" in page.inner_text("#body-view pre")
            page.screenshot(path=str(ARTIFACTS / "topic-page-body.png"), full_page=True)

            page.goto(url)
            page.wait_for_selector("#trouble a[href^='/subscriptions/']")
            page.click("#trouble a[href^='/subscriptions/']")
            page.wait_for_selector("#dead-letters")
            assert page.inner_text("#s-state") == "active"
            assert len(page.query_selector_all("#dead-letters button[data-resend]")) == 5
            assert len(page.query_selector_all("#dead-letters a[data-body]")) == 5
            main_text = page.inner_text("#main")
            assert "HTTP 500" in main_text and "cursor" not in main_text.lower(), main_text
            last_attempt = page.inner_text(".kv tr:has(th:text('last attempt')) td")
            assert last_attempt.count("HTTP 500") == 1, last_attempt       # one short text, said once
            for row in page.eval_on_selector_all("#attempts tbody tr", "rows => rows.map((r) => r.textContent)"):
                assert row.count("HTTP 500") == 1, row
            assert not re.search(r"(?<![\d-])0-0\b", main_text), main_text     # no internal cursor value
            page.screenshot(path=str(ARTIFACTS / "subscription-page.png"), full_page=True)

            # a second web process on the same Redis, with an admin token: visitors get the landing text
            # (it calls a callback dormant after 1 s of refusals: /bad has refused everything since it began)
            guarded = start_hub(tmp_path, redis_url=f"unix://{tmp_path / 'data' / 'redis.sock'}", workers=0,
                                data_dir=tmp_path / "data",
                                env={"RSNOTIFY_ADMIN_TOKEN": "op-token-123", "RSNOTIFY_DORMANT_AFTER": "1"})
            try:
                page.goto(guarded.url)
                page.wait_for_selector("#landing")
                landing = page.inner_text("#landing")
                assert "WebSub hub for ResourceSync change notifications" in landing
                assert f"POST {guarded.url}diagnostics" in landing and "hub.callback" in landing
                assert page.is_hidden("#search-form") and "op-token-123" not in page.content()
                page.screenshot(path=str(ARTIFACTS / "status-landing.png"), full_page=True)
                page.fill("#token-input", "op-token-123")
                page.click("#token-form button")
                page.wait_for_selector("#m-delivered")
                assert int(page.get_attribute("#m-delivered", "data-value")) == 5
                # /bad is dormant there, apart from live trouble, and is ended from the page
                page.wait_for_selector("#dormant button[data-end]")
                assert int(page.get_attribute("#m-dormant", "data-value")) == 1
                assert int(page.get_attribute("#m-trouble", "data-value")) == 0
                dormant = page.inner_text("#dormant")
                assert f"{subscribers.base}/bad" in dormant and "HTTP 500" in dormant
                assert f"{subscribers.base}/bad" not in page.inner_text("#trouble")
                page.screenshot(path=str(ARTIFACTS / "status-dormant-1280.png"), full_page=True)
                page.once("dialog", lambda dialog: dialog.accept())
                page.click("#dormant button[data-end]")
                wait_until(lambda: get_json(url + "admin/overview")[1]["subscriptions"] == 1, 30,
                           "the dormant subscription to be ended")
                page.wait_for_function("() => document.getElementById('m-dormant')?.dataset.value === '0'")
            finally:
                guarded.stop()
            assert errors == []
            browser.close()
    finally:
        if hub is not None:
            hub.stop()
        server.stop()
    if (tmp_path / "data").exists():
        shutil.rmtree(tmp_path / "data", ignore_errors=True)
