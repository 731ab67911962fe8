"""Every refusal the callback sends a hub (or a stranger) names what was wrong in words: a
missing field is "no ... field" or "nothing", never Python's `None`."""
from __future__ import annotations

TOPIC = "http://example.com/dataset1/change/"


async def test_a_get_without_hub_mode_is_400_naming_the_missing_field(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    verification = await fake_hub.verify(subscription.callback, {})
    assert verification.status == 400
    assert "no hub.mode field" in verification.body
    assert "None" not in verification.body
    assert (await subscriber.store.get(subscription.id)).status == "active"


async def test_a_diagnostics_link_without_a_url_is_400_naming_the_missing_value(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    verification = await fake_hub.verify(subscription.callback, {"hub.mode": "diagnostics", "hub.topic": TOPIC})
    assert verification.status == 400
    assert "hub.diagnostics must be an http(s) URL, got nothing" in verification.body
    assert "None" not in verification.body


async def test_a_lease_of_thousands_of_digits_is_400_not_500(fake_hub, make_subscriber):
    # int() refuses more than 4,300 digits with a ValueError: it used to escape as a 500
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    verification = await fake_hub.verify(subscription.callback, {
        "hub.mode": "subscribe", "hub.topic": TOPIC, "hub.challenge": "abc", "hub.lease_seconds": "9" * 5000})
    assert verification.status == 400, verification.body
    assert "hub.lease_seconds must be a positive integer" in verification.body
    assert len(verification.body) < 300
    assert (await subscriber.store.get(subscription.id)).lease_seconds == subscription.lease_seconds
    clamped = await fake_hub.verify(subscription.callback, {
        "hub.mode": "subscribe", "hub.topic": TOPIC, "hub.challenge": "big", "hub.lease_seconds": "9" * 30})
    assert (clamped.status, clamped.body) == (200, "big")   # large but sane: clamped, as before


async def test_a_sequence_of_thousands_of_digits_is_ignored_like_any_malformed_one(fake_hub, make_subscriber):
    from .conftest import make_notification
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url, secret=False)
    assert fake_hub.session is not None
    async with fake_hub.session.post(subscription.callback, data=make_notification(), headers={
            "Content-Type": "application/xml", "X-RSNotify-Sequence": "9" * 5000}) as response:
        assert response.status < 300, await response.text()
