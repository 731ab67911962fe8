"""The worker's delivery client (rsnotify/outbound.py request()) against real loopback servers: raw asyncio
servers that answer the way hostile or broken subscribers do, a TLS server with a CA of the
test's own, and one fan-out through a real worker context."""
from __future__ import annotations

import asyncio
import base64
import gzip
import socket
import ssl
import time

import pytest
from yarl import URL

from rsnotify import outbound as outbound_module
from rsnotify.hub import keys
from rsnotify.hub.netguard import HINT
from rsnotify.netguard import parse_networks, refusal_message
from rsnotify.outbound import Answer, Limits, OutboundClient
from tests.support.ports import free_port
from tests.support.rawhttp import (
    LOOPS,
    Certificates,
    RawServer,
    answering,
    make_certificates,
    raw_servers,
)

LOOPBACK = parse_networks(["127.0.0.0/8"])
LIMITS = Limits(connect_timeout=1.0, total_timeout=2.0, max_body=1024)
HEADERS = {"Content-Type": "application/xml", "Link": '<http://example.org/t>; rel="self"', "X-RSNotify-Id": "7-0"}
BODY = b"<urlset>\xc3\xa9 exact bytes\r\n</urlset>"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

pytestmark = pytest.mark.asyncio(loop_factories=LOOPS)     # each test on asyncio's loop and uvloop's


@pytest.fixture
async def serve():
    async with raw_servers() as start:
        yield start


@pytest.fixture
async def client():
    made: list[OutboundClient] = []

    def make(**options) -> OutboundClient:
        made.append(OutboundClient(allowed=options.pop("allowed", LOOPBACK), hint=HINT,
                                   user_agent="rsnotify-hub (test)", **options))
        return made[-1]

    yield make
    for each in made:
        await each.close()


async def post(client: OutboundClient, url: URL, limits: Limits = LIMITS, headers=HEADERS, body=BODY) -> Answer:
    return await client.request("POST", url, headers, body, limits)


async def test_each_test_runs_on_the_loop_its_id_names(request: pytest.FixtureRequest) -> None:
    # the marker above is what puts these tests on uvloop; without this they could pass on asyncio's twice
    loop_module = type(asyncio.get_running_loop()).__module__
    assert loop_module.startswith("uvloop") == request.node.name.endswith("[uvloop]"), (loop_module, request.node.name)


# -- the request


async def test_the_request_carries_exact_body_headers_host_and_length(serve, client) -> None:
    server = await serve(answering(OK))
    answer = await post(client(), server.url("/cb/a?x=1&y=%2F"))
    assert answer == Answer(200, b"ok", "")
    [(head, body)] = server.requests
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /cb/a?x=1&y=%2F HTTP/1.1"
    assert f"Host: 127.0.0.1:{server.port}" in lines and f"Content-Length: {len(BODY)}" in lines
    assert "User-Agent: rsnotify-hub (test)" in lines
    for name, value in HEADERS.items():
        assert f"{name}: {value}" in lines
    assert body == BODY
    assert not any(line.lower().startswith(("transfer-encoding", "connection")) for line in lines)


async def test_credentials_in_the_callback_url_are_sent_as_basic_auth(serve, client) -> None:
    server = await serve(answering(OK))
    url = URL(f"http://sub%40x:p%C3%A4ss@127.0.0.1:{server.port}/cb", encoded=True)
    assert (await post(client(), url)).status == 200
    [(head, _)] = server.requests
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /cb HTTP/1.1" and f"Host: 127.0.0.1:{server.port}" in lines
    assert "Authorization: Basic " + base64.b64encode("sub@x:päss".encode("latin-1")).decode() in lines


async def test_an_authorization_given_in_any_case_is_the_only_one_sent(serve, client) -> None:
    server = await serve(answering(OK))
    url = URL(f"http://sub:pw@127.0.0.1:{server.port}/cb", encoded=True)
    assert (await post(client(), url, headers={**HEADERS, "authorization": "Bearer given"})).status == 200
    [(head, _)] = server.requests
    fields = [line for line in head.decode().split("\r\n") if line.lower().startswith("authorization:")]
    assert fields == ["authorization: Bearer given"]


async def test_a_header_with_a_line_break_is_not_sent(serve, client) -> None:
    server = await serve(answering(OK))
    answer = await post(client(), server.url(), headers={"Link": "<x>\r\nX-Injected: 1"})
    assert answer.status is None and "line break" in answer.error
    await asyncio.sleep(0.05)
    assert server.connections == 0


async def test_redirects_are_not_followed(serve, client) -> None:
    server = await serve(answering(b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n"))
    assert (await post(client(), server.url())).status == 302
    assert len(server.requests) == 1


# -- keep-alive


async def test_one_connection_carries_many_deliveries(serve, client) -> None:
    server = await serve(answering(OK))
    outbound = client()
    answers = [await post(outbound, server.url(f"/cb/{n}")) for n in range(20)]
    assert {a.status for a in answers} == {200} and len(server.requests) == 20
    assert server.connections == 1


async def test_connection_close_answers_are_not_reused(serve, client) -> None:
    server = await serve(answering(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
    outbound = client()
    for _ in range(3):
        assert (await post(outbound, server.url())).status == 200
    assert server.connections == 3


async def test_an_idle_connection_closed_by_the_server_is_retried_once_on_a_new_one(serve, client) -> None:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = server.connections == 1
        while await server.next_request(reader):
            if first and len(server.requests) == 2:
                return                      # the second request on the first connection: closed unanswered
            writer.write(OK)
            await writer.drain()
    server = await serve(handler)
    outbound = client()
    assert (await post(outbound, server.url())).status == 200
    assert (await post(outbound, server.url())).status == 200
    assert server.connections == 2 and len(server.requests) == 3


async def test_a_new_connection_closed_without_an_answer_is_not_retried(serve, client) -> None:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.next_request(reader)
    server = await serve(handler)
    answer = await post(client(), server.url())
    assert answer == Answer(None, b"", "connection closed before an answer")
    assert server.connections == 1


async def test_an_idle_connection_the_server_closed_is_not_used_again(serve, client) -> None:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.next_request(reader)
        writer.write(OK)
        await writer.drain()                # then the handler ends: the server closes the connection
    server = await serve(handler)
    outbound = client()
    assert (await post(outbound, server.url())).status == 200
    await asyncio.sleep(0.2)
    assert (await post(outbound, server.url())).status == 200
    assert server.connections == 2 and len(server.requests) == 2


async def test_at_most_limit_connections_are_open(serve, client) -> None:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await server.next_request(reader):
            await asyncio.sleep(0.05)
            writer.write(OK)
    server = await serve(handler)
    outbound = client(limit=2)
    answers = await asyncio.gather(*(post(outbound, server.url()) for _ in range(8)))
    assert [a.status for a in answers] == [200] * 8
    assert server.most_open == 2


async def test_idle_connections_expire_and_close_with_the_client(serve, client) -> None:
    server = await serve(answering(OK))
    outbound = client(idle_seconds=0.2)
    assert (await post(outbound, server.url())).status == 200
    await asyncio.sleep(0.5)
    assert server.closed_by_client == 1                  # the sweep closed it
    assert (await post(outbound, server.url())).status == 200
    assert server.connections == 2
    await outbound.close()
    await asyncio.sleep(0.05)
    assert server.closed_by_client == 2
    assert (await post(outbound, server.url())).error.startswith("the outbound client is closed")


async def test_a_forgotten_origins_busy_connection_is_closed_when_done(serve, client, monkeypatch) -> None:
    async def slow(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await server.next_request(reader):
            await asyncio.sleep(0.3)
            writer.write(OK)
    monkeypatch.setattr(outbound_module, "MAX_ORIGINS", 1)
    first, second = await serve(slow), await serve(answering(OK))
    outbound = client()
    pending = asyncio.ensure_future(post(outbound, first.url()))
    await asyncio.sleep(0.1)
    assert (await post(outbound, second.url())).status == 200   # the first origin is forgotten meanwhile
    assert (await pending).status == 200
    await asyncio.sleep(0.05)
    assert first.closed_by_client == 1                           # not pooled under a forgotten origin
    assert (await post(outbound, first.url())).status == 200 and first.connections == 2


# -- hostile and unusual answers


@pytest.mark.parametrize(("answer", "error"), [
    (b"SMTP ready\r\n\r\n", "invalid HTTP answer: "),
    (b"HTTP/1.1 2000 OK\r\n\r\n", "invalid HTTP answer: "),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", "invalid HTTP answer: "),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", "invalid HTTP answer: "),
    (b"HTTP/1.1 200 OK\r\nContent-Le", "connection closed before the answer's head was complete"),
])
async def test_broken_answers_give_an_error_and_no_status(serve, client, answer, error) -> None:
    server = await serve(answering(answer, then_close=True))
    outcome = await post(client(), server.url())
    assert outcome.status is None and outcome.error.startswith(error), outcome


async def test_a_header_flood_ends_at_64_kib(serve, client) -> None:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        while not writer.is_closing():
            writer.write(b"X-Flood: " + b"a" * 1000 + b"\r\n")
            await writer.drain()
    server = await serve(handler)
    started = time.monotonic()
    answer = await post(client(), server.url())
    assert answer == Answer(None, b"", "answer's head is over 64 KiB")
    assert time.monotonic() - started < 1.5


async def test_endless_interim_answers_end_at_64_kib(serve, client) -> None:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.next_request(reader)
        while not writer.is_closing():
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" * 100)
            await writer.drain()
    server = await serve(handler)
    assert await post(client(), server.url()) == Answer(None, b"", "answer's head is over 64 KiB")


async def test_an_endless_body_is_read_up_to_the_limit_then_dropped(serve, client) -> None:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"1000\r\n" + b"z" * 4096 + b"\r\n")
            await writer.drain()
    server = await serve(handler)
    outbound = client()
    started = time.monotonic()
    answer = await post(outbound, server.url())
    assert answer == Answer(200, b"z" * LIMITS.max_body, "")
    assert time.monotonic() - started < 1.5
    assert (await post(outbound, server.url())).status == 200
    assert server.connections == 2                       # the cut connection was not reused


async def test_a_slow_drip_ends_at_the_total_timeout(serve, client) -> None:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.next_request(reader)
        for byte in OK:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.3)
    server = await serve(handler)
    started = time.monotonic()
    answer = await post(client(), server.url(), Limits(1.0, 1.0, 1024))
    assert answer == Answer(None, b"", "no answer within 1 s")
    assert 0.9 < time.monotonic() - started < 1.5


async def test_a_silent_subscriber_ends_at_the_total_timeout(serve, client) -> None:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.next_request(reader)
        await asyncio.sleep(5)
    server = await serve(handler)
    started = time.monotonic()
    assert (await post(client(), server.url(), Limits(1.0, 0.5, 1024))).error == "no answer within 0.5 s"
    assert time.monotonic() - started < 1.0


async def test_each_request_on_a_kept_connection_ends_at_its_own_deadline(serve, client) -> None:
    # A connection keeps one deadline timer, moved on only when it fires: an earlier request's
    # deadline must not cut a later, longer one short, nor a later request's shorter deadline wait
    # for the timer an earlier one armed.
    delays = [0.0, 0.6, 5.0]

    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for delay in delays:
            await server.next_request(reader)
            await asyncio.sleep(delay)
            writer.write(OK)
    server = await serve(handler)
    outbound = client()
    assert (await post(outbound, server.url(), Limits(1.0, 0.3, 1024))).status == 200
    assert (await post(outbound, server.url(), Limits(1.0, 3.0, 1024))).status == 200     # answered after 0.6 s
    started = time.monotonic()
    answer = await post(outbound, server.url(), Limits(1.0, 0.5, 1024))
    assert answer == Answer(None, b"", "no answer within 0.5 s")
    assert time.monotonic() - started < 1.5          # not at the 3 s deadline of the request before
    assert server.connections == 1


async def test_a_body_that_stops_coming_keeps_its_status(serve, client) -> None:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 100\r\n\r\nsome")
        await asyncio.sleep(5)
    server = await serve(handler)
    assert await post(client(), server.url(), Limits(1.0, 0.5, 1024)) == Answer(202, b"some", "")


async def test_interim_answers_are_skipped(serve, client) -> None:
    server = await serve(answering(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s>\r\n\r\n" + OK))
    outbound = client()
    assert await post(outbound, server.url()) == Answer(200, b"ok", "")
    assert (await post(outbound, server.url())).status == 200
    assert server.connections == 1


async def test_a_protocol_switch_is_a_status_and_ends_the_connection(serve, client) -> None:
    server = await serve(answering(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"))
    outbound = client()
    assert (await post(outbound, server.url())).status == 101
    assert (await post(outbound, server.url())).status == 101
    assert server.connections == 2


async def test_an_http_1_0_answer_read_to_the_close(serve, client) -> None:
    server = await serve(answering(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nthanks", then_close=True))
    outbound = client()
    assert await post(outbound, server.url()) == Answer(200, b"thanks", "")
    assert (await post(outbound, server.url())).status == 200
    assert server.connections == 2


async def test_a_chunked_answer_is_decoded_and_its_connection_reused(serve, client) -> None:
    server = await serve(answering(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"))
    outbound = client()
    assert await post(outbound, server.url()) == Answer(200, b"abcde", "")
    assert (await post(outbound, server.url())).status == 200
    assert server.connections == 1


async def test_bytes_after_the_answer_end_the_connection(serve, client) -> None:
    server = await serve(answering(OK + b"HTTP/1.1 500 Smuggled\r\nContent-Length: 0\r\n\r\n"))
    outbound = client()
    assert await post(outbound, server.url()) == Answer(200, b"ok", "")
    assert await post(outbound, server.url()) == Answer(200, b"ok", "")
    assert server.connections == 2


# -- where the client may connect


async def test_a_loopback_callback_is_refused_with_the_guards_message(serve, client) -> None:
    server = await serve(answering(OK))
    answer = await post(client(allowed=()), server.url())
    assert answer == Answer(None, b"", refusal_message("127.0.0.1", HINT), is_refused=True)
    assert answer.error == ("outbound connection to 127.0.0.1 refused: not a public address "
                            "(allow its network with --allow-network CIDR)")
    await asyncio.sleep(0.05)
    assert server.connections == 0


async def test_a_host_name_is_judged_by_the_address_it_resolves_to(serve, client) -> None:
    server = await serve(answering(OK))
    refused = await post(client(allowed=parse_networks(["10.0.0.0/8"])), server.url(host="localhost"))
    assert refused.status is None and "refused: not a public address" in refused.error and refused.is_refused
    assert (await post(client(), server.url(host="localhost"))).status == 200   # ::1 refused, 127.0.0.1 taken
    assert server.connections == 1


async def test_a_connection_that_never_completes_ends_at_the_connect_timeout(client) -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", port), backlog=0):
        # a listener that never accepts: once its queue is full, the kernel drops further SYNs
        fillers = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        await asyncio.sleep(0.1)
        started = time.monotonic()
        answer = await post(client(), URL(f"http://127.0.0.1:{port}/cb"), Limits(0.3, 2.0, 1024))
        for filler in fillers:
            filler.close()
    assert answer == Answer(None, b"", "no connection within 0.3 s (connect timeout)")
    assert time.monotonic() - started < 1.0


async def test_a_closed_port_is_connection_refused(client) -> None:
    port = free_port()
    answer = await post(client(), URL(f"http://127.0.0.1:{port}/cb"))
    assert answer == Answer(None, b"", f"connection refused by 127.0.0.1 port {port}")


async def test_an_unknown_host_name_is_not_found(client) -> None:
    answer = await post(client(), URL("http://no-such-host.invalid/cb"))
    assert answer.status is None and answer.error.startswith("host name not found: no-such-host.invalid")


# -- TLS


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


async def test_an_https_callback_trusted_through_ssl_cert_file_gets_sni(serve, client, certificates,
                                                                         monkeypatch) -> None:
    server = await serve(answering(OK), certificates.server)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca_file))
    outbound = client()
    assert await post(outbound, server.url(scheme="https", host="localhost")) == Answer(200, b"ok", "")
    assert await post(outbound, server.url(scheme="https", host="localhost")) == Answer(200, b"ok", "")
    assert certificates.names_seen[-1] == "localhost" and server.connections == 1
    assert server.requests[0][0].startswith(b"POST /cb HTTP/1.1\r\nHost: localhost:")


async def test_an_https_callback_with_an_untrusted_certificate_fails_tls(serve, client, certificates,
                                                                         monkeypatch) -> None:
    server = await serve(answering(OK), certificates.server)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    answer = await post(client(), server.url(scheme="https"))
    assert answer.status is None and answer.error.startswith("TLS failed with 127.0.0.1: certificate verify failed")
    assert server.requests == []


async def test_an_https_callback_by_ip_address_is_checked_against_the_certificates_addresses(
        serve, client, certificates) -> None:
    server = await serve(answering(OK), certificates.server)
    trusting = ssl.create_default_context(cafile=str(certificates.ca_file))
    assert (await post(client(ssl_context=trusting), server.url(scheme="https"))).status == 200
    plain = await post(client(ssl_context=trusting), server.url(scheme="http"))   # http to a TLS port
    assert plain == Answer(None, b"", "connection closed before an answer")


# -- through a worker


async def test_a_fan_out_sends_every_notification_over_one_connection(fanout_hub, serve) -> None:
    server = await serve(answering(b"HTTP/1.1 204 No Content\r\n\r\n"))
    topic = "http://source.example.org/changes/kept-alive"
    sid = await fanout_hub.subscribe(topic, str(server.url("/cb/kept")))
    bodies = [f"<urlset><url><loc>http://example.com/r{n}</loc></url></urlset>".encode() for n in range(10)]
    for each in bodies:
        await fanout_hub.publish(topic, each)
    report = await fanout_hub.fan_out(topic)
    assert report.delivered == 10 and [body for _, body in server.requests] == bodies
    assert server.connections == 1
    assert await fanout_hub.redis.zscore(keys.due_key(), sid) is None


async def test_a_bounded_get_sends_no_body_framing_and_reads_at_most_n_bytes(serve, client) -> None:
    server = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"))
    answer = await client().request("GET", server.url("/topic"), {"Accept-Encoding": "identity"}, b"",
                                    Limits(1.0, 2.0, 4))
    assert answer == Answer(200, b"0123", "")
    [(head, _)] = server.requests
    assert head.startswith(b"GET /topic HTTP/1.1\r\n") and b"content-length" not in head.lower()


async def test_a_callers_accept_encoding_is_sent_and_no_content_coding_is_decoded(serve, client) -> None:
    # what verification relies on: it asks for identity, and an answer coded anyway comes back as sent
    coded = gzip.compress(b"challenge")
    server = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
                                   % (len(coded), coded)))
    answer = await client().request("GET", server.url("/cb?hub.challenge=x"), {"Accept-Encoding": "identity"}, b"",
                                    Limits(1.0, 2.0, 1024))
    assert answer == Answer(200, coded, "")
    [(head, _)] = server.requests
    assert head.lower().count(b"accept-encoding") == 1 and b"\r\nAccept-Encoding: identity\r\n" in head


async def test_only_the_guards_refusal_is_marked_as_one(serve, client) -> None:
    server = await serve(answering(OK))
    refused = await post(client(allowed=()), server.url())
    closed = await post(client(), URL(f"http://127.0.0.1:{free_port()}/cb"))
    answered = await post(client(), server.url())
    assert refused.is_refused and refused.error == refusal_message("127.0.0.1", HINT)
    assert not closed.is_refused and closed.error.startswith("connection refused by 127.0.0.1")
    assert not answered.is_refused and answered.status == 200
