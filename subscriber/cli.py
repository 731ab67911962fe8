"""`rsnotify subscribe`: a callback server that subscribes, renews, and prints notifications;
`rsnotify sync` / `sync status` / `audit`: a folder kept equal to a Source (subscriber.sync).

subscribe: one JSON object per line on stdout for each notification, written before the hub
gets its 2xx; status on stderr. Ctrl-C (SIGINT) or SIGTERM stops and keeps the subscription
(`--unsubscribe-on-exit` ends it, verified), exit 0; a second one stops at once.
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
import os
import select
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click

from rsnotify import eventloop
from rsnotify.clitypes import FiniteFloatRange
from rsnotify.copies import is_copy
from rsnotify.errors import WireError
from rsnotify.websub import check_url, idna_host

from .errors import DiscoveryError, SubscriberError
from .settings import CALLBACK_PATH, SubscriberSettings, parse_listen

# aiohttp (web and client), the callback core, the client, discovery, the subscription store
# and the sync engine are imported inside the commands that run them: `rsnotify sync --help`
# and the option checks that end in a usage error load none of them, and `rsnotify sync` no
# subscription store.
if TYPE_CHECKING:
    import aiohttp
    from aiohttp import web

    from .callback.receiver import ReceivedNotification
    from .client import Subscriber
    from .discovery import DiscoveredTopic
    from .store import Subscription, SubscriptionStore
    from .sync.runner import SyncCommand

log = logging.getLogger(__name__)

DEFAULT_STATE_FILE = "rsnotify-subscriber.db"


def _status(message: str) -> None:
    click.echo(f"rsnotify subscribe: {message}", err=True)


@click.command()
@click.option("--hub", metavar="URL", envvar="RSNOTIFY_SUBSCRIBER_HUB", show_envvar=True,
              help="Hub to subscribe at (with --topic). Without it, the hub is discovered from --topic.")
@click.option("--topic", metavar="URL", envvar="RSNOTIFY_SUBSCRIBER_TOPIC", show_envvar=True,
              help="Topic (channel) URL to subscribe to.")
@click.option("--capability-list", metavar="URL", envvar="RSNOTIFY_SUBSCRIBER_CAPABILITY_LIST", show_envvar=True,
              help="Capability List advertising a change-notification channel.")
@click.option("--source", metavar="URL", envvar="RSNOTIFY_SUBSCRIBER_SOURCE", show_envvar=True,
              help="Source base URL: channels found as `rsnotify sync --source` finds them (the URL, its "
                   "/.well-known/resourcesync or sourcedescription.xml, the host's well-known URL).")
@click.option("--listen", metavar="HOST:PORT", default="127.0.0.1:8081", envvar="RSNOTIFY_SUBSCRIBER_LISTEN",
              show_envvar=True, show_default=True, help="Where the callback server binds (port 0: any free port).")
@click.option("--callback-url", metavar="URL", envvar="RSNOTIFY_SUBSCRIBER_CALLBACK_URL", show_envvar=True,
              help=f"Public base URL of the callbacks [default: http://HOST:PORT{CALLBACK_PATH}].")
@click.option("--lease-seconds", type=click.IntRange(min=1), metavar="N", envvar="RSNOTIFY_SUBSCRIBER_LEASE_SECONDS",
              show_envvar=True, help="Lease to ask for; the hub may grant another.")
@click.option("--no-secret", is_flag=True, envvar="RSNOTIFY_SUBSCRIBER_NO_SECRET", show_envvar=True,
              help="Ask for unsigned deliveries (by default a random secret is used).")
@click.option("--state-file", metavar="PATH", default=DEFAULT_STATE_FILE, show_default=True,
              envvar="RSNOTIFY_SUBSCRIBER_STATE_FILE", show_envvar=True,
              help="Subscriptions, secrets and leases, kept across restarts (SQLite; a path ending in .json "
                   "keeps the older JSON file).")
@click.option("--unsubscribe-on-exit", is_flag=True, envvar="RSNOTIFY_SUBSCRIBER_UNSUBSCRIBE_ON_EXIT",
              show_envvar=True, help="Unsubscribe on Ctrl-C/SIGTERM (by default the subscription stays, so the "
                                     "hub keeps the notifications for the next start).")
@click.option("--verification-timeout", type=FiniteFloatRange(min=0.1), default=30.0, show_default=True,
              envvar="RSNOTIFY_SUBSCRIBER_VERIFICATION_TIMEOUT", show_envvar=True,
              help="Seconds to wait for the hub to verify a (un)subscription.")
@click.option("--mirror", metavar="DIR", envvar="RSNOTIFY_SUBSCRIBER_MIRROR", show_envvar=True,
              help="Keep a copy of the Source's resources in DIR: the same as `rsnotify sync --dir DIR --json` "
                   "(needs --source or --capability-list; its state is in DIR/.rsnotify, not --state-file).")
@click.option("-v", "--verbose", is_flag=True, help="Log each request and renewal on stderr.")
@click.option("--status", is_flag=True,
              help="Print the hub's view of each subscription in --state-file (signed diagnostics request) as "
                   "JSON lines, then exit: 0 when every hub answered, 1 otherwise.")
def subscribe(hub: str | None, topic: str | None, capability_list: str | None, source: str | None, listen: str,
              callback_url: str | None, lease_seconds: int | None, no_secret: bool, state_file: str,
              verification_timeout: float, mirror: str | None, verbose: bool, status: bool,
              unsubscribe_on_exit: bool) -> None:
    """Subscribe to a change-notification channel and print each notification as a JSON line.

    Give --hub and --topic, or --topic alone (WebSub discovery), or --capability-list, or
    --source. A notification is acknowledged once its line is written; when stdout is gone the
    hub is answered 503 and the command stops with exit 1. Ctrl-C or SIGTERM stops (a second
    one at once) and keeps the subscription unless --unsubscribe-on-exit; a restart resumes it.
    For a copy that stays equal to the Source, use `rsnotify sync`.
    """
    if status:
        from .diagnostics import print_status
        sys.exit(asyncio.run(print_status(state_file, _open_state(state_file), click.echo)))
    starts = [name for name, value in (("--topic", topic), ("--capability-list", capability_list),
                                       ("--source", source)) if value]
    if len(starts) != 1:
        raise click.UsageError("give exactly one of --topic (with or without --hub), --capability-list or "
                               f"--source; got {', '.join(starts) if starts else 'none'}")
    if hub and not topic:
        raise click.UsageError("--hub needs --topic")
    # Before anything binds a port or opens the state: a typo costs one line, not a server start.
    for option, value in (("--hub", hub), ("--topic", topic), ("--capability-list", capability_list),
                          ("--source", source), ("--callback-url", callback_url)):
        if value:
            try:
                check_url(option, value)
            except WireError as exc:
                raise click.UsageError(str(exc)) from None
    try:
        host, port = parse_listen(listen)
        settings = SubscriberSettings(listen_host=host, listen_port=port, callback_url=callback_url,
                                      state_file=state_file, lease_seconds=lease_seconds, use_secret=not no_secret,
                                      verification_timeout=verification_timeout)
    except SubscriberError as exc:
        raise click.BadParameter(str(exc)) from None
    logging.basicConfig(stream=sys.stderr, level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from rsnotify.neterrors import quiet_malformed_requests
    quiet_malformed_requests()
    if mirror:
        sys.exit(_mirror(Path(mirror), settings, unsubscribe_on_exit, verbose, topic=topic, source=source,
                         capability_list=capability_list))
    exit_code = eventloop.run(_run(settings, unsubscribe_on_exit, hub=hub, topic=topic,
                                 capability_list=capability_list, source=source))
    sys.exit(exit_code)


def _mirror(directory: Path, settings: SubscriberSettings, unsubscribe_on_exit: bool, verbose: bool, *,
            topic: str | None, source: str | None, capability_list: str | None) -> int:
    """`subscribe --mirror DIR`: `rsnotify sync --dir DIR --json` with this command's listen,
    callback, lease and secret choices; the sync engine keeps the copy (baseline, live, catch-up)."""
    if topic:
        raise click.UsageError("--mirror needs --source or --capability-list: it runs `rsnotify sync --dir DIR`, "
                               "which reads the Source's lists; got --topic")
    from .sync.runner import run_sync
    command = _sync_command(directory, source, capability_list, (), (), 16, True, verbose)
    command.prog = "rsnotify subscribe --mirror"
    command.unsubscribe_on_exit = unsubscribe_on_exit
    command.push = dataclasses.replace(settings, remembered_ids=50)
    return asyncio.run(run_sync(command, once=False))


def _open_state(state_file: str) -> SubscriptionStore:
    """The state at `state_file`; a SQLite file starts with the subscriptions of the JSON file
    older versions kept beside it (same name, .json), so an upgrade resumes them."""
    from .store import SqliteStore, open_store
    try:
        store = open_store(state_file)
        legacy = Path(state_file).with_suffix(".json")
        if isinstance(store, SqliteStore) and legacy.exists() and not asyncio.run(store.all()):
            count = store.import_json(legacy)
            _status(f"imported {count} subscription(s) from {legacy} into {state_file}")
    except SubscriberError as exc:
        raise click.ClickException(str(exc)) from None
    return store


def _stdout_gone() -> bool:
    """True when stdout is a pipe or socket whose reader has gone (poll reports an error)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLERR | select.POLLHUP)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError):
        return True


async def _run(settings: SubscriberSettings, unsubscribe_on_exit: bool, **start: str | None) -> int:
    from aiohttp import web

    from .callback.aiohttp_adapter import add_callback_routes
    from .callback.receiver import ACK_AFTER_HANDLER
    from .client import Subscriber

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    signals = {"count": 0, "stdout_gone": False}

    def on_signal() -> None:
        signals["count"] += 1
        if signals["count"] == 1:
            stop.set()
        elif main is not None:
            main.cancel()  # a second Ctrl-C: stop at once

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)
    store = _open_state(settings.state_file)

    async def on_notification(received: ReceivedNotification) -> None:
        # Runs before the hub gets its answer: a line that cannot be written is answered 503,
        # so the hub keeps the notification for the next start.
        if signals["stdout_gone"] or _stdout_gone():
            _lose_stdout(signals, stop)
            raise BrokenPipeError("stdout is gone")
        try:
            _print_notification(received)
        except (BrokenPipeError, OSError, ValueError):
            _lose_stdout(signals, stop)
            raise

    subscriber = Subscriber(store=store, settings=settings, on_notification=on_notification,
                            on_denial=_report_denial, ack=ACK_AFTER_HANDLER)
    logging.getLogger("rsnotify.subscriber.hooks").addFilter(_NoTracebackForClosedStdout())
    app = web.Application()
    route_path = urlsplit(settings.callback_url).path.rstrip("/") if settings.callback_url else CALLBACK_PATH
    add_callback_routes(app, subscriber.core, route_path)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    subscribed: list[Subscription] = []
    try:
        try:
            site = web.TCPSite(runner, settings.listen_host, settings.listen_port)
            await site.start()
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {settings.listen_host}:{settings.listen_port}: {exc}") from None
        subscriber.callback_base_url = settings.callback_url or _default_callback(runner, settings)
        _status(f"listening on {settings.listen_host}:{_bound_port(runner)}, callbacks under "
                f"{subscriber.callback_base_url}")
        await subscriber.start()
        starting = asyncio.create_task(_subscribe_all(subscriber, settings, subscribed, **start))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            _status("interrupted while subscribing")
        elif starting.exception() is not None:
            stopping.cancel()
            raise starting.exception()  # type: ignore[misc]
        else:
            await stop.wait()
        stopping.cancel()
        if unsubscribe_on_exit:
            code = await _unsubscribe_all(subscriber, subscribed)
        else:
            code = 0
            if subscribed:
                _status(f"stopped; the subscription stays (the hub keeps notifications for the next start; "
                        f"--unsubscribe-on-exit ends it), state in {settings.state_file}")
        return 1 if signals["stdout_gone"] else code
    except asyncio.CancelledError:
        _status("stopped at once; the subscription stays")
        return 1 if signals["stdout_gone"] else 0
    except SubscriberError as exc:
        if unsubscribe_on_exit:
            await _unsubscribe_all(subscriber, subscribed)
        raise click.ClickException(str(exc)) from None
    finally:
        await subscriber.close()
        await runner.cleanup()


async def _subscribe_all(subscriber: Subscriber, settings: SubscriberSettings, subscribed: list[Subscription],
                         hub: str | None, topic: str | None, capability_list: str | None,
                         source: str | None) -> None:
    channels = await _discover(subscriber.session, hub, topic, capability_list, source)
    problems = []
    for channel in channels:
        try:
            subscription = await _subscribe_channel(subscriber, settings, channel)
        except SubscriberError as exc:
            problems.append(str(exc))
            if len(channels) > 1:  # one channel's failure is the final error itself: said once
                _status(f"could not subscribe to {channel.topic}: {exc}")
            continue
        subscribed.append(subscription)
        _status(f"subscribed to {subscription.topic} at {subscription.hub} (lease {subscription.lease_seconds} s, "
                f"{'signed' if subscription.has_secret else 'unsigned'}); callback {subscription.callback}")
    if not subscribed:
        raise SubscriberError(problems[0] if len(problems) == 1 else "no subscription could be made: " + "; ".join(problems))


async def _discover(session: aiohttp.ClientSession, hub: str | None, topic: str | None,
                    capability_list: str | None, source: str | None) -> list[DiscoveredTopic]:
    from .discovery import (
        DiscoveredTopic,
        discover_capability_list,
        discover_topic,
        find_source,
    )
    if topic and hub:
        return [DiscoveredTopic(topic=topic, hubs=(hub,), found_in="command line", url=topic)]
    if topic:
        found = await discover_topic(session, topic)
        _status(f"discovered topic {found.topic} with hub(s) {', '.join(found.hubs)} ({found.found_in})")
        return [found]
    if capability_list:
        found_list = await discover_capability_list(session, capability_list)
    else:
        # found where `rsnotify sync --source` finds it (a base below the host root: its own
        # sourcedescription.xml, as `rsnotify source` serves it), not at the host's well-known URL only
        found_source = await find_source(session, str(source))
        found_list, problems = [], []
        for listed in found_source.capability_lists:
            try:
                found_list.extend(await discover_capability_list(session, listed))
            except DiscoveryError as exc:
                problems.append(str(exc))
        if not found_list:
            raise DiscoveryError(f"no change-notification channel found from {found_source.url}: "
                                 + ("; ".join(problems) or "it lists no Capability List"))
    for found in found_list:
        _status(f"discovered channel {found.topic} with hub(s) {', '.join(found.hubs)} in {found.capability_list}")
    return found_list


async def _subscribe_channel(subscriber: Subscriber, settings: SubscriberSettings,
                             channel: DiscoveredTopic) -> Subscription:
    """Resume this callback server's earlier subscription to the channel, else make a new one."""
    from .store import ACTIVE, EXPIRED
    base = str(subscriber.callback_base_url).rstrip("/") + "/"
    for existing in await subscriber.subscriptions():
        if (existing.topic == channel.topic and existing.hub in channel.hubs
                and existing.status in (ACTIVE, EXPIRED) and existing.callback.startswith(base)):
            _status(f"resuming the subscription to {existing.topic} from {settings.state_file}")
            return await subscriber.renew(existing, wait=True)
    problems = []
    for hub in channel.hubs:  # one hub is enough; try the next when one refuses
        try:
            return await subscriber.subscribe(channel.topic, hub, secret=settings.use_secret,
                                              discovered_from=channel.discovered_from,
                                              discovery=channel.discovery)
        except SubscriberError as exc:
            problems.append(str(exc))
    raise SubscriberError("; ".join(problems))


async def _unsubscribe_all(subscriber: Subscriber, subscribed: list[Subscription]) -> int:
    code = 0
    for subscription in subscribed:
        try:
            await subscriber.unsubscribe(subscription)
            _status(f"unsubscribed from {subscription.topic} at {subscription.hub}")
        except SubscriberError as exc:
            _status(f"could not unsubscribe from {subscription.topic}: {exc}")
            code = 1
    return code


def _print_notification(received: ReceivedNotification) -> None:
    line = received.to_json()
    sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
    sys.stdout.flush()
    for gap in received.gaps:
        _status(f"gap on {received.topic}: {gap.message}")
    for problem in received.problems:
        which = f"notification {received.notification_id}" if received.notification_id else "a notification"
        _status(f"{which} on {received.topic} is not a valid change notification: {problem}")


class _NoTracebackForClosedStdout(logging.Filter):
    """hooks.call_hook logs a handler failure with its traceback; a closed stdout is expected here
    (said once on stderr), so its records lose the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], BrokenPipeError):
            record.exc_info, record.exc_text = None, None
        return True


def _lose_stdout(signals: dict[str, Any], stop: asyncio.Event) -> None:
    if not signals["stdout_gone"]:
        signals["stdout_gone"] = True
        _status("stdout is gone: answering 503 (the hub keeps the notifications) and stopping")
        # Nothing more can be written there; spare the interpreter a failing flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    stop.set()


def _report_denial(subscription: Subscription) -> None:
    _status(f"hub {subscription.hub} denied the subscription to {subscription.topic}: "
            f"{subscription.denial_reason or 'no reason given'}")


def _bound_port(runner: web.AppRunner) -> int:
    return int(runner.addresses[0][1])


def _default_callback(runner: web.AppRunner, settings: SubscriberSettings) -> str:
    host = settings.listen_host
    if host in ("0.0.0.0", "::", ""):
        _status("listening on all addresses; the callback URL uses 127.0.0.1 (give --callback-url for a "
                "public one)")
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{_bound_port(runner)}{CALLBACK_PATH}"



# --- rsnotify sync / rsnotify sync status / rsnotify audit ------------------------------------

class HeaderLine(click.ParamType):
    """`Name: value` (sync/headers.py checks it); in RSNOTIFY_SYNC_HEADER, one per line."""

    name = "header"
    envvar_list_splitter = "\n"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        from .sync.headers import parse_header
        try:
            return parse_header(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _source_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option("--dir", "directory", metavar="DIR", envvar="RSNOTIFY_SYNC_DIR",
                           show_envvar=True, type=click.Path(file_okay=False, path_type=Path),
                           help="The local copy: files at DIR/<host>[_<port>]/<path>, state in DIR/.rsnotify/.")(command)
    command = click.option("--capability-list", metavar="URL", envvar="RSNOTIFY_SYNC_CAPABILITY_LIST",
                           show_envvar=True, help="The Source's Capability List.")(command)
    command = click.option("--source", metavar="URL", envvar="RSNOTIFY_SYNC_SOURCE", show_envvar=True,
                           help="The Source's base URL (its /.well-known/resourcesync is read).")(command)
    command = click.option("--allow-network", "allow_network", metavar="CIDR", multiple=True,
                           envvar="RSNOTIFY_SYNC_ALLOW_NETWORK", show_envvar=True,
                           help="Also fetch from this private/loopback network (the Source's own address is "
                                "always allowed). Repeatable.")(command)
    command = click.option("--allow-host", "allow_host", metavar="HOST", multiple=True,
                           envvar="RSNOTIFY_SYNC_ALLOW_HOST", show_envvar=True,
                           help="Also fetch (and delete) resources whose locs are on HOST (any port) or HOST:PORT "
                                "('*': any host; a non-ASCII HOST matches its IDNA form too). Repeatable.")(command)
    command = click.option("--concurrency", type=click.IntRange(1, 256), default=16, show_default=True,
                           envvar="RSNOTIFY_SYNC_CONCURRENCY", show_envvar=True,
                           help="Resource GETs in flight at most.")(command)
    command = click.option("--max-resource-size", "max_resource_size", metavar="SIZE", default="1GiB",
                           show_default=True, envvar="RSNOTIFY_SYNC_MAX_RESOURCE_SIZE", show_envvar=True,
                           help="A resource body longer than this is cut and refused (bytes, or with "
                                "K/M/G/KiB/MiB/GiB).")(command)
    command = click.option("--json", "json_events", is_flag=True,
                           help="One JSON object per event on stdout (with an \"event\" key).")(command)
    command = click.option("--header", "headers", metavar="'NAME: VALUE'", multiple=True, type=HeaderLine(),
                           envvar="RSNOTIFY_SYNC_HEADER", show_envvar=True,
                           help="Send this header to the Source's own origin (scheme, host, port of --source or "
                                "--capability-list), never to another host or after a redirect to one: e.g. an "
                                "access token. Repeatable; in the variable one per line, out of `ps`.")(command)
    command = click.option("--timeout", type=FiniteFloatRange(min=0, min_open=True), default=30.0, show_default=True,
                           envvar="RSNOTIFY_SYNC_TIMEOUT", show_envvar=True,
                           help="Seconds a request may take to connect, and between two reads of its answer.")(command)
    command = click.option("--rate", type=FiniteFloatRange(min=0, min_open=True), metavar="N",
                           envvar="RSNOTIFY_SYNC_RATE", show_envvar=True,
                           help="At most N requests a second to any one host (politeness) [default: no limit].")(command)
    command = click.option("--tries", type=click.IntRange(min=1), default=5, show_default=True,
                           envvar="RSNOTIFY_SYNC_TRIES", show_envvar=True,
                           help="Attempts per resource before it counts as failed (transient errors only).")(command)
    command = click.option("--exclude", "exclude", metavar="GLOB", multiple=True, envvar="RSNOTIFY_SYNC_EXCLUDE",
                           show_envvar=True,
                           help="Leave alone the resources whose path relative to the Source's base (the folder "
                                "of its Capability List; decoded, no leading '/'), a folder on that path, or whole "
                                "URL matches GLOB (fnmatch: '*.tmp', 'private/', 'http://host/tmp/*'): never fetched, "
                                "deleted or counted as a difference; copies made before stay as they are. "
                                "Repeatable.")(command)
    command = click.option("-v", "--verbose", is_flag=True, help="Log details on stderr.")(command)
    return command


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
               "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "t": 1000**4, "tb": 1000**4}


def _parse_size(value: str) -> int:
    """'1GiB', '500M', '4096' as bytes; click.BadParameter otherwise."""
    text = value.strip().lower().replace(" ", "")
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number):]
    try:
        size = int(float(number) * _SIZE_UNITS[unit])
    except (KeyError, ValueError):
        raise click.BadParameter(f"must be a size such as 1GiB, 500M or 4096, got {value!r}",
                                 param_hint="--max-resource-size") from None
    if size < 1:
        raise click.BadParameter(f"must be at least 1 byte, got {value!r}", param_hint="--max-resource-size")
    return size


def _parse_duration(text: str) -> float:
    from .sync.runner import (
        parse_duration,  # the sync engine, only when --audit-every is given
    )
    return parse_duration(text)


def _sync_command(directory: Path, source: str | None, capability_list: str | None, allow_network: tuple[str, ...],
                  allow_host: tuple[str, ...], concurrency: int, json_events: bool, verbose: bool,
                  headers: tuple[tuple[str, str], ...] = (), timeout: float = 30.0, tries: int = 5,
                  rate: float | None = None, max_resource_size: str = "1GiB", exclude: tuple[str, ...] = (),
                  **extra: Any) -> SyncCommand:
    if directory is None:
        raise click.UsageError("--dir DIR is required")
    if source and capability_list:
        raise click.UsageError("give --source or --capability-list, not both")
    if not source and not capability_list and not is_copy(directory):
        raise click.UsageError("give --source URL or --capability-list URL (DIR holds no earlier sync to resume)")
    for name, url in (("--source", source), ("--capability-list", capability_list)):
        if url and urlsplit(url).scheme not in ("http", "https"):
            raise click.BadParameter(f"must be an http(s) URL, got {url!r}", param_hint=name)
    if headers and not (source or capability_list):
        raise click.UsageError("--header needs --source or --capability-list: the origin its headers go to")
    from rsnotify.netguard import (
        parse_networks,  # here on: the checks above load no HTTP stack
    )
    try:
        networks = parse_networks(allow_network)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--allow-network") from None
    for pattern in exclude:
        if not pattern.strip() or "\x00" in pattern:
            raise click.BadParameter(f"must be a glob such as '*.tmp' or 'private/', got {pattern!r}",
                                     param_hint="--exclude")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from rsnotify.neterrors import quiet_malformed_requests
    quiet_malformed_requests()
    from .sync.context import SyncOptions
    from .sync.runner import SyncCommand as _SyncCommand
    options = SyncOptions(concurrency=concurrency, keep_deleted=extra.get("keep_deleted", False),
                          dry_run=extra.get("dry_run", False), max_resource_size=_parse_size(max_resource_size),
                          exclude=tuple(exclude))
    return _SyncCommand(directory, source, capability_list, options, networks, _allowed_hosts(allow_host),
                        json_events=json_events, headers=tuple(headers), timeout=timeout, tries=tries, rate=rate)


def _allowed_hosts(values: tuple[str, ...]) -> tuple[str, ...]:
    """--allow-host values, a non-ASCII host also in its IDNA form: a Source's locs name such a
    host as DNS does (xn--...), a person as they read it; either matches."""
    hosts: list[str] = []
    for value in values:
        hosts.append(value)
        host, colon, port = value.partition(":")
        if not host.isascii() and not value.startswith("["):
            try:
                hosts.append(idna_host("--allow-host", host, value) + colon + port)
            except WireError as exc:
                raise click.BadParameter(str(exc), param_hint="--allow-host") from None
    return tuple(hosts)


@click.group(invoke_without_command=True)
@_source_options
@click.option("--listen", metavar="HOST:PORT", envvar="RSNOTIFY_SYNC_LISTEN", show_envvar=True,
              help="Where the callback server binds [default: the address of the last run, else 127.0.0.1 "
                   "and any free port].")
@click.option("--callback-url", metavar="URL", envvar="RSNOTIFY_SYNC_CALLBACK_URL", show_envvar=True,
              help=f"Public base URL of the callbacks [default: http://HOST:PORT{CALLBACK_PATH}].")
@click.option("--once", is_flag=True, help="Baseline or catch up to the Source's lists, then exit: 0 in sync, "
                                            "1 differences or an unrecoverable gap, 3 Source unreachable.")
@click.option("--unsubscribe-on-exit", is_flag=True,
              help="Unsubscribe when stopped (by default the subscription stays, so the hub keeps "
                   "notifications for the next start).")
@click.option("--keep-deleted", is_flag=True, help="Keep files of resources that left the Resource List.")
@click.option("--dry-run", is_flag=True,
              help="With --once: list what the baseline or catch-up would fetch and delete (a line per resource "
                   "on stdout, `plan` events with --json) and the counts; nothing in DIR is written.")
@click.option("--poll-interval", type=FiniteFloatRange(min=1), default=60.0, show_default=True,
              envvar="RSNOTIFY_SYNC_POLL_INTERVAL", show_envvar=True,
              help="Seconds between pulls of the Source's Change List when push is silent or unavailable.")
@click.option("--lease-seconds", type=click.IntRange(min=1), metavar="N", envvar="RSNOTIFY_SYNC_LEASE_SECONDS",
              show_envvar=True, help="Lease to ask of the hub.")
@click.option("--audit-every", metavar="DURATION", envvar="RSNOTIFY_SYNC_AUDIT_EVERY", show_envvar=True,
              help="Audit the copy against the Resource List this often while live (90s, 15m, 6h, 1d): "
                   "`audit.done` events and `sync status`.")
@click.pass_context
def sync(ctx: click.Context, listen: str | None, callback_url: str | None, once: bool, unsubscribe_on_exit: bool,
         keep_deleted: bool, dry_run: bool, poll_interval: float, lease_seconds: int | None,
         audit_every: str | None, **common: Any) -> None:
    """Keep DIR equal to a Source: baseline, live notifications, catch-up after any gap.

    Without --once it runs until Ctrl-C or SIGTERM (exit 0) and keeps its subscription, so a
    restart picks up where it stopped. `rsnotify sync status --dir DIR` shows where it stands.
    """
    if ctx.invoked_subcommand is not None:
        return
    if dry_run and not once:
        raise click.UsageError("--dry-run needs --once")
    if audit_every is not None and once:
        raise click.UsageError("--audit-every runs audits while live; with --once run `rsnotify audit`")
    try:
        audit_seconds = _parse_duration(audit_every) if audit_every is not None else None
    except ValueError:
        raise click.BadParameter(f"expected a duration such as 90s, 15m, 6h or 1d, got {audit_every!r}",
                                 param_hint="--audit-every") from None
    command = _sync_command(keep_deleted=keep_deleted, dry_run=dry_run, **common)
    from .sync.engine import lock_holder
    from .sync.runner import quiet_exit_on_signals, run_sync, saved_listen
    command.unsubscribe_on_exit = unsubscribe_on_exit
    command.poll_interval = poll_interval
    command.audit_every = audit_seconds
    if not once:
        if callback_url is not None:
            # before the engine starts: a callback URL that is no absolute http(s) URL (a bare
            # word) reached aiohttp's router as a route path and ended in a traceback
            try:
                check_url("--callback-url", callback_url)
            except WireError as exc:
                raise click.BadParameter(str(exc), param_hint="--callback-url") from None
        saved = None if listen else saved_listen(command.root)
        listen = listen or saved or "127.0.0.1:0"
        try:
            host, port = parse_listen(listen)
            if saved and lock_holder(command.root) is None:   # a sync running there: the engine says so
                _check_saved_listen(host, port)
            command.push = SubscriberSettings(listen_host=host, listen_port=port, callback_url=callback_url,
                                              lease_seconds=lease_seconds, remembered_ids=50)
        except SubscriberError as exc:
            raise click.BadParameter(str(exc)) from None
    code = eventloop.run(run_sync(command, once=once))
    quiet_exit_on_signals(code)
    sys.exit(code)


def _check_saved_listen(host: str, port: int) -> None:
    """The last run's callback address is reused so the hub's subscription keeps its callback;
    when another program holds it now, the user did not choose it and needs the way out named."""
    try:
        with socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET):
            pass
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise click.ClickException(
                f"cannot listen on {host}:{port}, the callback address of the last run (kept so the hub's "
                f"subscription stays valid): {os.strerror(exc.errno)}; stop what holds it, or give --listen HOST:PORT "
                "to subscribe with a new callback") from None


@sync.command("status")
@click.option("--dir", "directory", metavar="DIR", required=True, type=click.Path(file_okay=False, path_type=Path),
              envvar="RSNOTIFY_SYNC_DIR", show_envvar=True, help="The synced folder.")
@click.option("--json", "json_out", is_flag=True, help="One JSON object instead of text.")
def sync_status(directory: Path, json_out: bool) -> None:
    """Where the copy in DIR stands: state, high-water mark and lag, resources by state, last runs."""
    from .sync.runner import format_status, status_of
    info = status_of(directory)
    if info is None:
        raise click.ClickException(f"{directory} holds no sync state ({directory}/.rsnotify/state.db); "
                                   "start one with rsnotify sync")
    click.echo(json.dumps(info, default=str) if json_out else format_status(info))


@click.command()
@_source_options
@click.option("--deep", is_flag=True, help="Re-hash every file (finds local edits and bit rot).")
@click.option("--repair", is_flag=True, help="Fetch missing and changed resources, delete extra tracked ones.")
def audit(deep: bool, repair: bool, **common: Any) -> None:
    """Compare DIR with the Source's current Resource List: exit 0 in sync, 1 differences,
    2 usage, 3 Source unreachable, 130 interrupted (Ctrl-C; 143 for SIGTERM). Works beside a
    running `rsnotify sync` (read-only); with --repair the running sync does the repair and
    this waits for its answer."""
    from .sync.runner import quiet_exit_on_signals, run_audit
    command = _sync_command(**common)
    code = eventloop.run(run_audit(command, deep=deep, repair=repair))
    quiet_exit_on_signals(code)
    sys.exit(code)
