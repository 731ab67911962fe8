"""A sign of life resets the backoff: a subscriber that failed a delivery and re-subscribes (a
verified renewal) gets its backlog at once, not when its long backoff would end; and an operator
can make one subscription's pending retry due now through the admin API."""
from __future__ import annotations

import time

from rsnotify.hub import keys

from .support import admin, notification, publish, subscribe, wait_until

TOPIC = "http://source.example.org/flaky"


def pending_retry(hub, sid: str) -> float:
    """Epoch s of the subscription's next attempt once a failed attempt scheduled one, else 0."""
    data = admin(hub.url, f"/admin/subscriptions/{sid}")
    return data["next_attempt"] if data["attempts"] else 0


def test_renewal_and_retry_now_make_a_pending_retry_due_at_once(hub_process, callbacks) -> None:
    # the first retry would come 60-120 s after a failure: far beyond every wait below
    hub = hub_process("--workers", "1", "--retry-base", "120", "--retry-cap", "600", "--log-level", "WARNING")
    sids = {}
    for path in ("/renewing", "/operated"):
        callbacks.answers[path] = lambda n: 503 if n == 1 else 200     # down for the first attempt only
        subscribe(hub.url, TOPIC, callbacks.url(path))
        sids[path] = keys.subscription_id(TOPIC, callbacks.url(path))
    wait_until(lambda: len(callbacks.verified) == 2, 30, "both verifications")
    wait_until(lambda: all(_exists(hub, sid) for sid in sids.values()), 30, "both subscriptions")
    publish(hub.url, TOPIC, notification(1))
    retry_at = {path: wait_until(lambda p=path: pending_retry(hub, sids[p]), 30, f"{path}'s failed attempt")
                for path in sids}
    assert min(retry_at.values()) > time.time() + 30

    subscribe(hub.url, TOPIC, callbacks.url("/renewing"))               # back after the outage: renews
    wait_until(lambda: callbacks.received("/renewing") == [1], 30, "the renewing subscriber's backlog")
    assert callbacks.times["/renewing"][0] < retry_at["/renewing"]

    answer = admin(hub.url, f"/admin/subscriptions/{sids['/operated']}/retry", method="POST")
    assert answer["sid"] == sids["/operated"]
    wait_until(lambda: callbacks.received("/operated") == [1], 30, "the delivery the operator asked for")
    assert callbacks.times["/operated"][0] < retry_at["/operated"]


def _exists(hub, sid: str) -> bool:
    from .support import http

    return http("GET", hub.url + f"admin/subscriptions/{sid}")[0] == 200
