"""Subscriber diagnostics: a subscriber that proves it holds the callback (a signature made with
its secret, or the token of a link the hub sends to the callback) reads its own status."""
from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from rsnotify.hub.web import diagnostics
from rsnotify.websub import SIGNATURE_HEADER, sign

from .conftest import TOPIC, body


async def read(hub, sid: str, *, headers=None, query: str = "", expect: int = 200):
    async with hub.http.get(f"{hub.url}diagnostics/{sid}{query}", headers=headers or {}) as response:
        text = await response.text()
        assert response.status == expect, text
        return await response.json() if expect == 200 else text


def signed(sid: str, secret: str, timestamp: float) -> dict[str, str]:
    ts = str(int(timestamp))
    return {diagnostics.TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: sign(diagnostics.signing_text(sid, ts), secret)}


async def test_signed_request_reads_own_status(ops_hub, subscriber, ops_clock) -> None:
    subscriber.on("/cb", 500)
    sid = await ops_hub.subscribe(subscriber.url("/cb"), **{"hub.secret": "s3cret-value"})
    await ops_hub.publish(body(1))
    await ops_hub.drain()
    status = await read(ops_hub, sid, headers=signed(sid, "s3cret-value", ops_clock()))
    assert status["callback"] == subscriber.url("/cb") and status["topic"] == TOPIC
    assert status["last_status"] == "500" and status["dead_letters"] == 1
    assert status["attempts_recent"][0]["outcome"] == "dead"
    assert "s3cret-value" not in repr(status)


async def test_bad_or_stale_signatures_are_refused(ops_hub, subscriber, ops_clock) -> None:
    sid = await ops_hub.subscribe(subscriber.url("/cb"), **{"hub.secret": "right"})
    assert "not a valid signature" in await read(ops_hub, sid, headers=signed(sid, "wrong", ops_clock()), expect=401)
    stale = signed(sid, "right", ops_clock() - 3600)
    assert "within 300 s" in await read(ops_hub, sid, headers=stale, expect=401)
    assert "prove you hold the callback" in await read(ops_hub, sid, expect=401)
    assert "32 lower-case hex" in await read(ops_hub, "zz", expect=400)


async def test_link_sent_to_the_callback_opens_its_status(ops_hub, subscriber) -> None:
    callback = subscriber.url("/plain")
    sid = await ops_hub.subscribe(callback)
    form = {"hub.topic": TOPIC, "hub.callback": callback}
    async with ops_hub.http.post(ops_hub.url + "diagnostics", data=form) as response:
        assert response.status == 202
    await ops_hub.eventually(lambda: any(r.query.get("hub.mode") == "diagnostics" for r in subscriber.verifications()))
    [(path, query)] = [(r.path, r.query) for r in subscriber.verifications() if r.query.get("hub.mode") == "diagnostics"]
    assert path == "/plain" and query["hub.topic"] == TOPIC
    link = urlsplit(query["hub.diagnostics"])
    assert link.path == f"/diagnostics/{sid}"
    token = parse_qs(link.query)["token"][0]
    status = await read(ops_hub, sid, query=f"?token={token}")
    assert status["sid"] == sid and status["backlog"] == 0
    assert (await read(ops_hub, sid, headers={"Authorization": f"Bearer {token}"}))["sid"] == sid
    # a second request within a minute sends nothing more; a token opens only its own subscription
    async with ops_hub.http.post(ops_hub.url + "diagnostics", data=form) as response:
        assert response.status == 202
    other = await ops_hub.subscribe(subscriber.url("/other"))
    assert "not valid" in await read(ops_hub, other, query=f"?token={token}", expect=401)
    assert sum(1 for r in subscriber.verifications() if r.query.get("hub.mode") == "diagnostics") == 1


async def test_link_request_says_nothing_about_unknown_subscriptions(ops_hub, subscriber) -> None:
    form = {"hub.topic": TOPIC, "hub.callback": subscriber.url("/nobody")}
    async with ops_hub.http.post(ops_hub.url + "diagnostics", data=form) as response:
        assert response.status == 202
    async with ops_hub.http.post(ops_hub.url + "diagnostics", data={"hub.topic": "ftp://x"}) as response:
        assert response.status == 400
        text = await response.text()
        assert "hub.topic must be an absolute http" in text and "hub.callback is required" in text
    assert subscriber.verifications() == []
