"""`rsnotify subscribe` as a user runs it: a subprocess that subscribes, prints what the hub
delivers as JSON lines, and (with --unsubscribe-on-exit) unsubscribes, verified, on Ctrl-C."""
from __future__ import annotations

import asyncio
import json
import signal
import socket
from pathlib import Path

from aiohttp import web

from tests.support import cli
from tests.support.ports import free_port

from .conftest import T0, make_notification

TOPIC = "http://example.com/dataset1/change/"


class Process:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.stderr: list[str] = []

    async def wait_for_status(self, text: str, timeout: float = 20.0) -> str:
        async def read() -> str:
            while True:
                line = (await self.process.stderr.readline()).decode()
                if not line:
                    raise AssertionError(f"stderr closed before {text!r}; got {''.join(self.stderr)}")
                self.stderr.append(line)
                if text in line:
                    return line
        return await asyncio.wait_for(read(), timeout)

    async def json_line(self, timeout: float = 10.0) -> dict:
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        return json.loads(line)

    async def interrupt(self, timeout: float = 20.0) -> int:
        self.process.send_signal(signal.SIGINT)
        rest = await asyncio.wait_for(self.process.stderr.read(), timeout)
        self.stderr.append(rest.decode())
        return await asyncio.wait_for(self.process.wait(), timeout)


async def start(tmp_path: Path, *args: str) -> Process:
    process = await cli.start_async("subscribe", *args, "--listen", "127.0.0.1:0", "--state-file",
                                    str(tmp_path / "state.json"), "--verification-timeout", "10", cwd=tmp_path)
    return Process(process)


async def test_subscribe_prints_each_notification_and_unsubscribes_on_ctrl_c(fake_hub, tmp_path):
    cli = await start(tmp_path, "--hub", fake_hub.url, "--topic", TOPIC, "--lease-seconds", "900",
                      "--unsubscribe-on-exit")
    try:
        await cli.wait_for_status("subscribed to")
        await fake_hub.settle()
        [subscription] = fake_hub.subscriptions.values()
        assert subscription.topic == TOPIC and subscription.secret and fake_hub.requests[0]["hub.lease_seconds"] == "900"
        body = make_notification(T0, 10, "http://example.com/res1", "http://example.com/res2")
        status, _ = await fake_hub.deliver(subscription.callback, body, secret=subscription.secret,
                                           notification_id="n-1", sequence=1)
        assert status == 200
        line = await cli.json_line()
        assert line["topic"] == TOPIC and line["hub"] == fake_hub.url
        assert (line["notification_id"], line["sequence"]) == ("n-1", 1)
        assert (line["from"], line["until"]) == ("2024-05-01T12:00:00Z", "2024-05-01T12:10:00Z")
        assert line["changes"][0] == {
            "loc": "http://example.com/res1", "change": "updated", "datetime": "2024-05-01T12:00:01Z",
            "hash": "md5:1584abdf8ebdc9802ac0c6a7402c03b6", "length": 8876, "type": "application/pdf",
        }
        assert [c["loc"] for c in line["changes"]] == ["http://example.com/res1", "http://example.com/res2"]
        assert (await fake_hub.deliver(subscription.callback, body))[0] == 403  # unsigned: refused
    finally:
        code = await cli.interrupt()
    assert code == 0, "".join(cli.stderr)
    await fake_hub.settle()
    assert fake_hub.requests[-1]["hub.mode"] == "unsubscribe"
    assert fake_hub.verifications[-1].query["hub.mode"] == "unsubscribe"
    assert fake_hub.verifications[-1].status == 200
    assert "unsubscribed from" in "".join(cli.stderr)


async def test_subscribe_discovers_the_channel_from_a_source(fake_hub, aiohttp_server, tmp_path):
    documents: dict[str, str] = {}

    async def serve(request: web.Request) -> web.Response:
        if request.path not in documents:
            return web.Response(status=404)
        return web.Response(text=documents[request.path], content_type="application/xml")

    app = web.Application()
    app.router.add_get("/{path:.*}", serve)
    server = await aiohttp_server(app)
    base = str(server.make_url("")).rstrip("/")
    ns = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"'
    documents["/.well-known/resourcesync"] = (
        f'<urlset {ns}><rs:md capability="description"/><url><loc>{base}/caps.xml</loc>'
        '<rs:md capability="capabilitylist"/></url></urlset>')
    documents["/caps.xml"] = (
        f'<urlset {ns}><rs:ln rel="up" href="{base}/.well-known/resourcesync"/><rs:md capability="capabilitylist"/>'
        f'<url><loc>{base}/changes</loc><rs:ln rel="hub" href="{fake_hub.url}"/>'
        '<rs:md capability="change-notification"/></url></urlset>')
    cli = await start(tmp_path, "--source", base + "/", "--no-secret")
    try:
        await cli.wait_for_status("subscribed to")
        await fake_hub.settle()
        [subscription] = fake_hub.subscriptions.values()
        assert subscription.topic == base + "/changes" and subscription.secret is None
        body = make_notification(T0, 10, base + "/res.txt")
        status, _ = await fake_hub.deliver(subscription.callback, body, sequence=4)
        assert status == 200
        line = await cli.json_line()
        assert line["topic"] == base + "/changes" and line["sequence"] == 4
        assert [change["loc"] for change in line["changes"]] == [base + "/res.txt"]
    finally:
        assert await cli.interrupt() == 0, "".join(cli.stderr)


def test_usage_mistakes_get_a_message_not_a_traceback(tmp_path):
    state = ["--state-file", str(tmp_path / "s.json")]
    cases = [
        ([], "exactly one of --topic"),
        (["--source", "http://a.example/", "--topic", "http://b.example/"], "exactly one of"),
        (["--hub", "http://hub.example/", "--capability-list", "http://a.example/c.xml"], "--hub needs --topic"),
        (["--topic", "http://a.example/", "--listen", "nowhere"], "--listen must be HOST:PORT"),
    ]
    for args, message in cases:
        result = cli.invoke("subscribe", *args, *state)
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output


def test_unreachable_hub_is_reported_with_exit_1(tmp_path):
    result = cli.invoke("subscribe", "--hub", "http://127.0.0.1:9/hub", "--topic", TOPIC, "--listen", "127.0.0.1:0",
                        "--state-file", str(tmp_path / "s.json"), "--verification-timeout", "2")
    assert result.exit_code == 1, result.output
    assert "cannot reach hub http://127.0.0.1:9/hub" in result.output
    assert "Traceback" not in result.output


def test_busy_listen_port_is_reported(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli.invoke("subscribe", "--hub", "http://127.0.0.1:9/hub", "--topic", TOPIC, "--listen",
                            f"127.0.0.1:{port}", "--state-file", str(tmp_path / "s.json"))
    assert result.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in result.output


async def test_restart_after_a_crash_resumes_the_same_subscription(fake_hub, tmp_path):
    port = free_port()
    args = ("--hub", fake_hub.url, "--topic", TOPIC, "--listen", f"127.0.0.1:{port}",
            "--state-file", str(tmp_path / "state.json"))

    async def run() -> Process:
        return Process(await cli.start_async("subscribe", *args, cwd=tmp_path))

    first = await run()
    await first.wait_for_status("subscribed to")
    first.process.kill()  # a crash: no unsubscribe
    await first.process.wait()
    await fake_hub.settle()
    [callback] = fake_hub.subscriptions

    second = await run()
    try:
        await second.wait_for_status("resuming the subscription")
        await second.wait_for_status("subscribed to")
        await fake_hub.settle()
        assert [form["hub.callback"] for form in fake_hub.requests] == [callback, callback]
        secret = fake_hub.subscriptions[callback].secret
        status, _ = await fake_hub.deliver(callback, make_notification(), secret=secret, sequence=1)
        assert status == 200 and (await second.json_line())["sequence"] == 1
    finally:
        assert await second.interrupt() == 0, "".join(second.stderr)
