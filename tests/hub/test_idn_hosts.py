"""Topics and callbacks with a non-ASCII (internationalized) host name are taken in their IDNA
(punycode) form, converted once where they come in; a host that is no valid IDN gets a 400 that
says why, and nothing is stored. Real app, Redis, a loopback callback and a burst of jobs."""
from __future__ import annotations

from rsnotify.hub import keys, store
from rsnotify.hub.web.appkeys import SETTINGS
from rsnotify.websub import build_link_header

from .test_intake_publish import NOTIFICATION

IDN_TOPIC = "http://bücher.example/änderungen/"
IDNA_TOPIC = "http://xn--bcher-kva.example/änderungen/"


async def subscribe(client, callback: str, topic: str = IDN_TOPIC):
    return await client.post("/", data={"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": callback})


async def test_an_idn_topic_and_callback_are_subscribed_in_their_idna_form(hub_client, intake_ctx, callback_server,
                                                                          run_jobs):
    # full-width digits are a non-ASCII spelling of 127.0.0.1 (UTS #46 maps them): the guards see the address
    callback = callback_server.url("/callback").replace("127.0.0.1", "１２７.０.０.１")
    response = await subscribe(hub_client, callback)
    assert response.status == 202, await response.text()
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "activated"
    [get] = callback_server.seen("/callback")
    assert get.query["hub.topic"] == IDNA_TOPIC
    plain_callback = callback_server.url("/callback")
    sub = await store.get_subscription(intake_ctx.redis, keys.subscription_id(IDNA_TOPIC, plain_callback))
    assert sub is not None and sub.topic == IDNA_TOPIC and sub.callback == plain_callback
    # the same subscription however the topic is spelt
    assert (await subscribe(hub_client, plain_callback, IDNA_TOPIC)).status == 202
    await run_jobs(intake_ctx)
    assert await store.count_subscriptions(intake_ctx.redis) == 1


async def test_a_publish_to_an_idn_topic_lands_in_the_topics_log(hub_client, intake_ctx):
    link = build_link_header([(IDN_TOPIC.replace("änderungen", "changes"), "self"),
                              (hub_client.server.app[SETTINGS].hub_url, "hub")])
    response = await hub_client.post("/", data=NOTIFICATION, headers={"Content-Type": "application/xml",
                                                                      "Link": link})
    assert response.status == 200, await response.text()
    topic = IDNA_TOPIC.replace("änderungen", "changes")
    assert (await response.json())["topic"] == topic
    assert len(await intake_ctx.redis.xrange(keys.topic_log_key(keys.topic_id(topic)))) == 1


async def test_a_malformed_idn_host_is_refused_with_its_reason(hub_client, intake_ctx, callback_server):
    for topic, reason in (("http://😀.example/changes/", "U+1F600"), ("http://bücher..example/", "Empty Label"),
                          ("http://-bücher.example/", "hyphen")):
        response = await subscribe(hub_client, callback_server.url("/callback"), topic)
        text = await response.text()
        assert response.status == 400 and "hub.topic has an invalid internationalized host name" in text, text
        assert reason in text
    response = await subscribe(hub_client, "http://bü cher.example/cb", "http://example.org/changes/")
    assert response.status == 400
    assert await store.count_subscriptions(intake_ctx.redis) == 0
    assert await intake_ctx.redis.llen(keys.verify_pending_key()) == 0
