"""`rsnotify inspect URL [--json]`: what a Source offers and which rules it breaks (subscriber/inspect.py).

Exit status: 0 nothing wrong found, 1 problems (listed), 2 usage error (URL not http(s)).
"""
from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING

import click

from rsnotify.errors import WireError
from rsnotify.websub import check_url

if TYPE_CHECKING:  # imported by the command: aiohttp and lxml are for a real inspection, not --help
    from .inspect import DocumentReport, Inspection


@click.command("inspect")
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout instead of text.")
def inspect(url: str, as_json: bool) -> None:
    """Show what the Source at URL offers: its Capability Lists, each capability's document
    (kind, at/completed or from/until, entries; indexes followed), the change-notification
    channel (topic, hubs), and every problem found on the way.

    URL may be the Source's base URL, its /.well-known/resourcesync, a Source Description, a
    Capability List or one of its lists.
    """
    try:
        url = check_url("URL", url)
    except WireError as exc:
        raise click.UsageError(str(exc)) from None
    from .inspect import inspect_source
    report = asyncio.run(inspect_source(url))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        for line in _lines(report):
            click.echo(line)
    sys.exit(1 if report.problems else 0)


def _lines(report: Inspection) -> list[str]:
    lines = [f"Source Description: {report.source_description or 'not found'}"]
    for listed in report.capability_lists:
        lines.append(f"Capability List: {listed.url}")
        lines.extend(f"  {_document_line(document)}" for document in listed.documents)
    if report.notes:
        lines.append(f"notes ({len(report.notes)}):")
        lines.extend(f"  - {note}" for note in report.notes)
    if report.problems:
        lines.append(f"problems ({len(report.problems)}):")
        lines.extend(f"  - {problem}" for problem in report.problems)
    else:
        lines.append("no problems found")
    return lines


def _document_line(document: DocumentReport) -> str:
    if document.topic is not None:
        return f"{document.capability}: topic {document.topic}, hub(s) {', '.join(document.hubs) or 'none'}"
    facts = [document.kind or "not read"]
    for name, value in (("at", document.at), ("completed", document.completed), ("from", document.from_),
                        ("until", document.until)):
        if value:
            facts.append(f"{name} {value}")
    if document.parts is not None:
        facts.append(f"{document.parts} list(s)")
    if document.entries is not None:
        facts.append(f"{document.entries} {'entry' if document.entries == 1 else 'entries'}")
    return f"{document.capability}: {document.url} ({', '.join(facts)})"
