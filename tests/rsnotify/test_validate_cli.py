"""`rsnotify validate`: through click's runner and as a real subprocess."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PAYLOAD = FIXTURES / "change-notification-1.0.1/notification_ex_1.xml"
CAPABILITY_LIST = FIXTURES / "change-notification-1.0.1/notification_ex_7.xml"
BROKEN = (
    b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
    b'<rs:md capability="change-notification" from="2013-01-03T00:00:00Z"/>'
    b'<url><loc>http://example.com/res1</loc><rs:md change="moved"/></url></urlset>'
)

pytestmark = pytest.mark.skipif(not PAYLOAD.exists(), reason="spec fixtures folder not present")


def run(*args: str, input: bytes | None = None):
    return cli.invoke("validate", *args, input=input, catch_exceptions=False)


def test_valid_files_say_what_they_are() -> None:
    result = run(str(PAYLOAD), str(CAPABILITY_LIST))
    assert result.exit_code == 0
    assert result.output.splitlines() == [
        f"{PAYLOAD}: ok (change notification, 2 entries)",
        f"{CAPABILITY_LIST}: ok (Capability List, 5 entries)",
    ]


def test_an_invalid_file_lists_each_problem_and_exits_1(tmp_path: Path) -> None:
    broken = tmp_path / "broken.xml"
    broken.write_bytes(BROKEN)
    result = run(str(PAYLOAD), str(broken))
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0].endswith("ok (change notification, 2 entries)")
    assert lines[1:] == [
        f"{broken}: invalid change notification (1 entry):",
        f"{broken}: <rs:md> of <urlset> has no until; expected a W3C datetime",
        f"{broken}: <rs:md> for http://example.com/res1 has change='moved'; expected created, updated or deleted",
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not xml at all", "<stdin>: not well-formed XML"),
        (b'<!DOCTYPE x [<!ENTITY a "b">]><x>&a;</x>', "<stdin>: document has a DTD"),
        (b"", "<stdin>: not well-formed XML"),
    ],
)
def test_standard_input_and_garbage_give_a_message_not_a_traceback(data: bytes, message: str) -> None:
    result = run("-", input=data)
    assert result.exit_code == 1
    assert result.output.startswith(message)


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    result = run(str(tmp_path / "absent.xml"))
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    assert run(str(tmp_path)).exit_code == 2


def test_no_file_is_a_usage_error() -> None:
    assert run().exit_code == 2


def test_notes_are_printed_for_legacy_documents() -> None:
    legacy = FIXTURES / "change-notification-1.0/notification_ex_1.xml"
    result = run(str(legacy))
    assert result.exit_code == 0
    assert f"{legacy}: note: capability 'changelist-notification'" in result.output


def test_real_subprocess_verdicts() -> None:
    ok = cli.run("validate", str(PAYLOAD), text=False)
    assert (ok.returncode, ok.stdout.decode()) == (0, f"{PAYLOAD}: ok (change notification, 2 entries)\n")
    bad = cli.run("validate", "-", input=BROKEN, text=False)
    assert bad.returncode == 1
    assert b"has change='moved'" in bad.stdout and b"Traceback" not in bad.stderr
    missing = cli.run("validate", "/nonexistent/x.xml", text=False)
    assert missing.returncode == 2 and b"Traceback" not in missing.stderr
