"""The mirror against a loopback Source: fetch and check created/updated resources, delete
deleted ones, keep the old copy on a mismatch, never write outside its folder."""
from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from aiohttp import web

from rsnotify.notification import ChangeNotification, ChangeType, ResourceChange
from rsnotify.subscriber.mirror import Mirror
from rsnotify.xml import to_xml

from .conftest import T0, Recorder

CONTENT = {"/a.txt": b"alpha\n", "/dir/b.txt": b"bravo bravo\n", "/dir/": b"index\n"}


@pytest.fixture
async def resources(aiohttp_server):
    async def serve(request: web.Request) -> web.Response:
        if request.path_qs in CONTENT:
            return web.Response(body=CONTENT[request.path_qs])
        return web.Response(status=404)

    app = web.Application()
    app.router.add_get("/{path:.*}", serve)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


def change(loc: str, kind: ChangeType, body: bytes | None = None, *, n: int = 1, **overrides) -> ResourceChange:
    fixity = {} if body is None else {
        "length": len(body), "hashes": (("md5", hashlib.md5(body).hexdigest()),
                                        ("sha-256", hashlib.sha256(body).hexdigest()))}
    return ResourceChange(loc, kind, changed_at=T0 + timedelta(seconds=n), **{**fixity, **overrides})


def notification(*changes: ResourceChange) -> ChangeNotification:
    return ChangeNotification(T0, T0 + timedelta(minutes=10), changes)


async def test_created_and_updated_are_fetched_and_checked_deleted_removed(resources, tmp_path):
    mirror = Mirror(tmp_path / "mirror")
    try:
        outcomes = await mirror.apply(notification(
            change(resources + "/a.txt", ChangeType.CREATED, CONTENT["/a.txt"], n=1),
            change(resources + "/dir/b.txt", ChangeType.UPDATED, CONTENT["/dir/b.txt"], n=2),
            change(resources + "/dir/", ChangeType.CREATED, CONTENT["/dir/"], n=3),
        ))
        assert [o.outcome for o in outcomes] == ["stored"] * 3
        a = mirror.path_for(resources + "/a.txt")
        assert a.read_bytes() == CONTENT["/a.txt"]
        assert mirror.path_for(resources + "/dir/").name == "_index"
        assert a.is_relative_to(tmp_path / "mirror")

        [deleted, again] = await mirror.apply(notification(
            change(resources + "/a.txt", ChangeType.DELETED, n=4),
            change(resources + "/a.txt", ChangeType.DELETED, n=5)))
        assert (deleted.outcome, again.outcome) == ("deleted", "absent")
        assert not a.exists()
    finally:
        await mirror.close()


async def test_mismatch_keeps_the_previous_copy_and_says_why(resources, tmp_path):
    mirror = Mirror(tmp_path)
    try:
        loc = resources + "/dir/b.txt"
        await mirror.apply(notification(change(loc, ChangeType.CREATED, CONTENT["/dir/b.txt"])))
        [bad_hash] = await mirror.apply(notification(change(
            loc, ChangeType.UPDATED, hashes=(("md5", "0" * 32),), length=len(CONTENT["/dir/b.txt"]))))
        [bad_length] = await mirror.apply(notification(change(loc, ChangeType.UPDATED, length=3)))
        assert bad_hash.outcome == "mismatch" and "md5 is " in bad_hash.detail
        assert bad_length.outcome == "mismatch" and "length is 12 bytes; the notification said 3" in bad_length.detail
        assert mirror.path_for(loc).read_bytes() == CONTENT["/dir/b.txt"]
        [missing] = await mirror.apply(notification(change(resources + "/nope", ChangeType.CREATED)))
        assert missing.outcome == "failed" and "answered 404" in missing.detail
    finally:
        await mirror.close()


def test_urls_cannot_escape_the_mirror_folder(tmp_path):
    mirror = Mirror(tmp_path)
    for loc in ("http://h.example/../../etc/passwd", "http://h.example/%2e%2e/%2e%2e/x",
                "http://h.example/a/..%2f..%2fx", "http://../x"):
        try:
            path = mirror.path_for(loc)
        except ValueError:
            continue
        assert path.resolve().is_relative_to(tmp_path.resolve()), loc
    with pytest.raises(ValueError, match="absolute http"):
        mirror.path_for("file:///etc/passwd")


async def test_mirror_is_a_notification_handler(fake_hub, make_subscriber, resources, tmp_path):
    mirror = Mirror(tmp_path)
    recorder = Recorder()

    async def handle(received):
        await mirror(received)
        await recorder(received)

    subscriber = await make_subscriber(on_notification=handle)
    subscription = await subscriber.subscribe("http://example.com/changes", fake_hub.url)
    body = to_xml(notification(change(resources + "/a.txt", ChangeType.CREATED, CONTENT["/a.txt"])))
    assert (await fake_hub.deliver(subscription.callback, body, secret=subscription.secret))[0] == 200
    await recorder.wait(1)
    assert mirror.path_for(resources + "/a.txt").read_bytes() == CONTENT["/a.txt"]
    await mirror.close()
