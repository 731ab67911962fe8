"""Subscriber settings from RSNOTIFY_SUBSCRIBER_* variables, and the JSON file store shared by two
processes' worth of store objects."""
from __future__ import annotations

import pytest

from rsnotify.subscriber.errors import SettingsError
from rsnotify.subscriber.settings import SubscriberSettings, parse_listen
from rsnotify.subscriber.store import JsonFileStore, Subscription


def test_settings_come_from_the_environment_then_overrides():
    settings = SubscriberSettings.from_env(
        {"RSNOTIFY_SUBSCRIBER_LEASE_SECONDS": "3600", "RSNOTIFY_SUBSCRIBER_USE_SECRET": "false",
         "RSNOTIFY_SUBSCRIBER_MAX_BODY_BYTES": "1000", "RSNOTIFY_SUBSCRIBER_CALLBACK_URL": "https://d.example/cb"},
        max_body_bytes=2000, listen_port=None)
    assert settings.lease_seconds == 3600 and settings.use_secret is False
    assert settings.max_body_bytes == 2000 and settings.listen_port == 8081
    assert settings.callback_url == "https://d.example/cb"


@pytest.mark.parametrize("environ, message", [
    ({"RSNOTIFY_SUBSCRIBER_LEASE_SECONDS": "soon"}, "RSNOTIFY_SUBSCRIBER_LEASE_SECONDS must be a number, got 'soon'"),
    ({"RSNOTIFY_SUBSCRIBER_USE_SECRET": "maybe"}, "must be true or false, got 'maybe'"),
    ({"RSNOTIFY_SUBSCRIBER_LEASE_SECONDS": "-5"}, "lease_seconds must be a positive integer, got -5"),
])
def test_bad_settings_name_the_variable_and_value(environ, message):
    with pytest.raises(SettingsError, match=message):
        SubscriberSettings.from_env(environ)


def test_listen_address_forms():
    assert parse_listen("127.0.0.1:8081") == ("127.0.0.1", 8081)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("8081", "host:", "host:99999", ":80"):
        with pytest.raises(SettingsError, match="HOST:PORT"):
            parse_listen(bad)


async def test_two_stores_on_one_file_see_each_others_writes(tmp_path):
    path = tmp_path / "state.json"
    first, second = JsonFileStore(path), JsonFileStore(path)
    a = Subscription(id="a" * 43, topic="http://t.example/", hub="http://h.example/", callback="http://c/a")
    b = Subscription(id="b" * 43, topic="http://t.example/", hub="http://h.example/", callback="http://c/b")
    await first.put(a)
    await second.put(b)  # re-reads first, so a is kept
    assert {s.id for s in await first.all()} == {a.id, b.id}
    await first.put(a.evolve(status="active", last_sequence=3))
    assert (await second.get(a.id)).last_sequence == 3
    await second.delete(a.id)
    assert await first.get(a.id) is None
