"""`rsnotify publish` and `rsnotify capability-list add-channel`.

Exit codes of `publish`: 0 every notification accepted, 1 a hub refused or could not be
reached (its reason on stderr), 2 usage errors (bad option, bad change, invalid --file).
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import click

from rsnotify.clitypes import FiniteFloatRange
from rsnotify.datetimes import format_datetime
from rsnotify.notification import (
    FUTURE_SKEW,
    CapabilityList,
    ChangeType,
    ResourceChange,
)

from .changes import parse_change_option, parse_json_lines
from .errors import (
    CapabilityListError,
    ChangeInputError,
    PublishError,
    SettingsError,
    StateError,
)
from .settings import PublisherSettings

# The client (aiohttp) and the Capability List editing (lxml) are imported inside the commands
# that use them, so `rsnotify publish --help` and a usage error load neither.
if TYPE_CHECKING:
    from .client import Publisher
    from .receipt import Receipt

_CHANGE_OPTIONS = {f"--{change.value}": change for change in ChangeType}
DEFAULT_STATE_FILE = "publisher-memory.db"
_LEGACY_STATE_FILE = "publisher-state.json"  # the JSON chain file of older versions


def _default_state_path() -> str:
    folder = Path(click.get_app_dir("rsnotify"))
    path, legacy = folder / DEFAULT_STATE_FILE, folder / _LEGACY_STATE_FILE
    if legacy.exists() and not path.exists():
        os.replace(legacy, path)  # opening it carries the old chain into the change memory
    return str(path)


class _PublishCommand(click.Command):
    """Remembers the command-line order of --created/--updated/--deleted, which click's
    per-option tuples lose, so `--created X --deleted X` keeps its meaning."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["rsnotify.change_order"] = _change_order(args)
        return super().parse_args(ctx, args)


def _change_order(args: list[str]) -> list[tuple[ChangeType, str]]:
    order: list[tuple[ChangeType, str]] = []
    tokens = iter(args)
    for token in tokens:
        if token == "--":
            break
        name, equals, value = token.partition("=")
        if name in _CHANGE_OPTIONS:
            value = value if equals else next(tokens, "")
            order.append((_CHANGE_OPTIONS[name], value))
    return order


@click.command(cls=_PublishCommand)
@click.option("--hub", "hub_urls", multiple=True, required=True, metavar="URL", envvar="RSNOTIFY_HUB_URL",
              show_envvar=True, help="Hub to POST to; repeat for several hubs (each gets every notification).")
@click.option("--topic", "topic_url", required=True, metavar="URL", envvar="RSNOTIFY_TOPIC_URL", show_envvar=True,
              help="The topic URI (the change-notification channel).")
@click.option("--capability-list", "capability_list_url", metavar="URL", envvar="RSNOTIFY_CAPABILITY_LIST_URL",
              show_envvar=True, help="The Capability List: sent as Link rel=\"resourcesync\" and <rs:ln rel=\"up\">.")
@click.option("--token", metavar="T", envvar="RSNOTIFY_HUB_TOKEN", show_envvar=True,
              help="Bearer token the hub expects from this publisher.")
@click.option("--created", multiple=True, metavar="URI[@DATETIME]", help="A created resource (repeatable).")
@click.option("--updated", multiple=True, metavar="URI[@DATETIME]", help="An updated resource (repeatable).")
@click.option("--deleted", multiple=True, metavar="URI[@DATETIME]", help="A deleted resource (repeatable).")
@click.option("--file", "file", type=click.File("rb"), metavar="PATH",
              help="A change-notification XML document (validated, then sent as is) or JSON Lines of changes "
                   "({\"loc\", \"change\", \"datetime\", \"hash\", \"length\", \"type\"}); - for standard input.")
@click.option("--state", "state_path", metavar="PATH", envvar="RSNOTIFY_PUBLISH_STATE", show_envvar=True,
              help="The change memory (SQLite): the from/until chain, so consecutive publishes chain, and "
                   "every change published, for Change Lists "
                   f"[default: {click.get_app_dir('rsnotify')}/{DEFAULT_STATE_FILE}].")
@click.option("--no-state", is_flag=True, help="Keep no state: this publish starts at its first change.")
@click.option("--timeout", type=FiniteFloatRange(min=0, min_open=True), default=30.0, show_default=True,
              envvar="RSNOTIFY_PUBLISH_TIMEOUT", show_envvar=True, help="Seconds for one POST.")
@click.option("--attempts", "max_attempts", type=click.IntRange(min=1), default=5, show_default=True,
              envvar="RSNOTIFY_PUBLISH_ATTEMPTS", show_envvar=True,
              help="Tries per notification when the hub answers 5xx or cannot be reached.")
@click.option("--retry-delay", type=FiniteFloatRange(min=0), default=0.5, show_default=True,
              envvar="RSNOTIFY_PUBLISH_RETRY_DELAY", show_envvar=True,
              help="Seconds before the first retry; doubles with each retry.")
@click.option("--max-entries", type=click.IntRange(min=1), default=50_000, show_default=True,
              envvar="RSNOTIFY_MAX_ENTRIES", show_envvar=True, help="Resource changes per document.")
@click.option("--future-skew", type=FiniteFloatRange(min=0), default=FUTURE_SKEW, show_default=True,
              envvar="RSNOTIFY_FUTURE_SKEW", show_envvar=True,
              help="Seconds a change's datetime may lie ahead of this machine's clock; later ones are refused.")
@click.option("-v", "--verbose", is_flag=True, help="Log each attempt to stderr.")
@click.pass_context
def publish(
    ctx: click.Context,
    hub_urls: tuple[str, ...],
    topic_url: str,
    capability_list_url: str | None,
    token: str | None,
    created: tuple[str, ...],
    updated: tuple[str, ...],
    deleted: tuple[str, ...],
    file: BinaryIO | None,
    state_path: str | None,
    no_state: bool,
    timeout: float,
    max_attempts: int,
    retry_delay: float,
    max_entries: int,
    future_skew: float,
    verbose: bool,
) -> None:
    """Publish resource changes to a hub as change notifications.

    Each change gets the current time unless given as URI@DATETIME (a W3C datetime, e.g.
    https://example.org/a@2024-05-01T10:00:00Z). Prints one line per notification a hub
    accepted: its id, the hub, the number of changes and the interval. Exit 0 when all were
    accepted, 1 when a hub refused (its reason on stderr), 2 on usage errors.

    \b
    rsnotify publish --hub http://localhost:8080/ --topic https://example.org/changes/ \\
        --updated https://example.org/a --deleted https://example.org/b@2024-05-01T10:00:00Z
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    hubs = tuple(url for value in hub_urls for url in value.split())
    try:
        settings = PublisherSettings(
            hub_urls=hubs, topic_url=topic_url, capability_list_url=capability_list_url, token=token,
            timeout=timeout, max_attempts=max_attempts, retry_delay=retry_delay, max_entries=max_entries,
            future_skew=future_skew, state_path=None if no_state else (state_path or _default_state_path()),
        )
        from .client import (  # here: a usage error above loads no HTTP client
            Publisher,
            utc_now,
        )
        publisher = Publisher.from_settings(settings)
    except SettingsError as exc:
        raise click.UsageError(str(exc), ctx) from None
    except StateError as exc:  # the state file's contents: a data error, not a usage one
        raise click.ClickException(str(exc)) from None
    now = utc_now()
    document = _read_document(ctx, file, now) if file is not None else None
    changes = _option_changes(ctx, created, updated, deleted, now)
    if isinstance(document, bytes):
        if changes:
            raise click.UsageError("--file with an XML document is sent as is; it cannot be mixed with "
                                   "--created/--updated/--deleted", ctx)
        work = publisher.submit(document)
    else:
        changes += document or []
        if not changes:
            raise click.UsageError("nothing to publish: give --created/--updated/--deleted URIs or --file", ctx)
        work = publisher.publish_receipts(changes)
    asyncio.run(_run(ctx, publisher, work, settings.state_path))


async def _run(ctx: click.Context, publisher: Publisher, work: Awaitable[list[Receipt]],
               state_path: str | None) -> None:
    try:
        receipts = await work
    except ChangeInputError as exc:  # raised before anything is sent; the data is wrong, not the usage
        where = (f"\n(the topic's chain is kept in {state_path}: give later datetimes, or --state with "
                 "another file to start a new chain)") if state_path and "last notification" in str(exc) else ""
        raise click.ClickException(f"{exc}{where}") from None
    except PublishError as exc:
        for receipt in exc.accepted:
            _echo_receipt(receipt)
        if exc.unsent:
            click.echo(f"{len(exc.unsent)} change(s) were not published", err=True)
        raise click.ClickException(str(exc)) from None
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        await publisher.close()
    for receipt in receipts:
        _echo_receipt(receipt)


def _echo_receipt(receipt: Receipt) -> None:
    interval = ""
    if receipt.from_time and receipt.until_time:
        interval = f", {format_datetime(receipt.from_time)} to {format_datetime(receipt.until_time)}"
    click.echo(
        f"{receipt.notification_id or '-'} accepted by {receipt.hub_url} "
        f"({receipt.change_count} change{'s' if receipt.change_count != 1 else ''}{interval})"
    )


def _option_changes(
    ctx: click.Context, created: tuple[str, ...], updated: tuple[str, ...], deleted: tuple[str, ...], now: datetime
) -> list[ResourceChange]:
    order = ctx.meta.get("rsnotify.change_order", [])
    given = {ChangeType.CREATED: list(created), ChangeType.UPDATED: list(updated), ChangeType.DELETED: list(deleted)}
    if sorted(order) != sorted((change, value) for change, values in given.items() for value in values):
        order = [(change, value) for change, values in given.items() for value in values]  # e.g. from envvars
    problems: list[str] = []
    changes: list[ResourceChange] = []
    for change, value in order:
        try:
            changes.append(parse_change_option(change, value, now))
        except ChangeInputError as exc:
            problems.append(str(exc))
    if problems:
        raise click.UsageError("\n".join(problems), ctx)
    return changes


def _read_document(ctx: click.Context, file: BinaryIO, now: datetime) -> bytes | list[ResourceChange]:
    """The --file: XML bytes (validated) or the changes of a JSON Lines file."""
    name = getattr(file, "name", "-")
    data = file.read()
    if data.lstrip().startswith(b"<"):
        from .client import validate_document
        try:
            validate_document(data)  # the same validation `submit` applies
        except ChangeInputError as exc:
            raise click.ClickException(f"--file {name}: {exc}") from None
        return data
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"--file {name} is neither XML nor UTF-8 JSON Lines ({exc})") from None
    try:
        return parse_json_lines(text.splitlines(), now, source=name)
    except ChangeInputError as exc:
        raise click.ClickException(f"--file {exc}") from None


# -- capability-list -------------------------------------------------------------------------


@click.group()
def capability_list() -> None:
    """Produce or edit a Capability List that advertises a change-notification channel."""


@capability_list.command("add-channel")
@click.argument("caplist", metavar="CAPLIST.xml", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--topic", "topic_url", required=True, metavar="URL", envvar="RSNOTIFY_TOPIC_URL", show_envvar=True,
              help="The topic URI: the entry's <loc>.")
@click.option("--hub", "hub_urls", multiple=True, required=True, metavar="URL", envvar="RSNOTIFY_HUB_URL",
              show_envvar=True, help="The hub URI: an <rs:ln rel=\"hub\"> of the entry (repeatable).")
@click.option("--up", "up", metavar="URL",
              help="The Source Description's URL, to create CAPLIST.xml when it does not exist yet.")
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the result instead of editing the file.")
@click.pass_context
def add_channel(ctx: click.Context, caplist: str, topic_url: str, hub_urls: tuple[str, ...], up: str | None,
                to_stdout: bool) -> None:
    """Make CAPLIST.xml advertise exactly one change-notification channel (TOPIC served by HUB),
    keeping every other entry as it was. Edits the file in place unless --stdout (or - for
    standard input and output). A missing file is created when --up is given.

    \b
    rsnotify capability-list add-channel capabilitylist.xml \\
        --topic https://example.org/dataset1/change/ --hub https://hub.example.org/
    """
    from .advertise import add_channel_to_document, new_capability_list
    hubs = tuple(url for value in hub_urls for url in value.split())
    path = _edit_capability_list(ctx, caplist, up, to_stdout,
                                 lambda up_url: new_capability_list(up_url, topic_url, hubs),
                                 lambda data: add_channel_to_document(data, topic_url, hubs))
    if path is None:
        return
    click.echo(f"{path}: advertises {topic_url} via {', '.join(hubs)}")


@capability_list.command("set")
@click.argument("caplist", metavar="CAPLIST.xml", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--resourcelist", metavar="URL", help="The Resource List (or its index): the resourcelist entry.")
@click.option("--changelist", metavar="URL", help="The Change List (or its index): the changelist entry.")
@click.option("--topic", "topic_url", metavar="URL", envvar="RSNOTIFY_TOPIC_URL", show_envvar=True,
              help="The topic URI: the change-notification entry (needs --hub).")
@click.option("--hub", "hub_urls", multiple=True, metavar="URL", envvar="RSNOTIFY_HUB_URL", show_envvar=True,
              help="A hub of the topic: an <rs:ln rel=\"hub\"> of its entry (repeatable).")
@click.option("--up", "up", metavar="URL",
              help="The Source Description's URL, to create CAPLIST.xml when it does not exist yet.")
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the result instead of editing the file.")
@click.pass_context
def set_entries(ctx: click.Context, caplist: str, resourcelist: str | None, changelist: str | None,
                topic_url: str | None, hub_urls: tuple[str, ...], up: str | None, to_stdout: bool) -> None:
    """Make CAPLIST.xml list exactly one entry per capability given (resourcelist, changelist,
    change-notification), keeping every other entry as it was. Edits the file in place unless
    --stdout (or - for standard input and output). A missing file is created when --up is given.

    \b
    rsnotify capability-list set capabilitylist.xml \\
        --resourcelist https://example.org/dataset1/resourcelist.xml \\
        --changelist https://example.org/dataset1/changelist.xml \\
        --topic https://example.org/dataset1/changes --hub https://hub.example.org/
    """
    hubs = tuple(url for value in hub_urls for url in value.split())
    if topic_url is not None and not hubs:
        raise click.UsageError("--topic needs at least one --hub", ctx)
    if resourcelist is None and changelist is None and topic_url is None:
        raise click.UsageError("nothing to set: give --resourcelist, --changelist or --topic with --hub", ctx)
    from .advertise import (
        empty_capability_list,
        set_capabilities,
        set_capabilities_in_document,
    )
    wanted: dict[str, Any] = {"resourcelist": resourcelist, "changelist": changelist, "topic_url": topic_url, "hub_urls": hubs}
    path = _edit_capability_list(ctx, caplist, up, to_stdout,
                                 lambda up_url: set_capabilities(empty_capability_list(up_url), **wanted),
                                 lambda data: set_capabilities_in_document(data, **wanted))
    if path is None:
        return
    shown = {"resourcelist": resourcelist, "changelist": changelist, "change-notification": topic_url}
    click.echo(f"{path}: " + ", ".join(f"{name} {value}" for name, value in shown.items() if value))


def _edit_capability_list(ctx: click.Context, caplist: str, up: str | None, to_stdout: bool,
                          create: Callable[[str], CapabilityList], edit: Callable[[bytes], bytes]) -> Path | None:
    """Edit CAPLIST.xml with `edit` (its bytes in, the new document out), or build it with
    `create(up)` when the file does not exist; write it back in place, or print it for --stdout
    and `-`. Returns the file written, None when the result went to standard output."""
    path = None if caplist == "-" else Path(caplist)
    try:
        if path is not None and not path.exists():
            if not up:
                raise click.BadParameter(f"{caplist} does not exist; give --up SOURCE_DESCRIPTION_URL to create it",
                                         ctx, param_hint="CAPLIST.xml")
            from rsnotify.xml import capability_list_to_xml

            result = capability_list_to_xml(create(up))
        else:
            data = sys.stdin.buffer.read() if path is None else path.read_bytes()
            result = edit(data)
    except CapabilityListError as exc:
        raise click.BadParameter(str(exc), ctx, param_hint="CAPLIST.xml") from None
    except OSError as exc:
        raise click.BadParameter(f"cannot read {caplist}: {exc.strerror}", ctx, param_hint="CAPLIST.xml") from None
    if path is None or to_stdout:
        click.echo(result.decode("utf-8"), nl=False)
        return None
    _write_atomically(path, result)
    return path


def _write_atomically(path: Path, data: bytes) -> None:
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        if path.exists():
            os.chmod(temp, path.stat().st_mode & 0o777)
        os.replace(temp, path)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror}") from None
