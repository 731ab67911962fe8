"""A body that is not the gzip its `Content-Encoding` claims, sent to the callback of
`rsnotify subscribe` or to `rsnotify source`, is a 400 naming the problem (it was a 500 and a
traceback); and a relayed document that is not a change notification, without an X-RSNotify-Id,
is reported as "a notification", never "notification None"."""
from __future__ import annotations

import re
import signal
from pathlib import Path

from tests.support import cli
from tests.support.http import http
from tests.support.ports import free_port
from tests.support.waiting import wait_until

WAIT = 60.0
DTD = b'<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE x [<!ENTITY e "boom">]>\n<x>&e;</x>'


def test_the_callback_of_rsnotify_subscribe(hub_process, tmp_path: Path) -> None:
    hub = hub_process()
    log = tmp_path / "subscribe.log"
    subscriber = cli.start("subscribe", "--hub", hub.url, "--topic", "http://data.example.org/ds1/changes",
                           "--listen", f"127.0.0.1:{free_port()}", "--no-secret",
                           "--state-file", str(tmp_path / "sub.db"), log=log, cwd=tmp_path)
    try:
        match = wait_until(lambda: re.search(r"callback (http://\S+)", log.read_text()), WAIT, "the subscription",
                           logs=log)
        callback = match.group(1)
        status, body = http("POST", callback, b"<urlset/>", {"Content-Type": "application/xml",
                                                              "Content-Encoding": "gzip"})
        assert status == 400, body
        assert b"the body cannot be read as sent" in body and b"gzip" in body, body
        status, body = http("POST", callback, DTD, {"Content-Type": "application/xml"})
        assert 200 <= status < 300, body
        wait_until(lambda: "is not a valid change notification" in log.read_text(), WAIT, "the report", logs=log)
        text = log.read_text()
        assert "a notification on http://data.example.org/ds1/changes is not a valid change notification" in text
        assert "None" not in text and "Traceback" not in text, text
        assert subscriber.poll() is None
    finally:
        cli.stop(subscriber, signal.SIGINT)


def test_rsnotify_source(hub_process, tmp_path: Path) -> None:
    hub = hub_process()
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    base = f"http://127.0.0.1:{free_port()}/data/"
    log = tmp_path / "source.log"
    source = cli.start("source", "--dir", str(src), "--base-url", base, "--hub", hub.url,
                       "--db", str(tmp_path / "m.db"), log=log)
    try:
        wait_until(lambda: "serving on" in log.read_text(), WAIT, "rsnotify source", logs=log)
        status, body = http("POST", base + "a.txt", b"not gzip", {"Content-Type": "text/plain",
                                                                  "Content-Encoding": "gzip"})
        assert status == 400, body
        assert b"cannot be read as sent" in body, body
        assert http("GET", base + "a.txt")[1] == b"a\n"
        text = log.read_text()
        assert "Traceback" not in text and "Error handling request" not in text, text[-3000:]
    finally:
        cli.stop(source, signal.SIGINT)
