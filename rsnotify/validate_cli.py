"""`rsnotify validate FILE...`: say what each ResourceSync document is and whether it is valid.

Exit status: 0 all valid, 1 any invalid (or not XML), 2 usage error (missing or unreadable
file). Bad input never produces a traceback.
"""
from __future__ import annotations

import sys

import click

from .documents import ParsedDocument, parse_document
from .errors import RsnotifyError


@click.command("validate")
@click.argument(
    "files",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, readable=True, allow_dash=True),
)
def validate(files: tuple[str, ...]) -> None:
    """Check ResourceSync documents (change notifications, Capability Lists, Source
    Descriptions, Resource/Change Lists, Dumps, indexes); `-` reads standard input.

    Prints `FILE: ok (<what>, N entries)` or the file's problems, one per line.
    """
    all_valid = True
    for path in files:
        name = "<stdin>" if path == "-" else path
        lines, is_valid = report(name, _read(path))
        for line in lines:
            click.echo(line)
        all_valid = all_valid and is_valid
    raise SystemExit(0 if all_valid else 1)


def _read(path: str) -> bytes:
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:  # raced away or unreadable after click's checks: still a usage error
        raise click.UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def report(name: str, data: bytes) -> tuple[list[str], bool]:
    """The lines to print for one document and whether it is valid."""
    try:
        document = parse_document(data)
    except RsnotifyError as exc:  # DocumentParseError, or any other complaint about the input
        return [f"{name}: {line}" for line in str(exc).splitlines()], False
    return _document_lines(name, document), document.is_valid


def _document_lines(name: str, document: ParsedDocument) -> list[str]:
    entries = f"{document.entries} {'entry' if document.entries == 1 else 'entries'}"
    if document.is_valid:
        lines = [f"{name}: ok ({document.description}, {entries})"]
    else:
        lines = [f"{name}: invalid {document.description} ({entries}):"]
        lines.extend(f"{name}: {problem}" for problem in document.problems)
    lines.extend(f"{name}: note: {note}" for note in document.notes)
    return lines
