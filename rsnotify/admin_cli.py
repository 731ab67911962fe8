"""`rsnotify admin`: look after a running hub from a terminal, through its admin HTTP API.

Reads and prints what the status page shows (overview, topics, subscriptions, dead letters) as
a table, or the API's JSON with --json; acts on subscriptions (retry now, pause, resume, re-send
dead letters). The admin token comes from RSNOTIFY_ADMIN_TOKEN. Exit status: 0 done, 1 the hub
refused or could not be reached (its reason is printed), 2 a usage error.
"""
from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from .clitypes import FiniteFloatRange

if TYPE_CHECKING:  # Admin.run imports the client (aiohttp) when a subcommand talks to the hub
    from .admin_client import AdminClient

DEFAULT_HUB = "http://127.0.0.1:8080/"   # where `rsnotify hub` listens by default
CELL_WIDTH = 60                          # long URLs are shortened in tables (--json keeps them whole)
SID = re.compile(r"[0-9a-f]{32}")
NOTIFICATION_ID = re.compile(r"\d+-\d+")


# --- options and the shared context ---------------------------------------------------------


def _sid(ctx: click.Context, param: click.Parameter, values: Any) -> Any:
    for value in values if isinstance(values, tuple) else (values,):
        if not SID.fullmatch(value):
            raise click.BadParameter(f"a subscription id is 32 lower-case hex digits (as `rsnotify admin "
                                     f"subscriptions` lists them), got {value!r}")
    return values


def _nid(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not NOTIFICATION_ID.fullmatch(value):
        raise click.BadParameter(f"a notification id looks like 1700000000000-0, got {value!r}")
    return value


def _hub_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise click.BadParameter(f"the hub's URL starts with http:// or https://, got {value!r}")
    return value


class Admin:
    """What every subcommand needs: where the hub is, how to authenticate, how to print."""

    def __init__(self, hub_url: str, token: str | None, as_json: bool, timeout: float) -> None:
        self.hub_url, self.token, self.as_json, self.timeout = hub_url, token, as_json, timeout

    def run(self, call: Callable[[AdminClient], Awaitable[Any]]) -> Any:
        """Run one conversation with the hub; its refusals become a one-line error (exit 1)."""
        from .admin_client import AdminClient, AdminError

        async def converse() -> Any:
            async with AdminClient(self.hub_url, token=self.token, timeout=self.timeout) as client:
                return await call(client)

        try:
            return asyncio.run(converse())
        except AdminError as exc:
            hint = ""
            if exc.status == 401:
                hint = " (set RSNOTIFY_ADMIN_TOKEN to the hub's admin token)"
            elif exc.status is None:
                hint = " (is the hub running? point --hub or RSNOTIFY_HUB_URL at it)"
            raise click.ClickException(f"{exc}{hint}") from None

    def emit(self, data: Any, render: Callable[[Any], str]) -> None:
        click.echo(json.dumps(data, indent=2, sort_keys=True) if self.as_json else render(data))


def _json_here(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(Admin).as_json = True


def pass_admin(command: Callable[..., Any]) -> Callable[..., Any]:
    """Hand the command the group's Admin, and take --json after the command's name too: users
    type `rsnotify admin subscriptions --trouble --json` as often as `admin --json subscriptions`."""
    passing = click.make_pass_decorator(Admin)(command)
    return click.option("--json", "json_here", is_flag=True, expose_value=False, callback=_json_here,
                        help="Print the API's JSON instead of a table.")(passing)


@click.group("admin", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--hub", "hub_url", metavar="URL", default=DEFAULT_HUB, show_default=True, envvar="RSNOTIFY_HUB_URL",
              show_envvar=True, callback=_hub_url, help="The hub's URL (its --public-url); the admin API is under admin/.")
@click.option("--token", metavar="TOKEN", envvar="RSNOTIFY_ADMIN_TOKEN", show_envvar=True,
              help="The hub's admin token. Prefer the environment variable: a flag shows in `ps` and "
                   "shell history. Without one, only a hub on this machine without a token answers.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead of a table.")
@click.option("--timeout", type=FiniteFloatRange(min=0.1), default=10.0, show_default=True, metavar="SECONDS",
              help="How long to wait for the hub's answer.")
@click.pass_context
def admin(ctx: click.Context, hub_url: str, token: str | None, as_json: bool, timeout: float) -> None:
    """Inspect and repair a running hub through its admin API.

    \b
    rsnotify admin overview                   totals, queues, workers, trouble
    rsnotify admin subscriptions --trouble    what needs a look, and why
    rsnotify admin retry SID                  deliver again now, skipping the backoff
    rsnotify admin dead-letters resend SID    queue its dead letters again
    """
    ctx.obj = Admin(hub_url, token or None, as_json, timeout)


# --- reading ---------------------------------------------------------------------------------


@admin.command(short_help="Totals, queues, workers and trouble.")
@pass_admin
def overview(admin: Admin) -> None:
    """Totals, deliveries, latency, queues, workers, and the subscriptions in trouble."""
    admin.emit(admin.run(lambda client: client.overview()), render_overview)


@admin.command(short_help="Topics and what was published.")
@click.option("--url", metavar="URL", help="Only the topic with this URL.")
@click.option("--search", metavar="TEXT", help="Only topics whose URL holds TEXT.")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@pass_admin
def topics(admin: Admin, url: str | None, search: str | None, offset: int, limit: int) -> None:
    """The hub's topics: notifications published, subscriptions, last publish."""
    data = admin.run(lambda client: client.topics(url=url, search=search, offset=offset, limit=limit))
    admin.emit(data, lambda d: render_table(
        d["topics"], [("TOPIC ID", "tid"), ("PUBLISHED", "published"), ("SUBSCRIPTIONS", "subscriptions"),
                      ("LAST PUBLISHED", lambda r: utc(r["last_published_ms"] / 1000)), ("URL", "url")],
        total=d["total"], offset=d["offset"], noun="topic"))


@admin.command(short_help="Subscriptions, their state and trouble.")
@click.option("--trouble", is_flag=True, help="Only subscriptions that need a look (retrying, dead letters, "
                                               "paused, stalled, lease ending).")
@click.option("--state", type=click.Choice(["active", "paused", "expired"]), help="Only subscriptions in this state.")
@click.option("--topic", metavar="URL", help="Only subscriptions to this topic.")
@click.option("--callback", metavar="URL", help="With --topic: the one subscription of this callback.")
@click.option("--search", metavar="TEXT", help="Only subscriptions whose topic or callback URL holds TEXT.")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@pass_admin
def subscriptions(admin: Admin, trouble: bool, state: str | None, topic: str | None, callback: str | None,
                  search: str | None, offset: int, limit: int) -> None:
    """Subscriptions with their state, backlog, dead letters and what is wrong."""
    if callback and not topic:
        raise click.UsageError("--callback needs --topic: a subscription is a topic and a callback")
    data = admin.run(lambda client: client.subscriptions(topic=topic, callback=callback, state=state,
                                                         trouble=trouble, search=search, offset=offset,
                                                         limit=limit))
    admin.emit(data, lambda d: render_table(d["subscriptions"], SUBSCRIPTION_COLUMNS, total=d["total"],
                                            offset=d["offset"], noun="subscription"))


@admin.command(short_help="Everything about one subscription.")
@click.argument("sid", callback=_sid)
@pass_admin
def subscription(admin: Admin, sid: str) -> None:
    """Everything about one subscription: lease, backlog, last attempts, dead letters."""
    admin.emit(admin.run(lambda client: client.subscription(sid)), render_subscription)


@admin.group("dead-letters", short_help="List or re-send dead letters.")
def dead_letters() -> None:
    """List a subscription's dead letters, or queue them to be sent again."""


@dead_letters.command("list")
@click.argument("sid", callback=_sid)
@pass_admin
def list_dead_letters(admin: Admin, sid: str) -> None:
    """The notifications SID's callback never took, oldest first."""
    data = admin.run(lambda client: client.dead_letters(sid))
    admin.emit(data, lambda d: render_table(d["dead_letters"], DEAD_LETTER_COLUMNS, noun="dead letter"))


@dead_letters.command("resend")
@click.argument("sid", callback=_sid)
@click.argument("notification_id", required=False, callback=_nid)
@pass_admin
def resend(admin: Admin, sid: str, notification_id: str | None) -> None:
    """Queue SID's dead letters (or only NOTIFICATION_ID) to be delivered again, in order."""
    data = admin.run(lambda client: client.resend(sid, notification_id))
    if notification_id:
        admin.emit(data, lambda d: f"{sid}: dead letter {notification_id} "
                   + ("was already queued" if d.get("already_queued") else "queued for re-sending"))
    else:
        admin.emit(data, lambda d: f"{sid}: {d['queued']} dead letter(s) queued for re-sending")


# --- acting ----------------------------------------------------------------------------------


@admin.command(short_help="Deliver again now, skipping the backoff.")
@click.argument("sids", nargs=-1, required=True, callback=_sid, metavar="SID...")
@pass_admin
def retry(admin: Admin, sids: tuple[str, ...]) -> None:
    """Deliver to SID again now instead of waiting out its retry backoff."""
    async def retry_all(client: AdminClient) -> list[dict[str, Any]]:
        done = []
        for sid in sids:
            found = await client.subscription(sid)
            if found["state"] == "paused":
                raise click.ClickException(f"subscription {sid} is paused: `rsnotify admin resume {sid}` "
                                           "starts its deliveries again")
            done.append(await client.retry(sid))
        return done

    data = admin.run(retry_all)
    admin.emit(data, lambda d: "\n".join(f"{row['sid']}: next delivery attempt now" for row in d))


@admin.command(short_help="Stop deliveries until resumed.")
@click.argument("sids", nargs=-1, required=True, callback=_sid, metavar="SID...")
@pass_admin
def pause(admin: Admin, sids: tuple[str, ...]) -> None:
    """Stop deliveries to SID until resumed; its place in the topic's log is kept."""
    _set_state(admin, sids, "pause")


@admin.command(short_help="Start deliveries again, now.")
@click.argument("sids", nargs=-1, required=True, callback=_sid, metavar="SID...")
@pass_admin
def resume(admin: Admin, sids: tuple[str, ...]) -> None:
    """Start deliveries to SID again, now."""
    _set_state(admin, sids, "resume")


def _set_state(admin: Admin, sids: Sequence[str], action: str) -> None:
    async def act(client: AdminClient) -> list[dict[str, Any]]:
        return [await (client.pause(sid) if action == "pause" else client.resume(sid)) for sid in sids]

    data = admin.run(act)
    admin.emit(data, lambda d: "\n".join(f"{row['sid']}: {'paused' if action == 'pause' else 'active'}" for row in d))


# --- rendering -------------------------------------------------------------------------------

Column = tuple[str, Any]   # heading, and a key of the row or a function of the row

SUBSCRIPTION_COLUMNS: list[Column] = [
    ("SUBSCRIPTION ID", "sid"), ("STATE", "state"), ("BACKLOG", "backlog"), ("DEAD", "dead_letters"),
    ("LAST", lambda r: r["last_status"] or r["last_outcome"] or "-"),
    ("CALLBACK", "callback"), ("TROUBLE", lambda r: r.get("problem") or "; ".join(r.get("trouble") or []) or "-"),
]
DEAD_LETTER_COLUMNS: list[Column] = [
    ("NOTIFICATION ID", "notification_id"), ("SEQ", "sequence"), ("ATTEMPTS", "attempts"),
    ("LAST", lambda r: r["status"] or r["error"] or "-"), ("DEAD SINCE", lambda r: utc(r["dead_at"])),
    ("RESEND", lambda r: "queued" if r.get("resend") else "-"),
]
ATTEMPT_COLUMNS: list[Column] = [
    ("AT", lambda r: utc(r["at"])), ("NOTIFICATION ID", "notification_id"), ("ATTEMPT", "attempt"),
    ("OUTCOME", "outcome"), ("STATUS", lambda r: r["status"] or "-"),
    ("MS", lambda r: f"{r['latency_ms']:.0f}" if r.get("latency_ms") else "-"), ("ERROR", lambda r: r["error"] or "-"),
]


WORKER_COLUMNS: list[Column] = [
    ("WORKER", "name"), ("HOST", "host"), ("PID", "pid"), ("LAST SEEN", lambda r: utc(r.get("last_seen"))),
    ("CLAIMS", "claims"), ("SLOTS", "slots"), ("FOLLOWING", "following"),
]


def utc(epoch_seconds: float | None) -> str:
    """A time as operators compare it across machines: UTC, with the zone written out."""
    if not epoch_seconds:
        return "-"
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cell(value: Any) -> str:
    text = "-" if value is None or value == "" else str(value)
    text = " ".join(text.split())    # one line per row, whatever a subscriber answered
    return text if len(text) <= CELL_WIDTH else text[:CELL_WIDTH - 1] + "…"


def render_table(rows: list[dict[str, Any]], columns: list[Column], *, total: int | None = None,
                 offset: int = 0, noun: str = "row") -> str:
    if not rows:
        return f"no {noun}s" + (f" (offset {offset} of {total})" if total and offset else "")
    cells = [[_cell(get(row) if callable(get) else row.get(get)) for _, get in columns] for row in rows]
    widths = [max(len(heading), *(len(line[i]) for line in cells)) for i, (heading, _) in enumerate(columns)]
    lines = ["  ".join(h.ljust(w) for (h, _), w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells]
    if total is not None and (offset or total > len(rows)):
        lines.append(f"({offset + 1}-{offset + len(rows)} of {total} {noun}s; --offset for more)")
    return "\n".join(lines)


def _pairs(values: dict[str, Any]) -> str:
    return " · ".join(f"{k} {v}" for k, v in sorted(values.items())) or "none yet"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"≤ {value * 1000:.0f} ms" if value < 1 else f"≤ {value:g} s"


def render_overview(o: dict[str, Any]) -> str:
    states = o.get("subscriptions_by_state", {})
    latency = o.get("publish_to_delivery_seconds", {})
    queues = o.get("queues", {})
    workers = queues.get("workers")
    lines = [
        ("hub", o.get("hub_url", "-")),
        ("time", utc(o.get("now"))),
        ("topics", o.get("topics", 0)),
        ("subscriptions", f"{o.get('subscriptions', 0)} ({_pairs(states)})"),
        ("published", f"{o.get('published', 0)} in all, {o.get('published_last_hour', 0)} in the last hour"),
        ("deliveries", _pairs(o.get("deliveries", {}))),
        ("answers", _pairs(o.get("status_classes", {}))),
        ("publish→delivery", f"p50 {_seconds(latency.get('p50'))}, p95 {_seconds(latency.get('p95'))}"),
        ("backlog", f"{o.get('backlog', 0)} notification(s) waiting, {o.get('dead_letters', 0)} dead letter(s)"),
        ("queue", (f"{queues.get('queued', 0)} queued, {queues.get('started', 0)} running, "
                   f"{queues.get('waiting_retries', 0)} retries waiting ({queues.get('due_now', 0)} due), "
                   f"{queues.get('failed', 0)} failed jobs")),
        ("workers", len(workers) if isinstance(workers, list) else (workers if workers is not None else "-")),
    ]
    width = max(len(k) for k, _ in lines)
    text = "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines)
    if o.get("workers"):
        text += "\n\n" + render_table(o["workers"], WORKER_COLUMNS, noun="worker")
    trouble = o.get("trouble", [])
    count = o.get("trouble_count", len(trouble))
    if not count:
        return text + "\n\nno subscription needs a look"
    shown = f" (first {len(trouble)}; `rsnotify admin subscriptions --trouble` lists all)" if count > len(trouble) else ""
    return (text + f"\n\n{count} subscription(s) need a look{shown}:\n"
            + render_table(trouble, SUBSCRIPTION_COLUMNS, noun="subscription"))


def render_subscription(s: dict[str, Any]) -> str:
    lines = [
        ("subscription", s["sid"]), ("topic", s["topic"]), ("callback", s["callback"]),
        ("state", s["state"]),
        ("lease", f"ends {utc(s['expires'])}" + (" (ended)" if s.get("expires_in", 0) < 0 else "")),
        ("delivered", s.get("delivered", 0)), ("backlog", s.get("backlog", 0)),
        ("dead letters", s.get("dead_letters", 0)),
        ("last attempt", f"{utc(s.get('last_attempt_at'))}: {s.get('last_outcome') or '-'} "
                         f"{s.get('last_status') or s.get('last_error') or ''}".rstrip()),
        ("next attempt", utc(s.get("next_attempt"))),
        ("trouble", "; ".join(s.get("trouble") or []) or "none"),
    ]
    width = max(len(k) for k, _ in lines)
    text = "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines)
    if s.get("attempts_recent"):
        text += "\n\nfailed attempts, newest first:\n" + render_table(s["attempts_recent"], ATTEMPT_COLUMNS, noun="attempt")
    if s.get("dead_letters_list"):
        text += "\n\ndead letters:\n" + render_table(s["dead_letters_list"], DEAD_LETTER_COLUMNS, noun="dead letter")
    return text
