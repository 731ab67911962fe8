"""A request that aiohttp cannot even parse (a header line past 8 KiB, a Content-Length that is
not a number, chunked and Content-Length together) gets its 400 from the hub, from `rsnotify
source` and from the callback server of `rsnotify subscribe` alike, and leaves one short line in
their logs, never a traceback: a stranger must not be able to fill an operator's log with them."""
from __future__ import annotations

import signal
import socket
from pathlib import Path

from tests.support import cli
from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.waiting import wait_until

WAIT = 60.0
MALFORMED = (
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
)


def send_raw(port: int, data: bytes) -> bytes:
    """The status line the server answers `data` with."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(data)
        answer = b""
        while b"\r\n" not in answer:
            chunk = connection.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def assert_refused_in_one_line(port: int, log: Path, *, logged: bool) -> None:
    for data in MALFORMED:
        status = send_raw(port, data)
        assert status.startswith(b"HTTP/1.") and b" 400 " in status, status
    if logged:  # the process logs at INFO: one line per request, naming the reason
        wait_until(lambda: log.read_text().count("refused a malformed request from") >= len(MALFORMED),
                   WAIT, "the refusal lines", logs=log)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and "Error handling request" not in text, text[-3000:]


def test_the_hub_answers_400_and_logs_one_line_per_malformed_request(hub_process) -> None:
    hub = hub_process()
    assert_refused_in_one_line(hub.port, hub.log, logged=True)
    assert "Got more than 8190 bytes" in hub.output()
    assert fetch(hub.url + "health").status == 200


def test_source_and_subscribe_answer_400_without_a_traceback(hub_process, tmp_path: Path) -> None:
    hub = hub_process()
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    source_port, callback_port = free_port(), free_port()
    base = f"http://127.0.0.1:{source_port}/"
    source_log, subscribe_log = tmp_path / "source.log", tmp_path / "subscribe.log"
    source = cli.start("source", "--dir", str(src), "--base-url", base, "--hub", hub.url,
                       "--db", str(tmp_path / "memory.db"), log=source_log)
    subscriber = None
    try:
        wait_until(lambda: "serving on" in source_log.read_text(), WAIT, "rsnotify source", logs=source_log)
        assert_refused_in_one_line(source_port, source_log, logged=True)   # the Source logs at INFO
        subscriber = cli.start("subscribe", "--hub", hub.url, "--topic", base + "changes",
                               "--listen", f"127.0.0.1:{callback_port}", "--state-file", str(tmp_path / "sub.db"),
                               log=subscribe_log, cwd=tmp_path)
        wait_until(lambda: "subscribed to" in subscribe_log.read_text(), WAIT, "the subscription", logs=subscribe_log)
        assert_refused_in_one_line(callback_port, subscribe_log, logged=False)  # WARNING and up: nothing
        assert "malformed" not in subscribe_log.read_text()
        assert subscriber.poll() is None and source.poll() is None
    finally:
        if subscriber is not None:
            cli.stop(subscriber, signal.SIGINT)
        cli.stop(source, signal.SIGINT)
