"""`rsnotify capability-list set` and `set_capabilities`: exactly one entry per capability given,
every other entry kept as it was."""
from __future__ import annotations

from pathlib import Path

from rsnotify.notification import CapabilityEntry, CapabilityList, Link
from rsnotify.publisher.advertise import set_capabilities
from rsnotify.xml import parse_capability_list
from tests.support import cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BASE = "https://example.org/dataset1/"


def test_set_replaces_each_capability_in_place_and_keeps_the_rest():
    dump = CapabilityEntry(BASE + "resourcedump.xml", "resourcedump")
    old_list = CapabilityEntry(BASE + "old-resourcelist.xml", "resourcelist", (Link("describedby", BASE + "about"),))
    same_changes = CapabilityEntry(BASE + "changelist.xml", "changelist", (Link("describedby", BASE + "cl-about"),))
    current = CapabilityList((old_list, dump, same_changes), up=BASE + "sd.xml")
    result = set_capabilities(current, resourcelist=BASE + "resourcelist.xml", changelist=BASE + "changelist.xml",
                              topic_url=BASE + "changes", hub_urls=["https://hub.example.org/"])
    assert [(e.capability, e.loc) for e in result.entries] == [
        ("resourcelist", BASE + "resourcelist.xml"), ("resourcedump", BASE + "resourcedump.xml"),
        ("changelist", BASE + "changelist.xml"), ("change-notification", BASE + "changes"),
    ]
    assert result.entries[2] == same_changes  # same URL: its links stay
    assert result.entries[3].links_with("hub") == ["https://hub.example.org/"]


def test_cli_edits_a_spec_capability_list_and_creates_a_missing_one(tmp_path):
    path = tmp_path / "capabilitylist.xml"
    path.write_bytes((FIXTURES / "core-1.1" / "resourcesync_ex_13.xml").read_bytes())
    before = parse_capability_list(path.read_bytes())
    result = cli.invoke("capability-list", "set", str(path), "--changelist", BASE + "changelist.xml",
                        "--topic", BASE + "changes", "--hub", "https://hub.example.org/")
    assert result.exit_code == 0, result.output
    after = parse_capability_list(path.read_bytes())
    capabilities = [e.capability for e in after.entries]
    assert sorted(capabilities) == sorted(set(capabilities))  # one entry per capability
    assert [e for e in after.entries if e.capability not in ("changelist", "change-notification")] == [
        e for e in before.entries if e.capability not in ("changelist", "change-notification")
    ]
    assert after.by_capability("changelist")[0].loc == BASE + "changelist.xml"
    created = tmp_path / "new.xml"
    result = cli.invoke("capability-list", "set", str(created), "--up", BASE + "sd.xml",
                        "--resourcelist", BASE + "resourcelist.xml")
    assert result.exit_code == 0, result.output
    assert parse_capability_list(created.read_bytes()).up == BASE + "sd.xml"


def test_cli_refuses_what_it_cannot_do(tmp_path):
    missing = cli.invoke("capability-list", "set", str(tmp_path / "none.xml"), "--resourcelist", BASE)
    assert missing.exit_code == 2 and "give --up" in missing.output
    nothing = cli.invoke("capability-list", "set", str(tmp_path / "none.xml"))
    assert nothing.exit_code == 2 and "nothing to set" in nothing.output
    bad = tmp_path / "bad.xml"
    bad.write_text("<urlset/>")
    refused = cli.invoke("capability-list", "set", str(bad), "--resourcelist", BASE + "rl.xml")
    assert refused.exit_code == 2 and "not a Capability List" in refused.output
