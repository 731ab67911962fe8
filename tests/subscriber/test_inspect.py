"""`rsnotify inspect` as a user runs it: on a running `rsnotify source`, on the spec's example
documents served over loopback, and on a broken Source (exit 1, each problem listed); and
`rsnotify validate` reading http(s) URLs."""
from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.support import cli
from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.servers import ThreadedServer
from tests.support.waiting import wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORE = FIXTURES / "core-1.1"
CN = FIXTURES / "change-notification-1.0.1"


def serve_documents(port: int, documents: dict[str, bytes],
                    headers: dict[str, dict[str, str]] | None = None) -> ThreadedServer:
    """A loopback server on `port` answering each path of `documents` with its bytes (404 otherwise)."""

    async def handle(request: web.Request) -> web.Response:
        body = documents.get(request.path)
        if body is None:
            raise web.HTTPNotFound(text=f"no {request.path}")
        return web.Response(body=body, content_type="application/xml", headers=(headers or {}).get(request.path, {}))

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    return ThreadedServer(app, port=port).start()


@pytest.fixture
def servers() -> Iterator[list[ThreadedServer]]:
    started: list[ThreadedServer] = []
    yield started
    for server in started:
        server.stop()


def _spec_example(name: Path, base: str) -> bytes:
    """A spec example with its example.com / hub.example.org URLs moved to the loopback server."""
    return name.read_bytes().replace(b"http://example.com", base.encode()).replace(
        b"http://hub.example.org/websub/", f"{base}/websub/".encode())


def test_inspect_reads_the_spec_examples_as_one_source(servers):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    documents = {
        "/.well-known/resourcesync": _spec_example(CORE / "resourcesync_ex_7.xml", base),
        "/dataset1/capabilitylist.xml": _spec_example(CN / "notification_ex_7.xml", base),
        "/dataset1/resourcelist.xml": _spec_example(CORE / "resourcesync_ex_15.xml", base),   # an index of 3
        "/resourcelist1.xml": _spec_example(CORE / "resourcesync_ex_14.xml", base),
        "/resourcelist2.xml": _spec_example(CORE / "resourcesync_ex_14.xml", base),
        "/resourcelist3.xml": _spec_example(CORE / "resourcesync_ex_14.xml", base),
        "/dataset1/resourcedump.xml": _spec_example(CORE / "resourcesync_ex_17.xml", base),
        "/dataset1/changelist.xml": _spec_example(CORE / "resourcesync_ex_21.xml", base),
        "/dataset1/changedump.xml": _spec_example(CORE / "resourcesync_ex_22.xml", base),
        "/dataset1/change/": b"",
    }
    topic_links = {"/dataset1/change/": {"Link": f'<{base}/websub/>; rel="hub", <{base}/dataset1/change/>; rel="self"'}}
    server = serve_documents(port, documents, topic_links)
    servers.append(server)
    assert server.base == base

    result = cli.run("inspect", base + "/", "--json")
    report = json.loads(result.stdout)
    assert report["source_description"] == base + "/.well-known/resourcesync"
    [listed] = report["capability_lists"]
    by_capability = {d["capability"]: d for d in listed["documents"]}
    assert list(by_capability) == ["resourcelist", "resourcedump", "changelist", "changedump", "change-notification"]
    resources = by_capability["resourcelist"]
    assert (resources["kind"], resources["parts"], resources["entries"]) == ("Resource List Index", 3, 6)
    assert (resources["at"], resources["completed"]) == ("2013-01-03T09:00:00Z", "2013-01-03T09:10:00Z")
    changes = by_capability["changelist"]
    assert changes["kind"] == "Change List" and changes["entries"] == 4 and changes["from"] == "2013-01-02T00:00:00Z"
    assert by_capability["resourcedump"]["entries"] == 3 and by_capability["changedump"]["entries"] == 3
    channel = by_capability["change-notification"]
    assert (channel["topic"], channel["hubs"]) == (base + "/dataset1/change/", [base + "/websub/"])
    assert report["problems"] == [], report["problems"]
    assert result.returncode == 0, result.stdout + result.stderr

    # The same Source found from one of its lists (rel="up"), as text.
    text = cli.run("inspect", base + "/resourcelist2.xml")
    assert text.returncode == 0, text.stdout + text.stderr
    assert f"Capability List: {base}/dataset1/capabilitylist.xml" in text.stdout
    assert f"resourcelist: {base}/dataset1/resourcelist.xml (Resource List Index, at 2013-01-03T09:00:00Z, " \
           "completed 2013-01-03T09:10:00Z, 3 list(s), 6 entries)" in text.stdout
    assert "no problems found" in text.stdout


def test_inspect_lists_every_problem_of_a_broken_source(servers):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    capability_list = f"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:ln rel="up" href="{base}/.well-known/resourcesync"/>
  <rs:md capability="capabilitylist"/>
  <url><loc>{base}/resourcelist.xml</loc><rs:md capability="resourcelist"/></url>
  <url><loc>{base}/changelist.xml</loc><rs:md capability="changelist"/></url>
  <url><loc>{base}/missing-dump.xml</loc><rs:md capability="resourcedump"/></url>
  <url><loc>{base}/changes</loc><rs:md capability="change-notification"/></url>
</urlset>""".encode()
    wrong_kind = f"""<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:ln rel="up" href="{base}/elsewhere.xml"/>
  <rs:md capability="changelist" from="2024-01-01T00:00:00Z"/>
  <url><loc>{base}/a</loc><rs:md change="created"/></url>
</urlset>""".encode()
    bad_entry = f"""<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:ln rel="up" href="{base}/capabilitylist.xml"/>
  <rs:md capability="changelist" from="2024-01-01T00:00:00Z"/>
  <url><loc>{base}/a</loc><rs:md change="moved"/></url>
</urlset>""".encode()
    description = f"""<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:md capability="description"/>
  <url><loc>{base}/capabilitylist.xml</loc><rs:md capability="capabilitylist"/></url>
</urlset>""".encode()
    servers.append(serve_documents(port, {
        "/.well-known/resourcesync": description, "/capabilitylist.xml": capability_list,
        "/resourcelist.xml": wrong_kind, "/changelist.xml": bad_entry,
    }))

    result = cli.run("inspect", base + "/")
    assert result.returncode == 1, result.stdout + result.stderr
    problems = result.stdout.split("problems (")[1].splitlines()[1:]
    expected = [
        f"{base}/resourcelist.xml has capability 'changelist'; the Capability List lists it as 'resourcelist'",
        f"{base}/resourcelist.xml links up to {base}/elsewhere.xml; expected its Capability List {base}/capabilitylist.xml",
        f"{base}/changelist.xml: <rs:md> for {base}/a has change='moved'",
        f"{base}/missing-dump.xml answered 404; expected 200",
        f"change-notification channel {base}/changes has no <rs:ln rel=\"hub\">",
        f"topic not found at {base}/changes (answered 404; expected 200)",
    ]
    for needle in expected:
        assert any(needle in line for line in problems), f"{needle!r} not in:\n{result.stdout}"
    assert "Traceback" not in result.stderr

    unreachable = cli.run("inspect", f"http://127.0.0.1:{free_port()}/")
    assert unreachable.returncode == 1
    assert "connection refused" in unreachable.stdout and "Traceback" not in unreachable.stderr
    usage = cli.run("inspect", "example.org/data")
    assert usage.returncode == 2 and "URL must be an absolute http or https URL" in usage.stderr


def test_inspect_and_validate_a_running_rsnotify_source(hub_process, tmp_path):
    hub = hub_process()
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}.txt").write_text(f"file {i}\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    source = cli.start("source", "--dir", str(src), "--base-url", base, "--hub", hub.url, "--db",
                       str(tmp_path / "memory.db"), log=tmp_path / "source.log")
    try:
        wait_until(lambda: _ok(base + "capabilitylist.xml"), 60, "rsnotify source to serve", logs=[tmp_path / "source.log"])
        result = cli.run("inspect", base, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        documents = {d["capability"]: d for d in report["capability_lists"][0]["documents"]}
        assert documents["resourcelist"]["entries"] == 5 and documents["resourcelist"]["kind"] == "Resource List"
        assert documents["changelist"]["entries"] == 5
        assert documents["change-notification"]["topic"] == base + "changes"
        assert documents["change-notification"]["hubs"] == [hub.url]

        checked = cli.run("validate", base + "capabilitylist.xml", base + "resourcelist.xml")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"{base}resourcelist.xml: ok (Resource List, 5 entries)" in checked.stdout
        missing = cli.run("validate", base + "nothing.xml")
        assert missing.returncode == 2 and f"{base}nothing.xml answered 404" in missing.stderr
    finally:
        cli.stop(source, signal.SIGINT)


def _ok(url: str) -> bool:
    try:
        return fetch(url).status == 200
    except OSError:
        return False
