"""`rsnotify validate FILE|URL...`: say what each ResourceSync document is and whether it is valid.

Exit status: 0 all valid, 1 any invalid (or not XML), 2 usage error (missing or unreadable
file, a URL that cannot be fetched). Bad input never produces a traceback.
"""
from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any

import click

from .errors import RsnotifyError

# The XML side (lxml) is imported when a document is checked, the HTTP client (aiohttp) when a
# URL is fetched: `rsnotify validate --help` needs neither, a local file no HTTP client.
if TYPE_CHECKING:
    from .documents import ParsedDocument

MAX_DOCUMENT_BYTES = 52_428_800   # a Sitemap document is at most 50 MiB
FETCH_SECONDS = 60.0
_FILES = click.Path(exists=True, dir_okay=False, readable=True, allow_dash=True)


class FileOrUrl(click.ParamType):
    """An http(s) URL as given, else an existing readable file (or `-`), as click.Path checks it."""

    name = "FILE|URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and _is_url(value):
            return value
        return _FILES.convert(value, param, ctx)


@click.command("validate")
@click.argument("files", nargs=-1, required=True, type=FileOrUrl(), metavar="FILE|URL...")
def validate(files: tuple[str, ...]) -> None:
    """Check ResourceSync documents (change notifications, Capability Lists, Source
    Descriptions, Resource/Change Lists, Dumps, indexes); `-` reads standard input, an
    http(s) URL is fetched.

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


def _is_url(value: str) -> bool:
    return value[:8].lower().startswith(("http://", "https://"))


def _read(path: str) -> bytes:
    if _is_url(path):
        return asyncio.run(_fetch(path))
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:  # raced away or unreadable after click's checks: still a usage error
        raise click.UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


async def _fetch(url: str) -> bytes:
    """The document at `url` (redirects followed, at most MAX_DOCUMENT_BYTES); UsageError otherwise."""
    import aiohttp

    from .bodies import bounded_chunks
    from .neterrors import describe_client_error

    timeout = aiohttp.ClientTimeout(total=FETCH_SECONDS)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
            if response.status != 200:
                raise click.UsageError(f"{url} answered {response.status}; expected 200")
            return b"".join([chunk async for chunk in bounded_chunks(response, MAX_DOCUMENT_BYTES, lambda _: (
                click.UsageError(f"{url} is larger than {MAX_DOCUMENT_BYTES} bytes, the Sitemap limit")))])
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        raise click.UsageError(f"cannot fetch {url}: {describe_client_error(exc)}") from None


def report(name: str, data: bytes) -> tuple[list[str], bool]:
    """The lines to print for one document and whether it is valid."""
    from .documents import parse_document
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
