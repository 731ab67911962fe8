"""Every seconds-like option of the command lines refuses `nan` and `inf` with one line and exit
2 before doing anything (click's FloatRange lets nan through every bound: `--verification-timeout
nan` used to wait "within nan s")."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import cli


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("args", [
    ["subscribe", "--hub", "http://127.0.0.1:1/", "--topic", "http://127.0.0.1:1/t", "--listen", "127.0.0.1:0",
     "--state-file", "{tmp}/s.db", "--verification-timeout"],
    ["sync", "--source", "http://127.0.0.1:1/", "--dir", "{tmp}/copy", "--once", "--timeout"],
    ["publish", "--hub", "http://127.0.0.1:1/", "--topic", "http://127.0.0.1:1/t", "--no-state",
     "--updated", "http://127.0.0.1:1/a", "--timeout"],
    ["source", "--dir", "{tmp}", "--base-url", "http://127.0.0.1:1/d/", "--hub", "http://127.0.0.1:1/",
     "--db", "{tmp}/../m.db", "--header-timeout"],
    ["admin", "--hub", "http://127.0.0.1:1/", "--timeout"],
])
def test_nan_and_inf_are_refused(tmp_path: Path, args, value) -> None:
    argv = [a.format(tmp=tmp_path) for a in args] + [value]
    if argv[0] == "admin":
        argv.append("overview")
    result = cli.run(*argv, timeout=30)
    assert result.returncode == 2, (argv, result.stderr)
    assert f"{value!r} is not a finite number" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "copy").exists() and not (tmp_path / "s.db").exists()
