"""`rsnotify publish --file` JSON Lines with a missing (or null) loc or change: exit 1 with one
line saying "got nothing", never Python's "got None", and nothing reaches the hub."""
from __future__ import annotations

import pytest

from tests.support import cli

TOPIC = "https://example.org/dataset1/change/"


@pytest.mark.parametrize(("line", "message"), [
    ('{"loc": null, "change": "updated"}', "a change needs a loc (the resource's URI), got nothing"),
    ('{"change": "updated"}', "a change needs a loc (the resource's URI), got nothing"),
    ('{"loc": "https://example.org/a"}', "change of https://example.org/a must be created, updated or deleted, "
                                         "got nothing"),
    ('{"loc": "https://example.org/a", "change": null}', "must be created, updated or deleted, got nothing"),
])
def test_a_missing_field_is_named_in_words(threaded_hub, tmp_path, line, message) -> None:
    result = cli.run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--state", str(tmp_path / "m.db"),
                     "--file", "-", input=line + "\n")
    assert result.returncode == 1, result.stderr
    assert message in result.stderr and "None" not in result.stderr, result.stderr
    assert threaded_hub.received == []
