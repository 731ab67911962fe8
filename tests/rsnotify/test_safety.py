"""The one parser refuses DTDs, entities, external entities and deep or huge documents:
nothing is ever expanded or fetched."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from rsnotify.documents import parse_document
from rsnotify.errors import DocumentParseError, NotificationParseError
from rsnotify.xml import parse_capability_list, parse_notification

URLSET_OPEN = (
    '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
    '<rs:md capability="change-notification" from="2013-01-03T00:00:00Z" until="2013-01-03T00:10:00Z"/>'
)

BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    + "".join(f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">' for i in range(1, 10))
    + "]>" + URLSET_OPEN + "<url><loc>&lol9;</loc><rs:md change=\"created\"/></url></urlset>"
)
XXE_FILE = (
    '<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
    + URLSET_OPEN + '<url><loc>&xxe;</loc><rs:md change="created"/></url></urlset>'
)
EXTERNAL_DTD = '<?xml version="1.0"?><!DOCTYPE urlset SYSTEM "http://127.0.0.1:{port}/evil.dtd">' + URLSET_OPEN + "</urlset>"
PARAMETER_ENTITY = (
    '<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY % remote SYSTEM "http://127.0.0.1:{port}/x.dtd"> %remote;]>'
    + URLSET_OPEN + "</urlset>"
)


@pytest.fixture
def listener():
    """A loopback HTTP server that records any request: a safe parser never makes one."""
    requests: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            requests.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'<!ENTITY leak "LEAKED">')

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], requests
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("payload", [BILLION_LAUGHS, XXE_FILE], ids=["billion-laughs", "xxe-file"])
@pytest.mark.parametrize("parse", [parse_notification, parse_capability_list, parse_document])
def test_dtd_payloads_are_refused_before_expansion(payload: str, parse) -> None:
    with pytest.raises(DocumentParseError, match=r"document has a DTD \(<!DOCTYPE \.\.\.>\); expected none"):
        parse(payload.encode())


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])  # utf-16 is refused before any DTD scan
@pytest.mark.parametrize("payload", [EXTERNAL_DTD, PARAMETER_ENTITY], ids=["external-dtd", "parameter-entity"])
def test_external_dtds_are_never_fetched(payload: str, encoding: str, listener) -> None:
    port, requests = listener
    text = payload.format(port=port).replace('<?xml version="1.0"?>', f'<?xml version="1.0" encoding="{encoding}"?>')
    # refused by the encoding or DTD check on the raw bytes; either way nothing is fetched
    with pytest.raises(NotificationParseError, match="DTD|UTF-16"):
        parse_notification(text.encode(encoding))
    assert requests == []


def test_a_dtd_in_utf16_is_refused_too() -> None:
    payload = '<?xml version="1.0" encoding="UTF-16"?>' + XXE_FILE.removeprefix('<?xml version="1.0"?>')
    with pytest.raises(NotificationParseError, match="UTF-16 byte order mark; expected UTF-8"):
        parse_notification(payload.encode("utf-16"))


def test_undeclared_entities_are_not_well_formed() -> None:
    with pytest.raises(NotificationParseError, match="not well-formed XML: Entity 'xxe' not defined"):
        parse_notification((URLSET_OPEN + "<url><loc>&xxe;</loc></url></urlset>").encode())


def test_depth_is_bounded() -> None:
    deep = URLSET_OPEN + "<x>" * 300 + "</x>" * 300 + "</urlset>"
    with pytest.raises(NotificationParseError, match="depth"):
        parse_notification(deep.encode())


def test_size_is_bounded_by_default() -> None:
    huge = b" " * 52_428_801
    with pytest.raises(NotificationParseError, match="bytes; expected at most 52428800 bytes"):
        parse_notification(huge)


def test_parser_is_safe_from_several_threads() -> None:
    data = (URLSET_OPEN + '<url><loc>http://example.com/a</loc><rs:md change="created"/></url></urlset>').encode()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(200):
                assert parse_notification(data).changes[0].loc == "http://example.com/a"
        except BaseException as exc:  # collected for the main thread's assert
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
