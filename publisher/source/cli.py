"""`rsnotify source`: serve a folder as a ResourceSync Source and publish its changes.

Exit codes: 0 stopped with Ctrl-C / SIGTERM, 1 the hub cannot be reached at start, names
itself by another URL than --hub, the change memory cannot be opened or another `rsnotify
source` holds it, or the listen address is taken, 2 usage errors (no such folder, a base URL that is not http(s)).
"""
from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import socket
from pathlib import Path
from typing import IO, TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

import click

from rsnotify import eventloop
from rsnotify.clitypes import FiniteFloatRange
from rsnotify.filelocks import lock_or_holder, write_holder
from rsnotify.websub import normalize_url

from ..errors import SettingsError, StateError

# The Source's machinery (aiohttp, the change memory, the folder watcher, lxml) is imported when
# the command runs, so `rsnotify source --help` loads none of it.
if TYPE_CHECKING:
    import aiohttp

    from .server import Source

log = logging.getLogger(__name__)
_HUB_CHECK_SECONDS = 10.0
_MAX_RETRY_SECONDS = 10.0  # a hub back from downtime gets what waited within this


@click.command()
@click.option("--dir", "src", required=True, metavar="SRC", envvar="RSNOTIFY_SOURCE_DIR", show_envvar=True,
              help="The folder whose files are the Source's resources.")
@click.option("--base-url", required=True, metavar="URL", envvar="RSNOTIFY_SOURCE_BASE_URL", show_envvar=True,
              help="The URL the folder is served under (http or https); documents live beside the files.")
@click.option("--hub", "hub_urls", multiple=True, required=True, metavar="HUB_URL", envvar="RSNOTIFY_HUB_URL",
              show_envvar=True, help="Hub to publish change notifications to (repeatable).")
@click.option("--listen", metavar="HOST:PORT", envvar="RSNOTIFY_SOURCE_LISTEN", show_envvar=True,
              help="Address to serve on [default: the base URL's host and port].")
@click.option("--token", metavar="T", envvar="RSNOTIFY_HUB_TOKEN", show_envvar=True,
              help="Bearer token the hub expects from this publisher.")
@click.option("--db", "db_path", metavar="PATH", envvar="RSNOTIFY_SOURCE_DB", show_envvar=True,
              help="The change memory (SQLite) [default: a file per SRC in the rsnotify app folder].")
@click.option("--rotate", "rotate_seconds", type=FiniteFloatRange(min=0, min_open=True), default=86_400.0,
              show_default=True, envvar="RSNOTIFY_SOURCE_ROTATE", show_envvar=True,
              help="Seconds after which the open Change List is closed at the next notification.")
@click.option("--keep", "keep_days", type=FiniteFloatRange(min=0, min_open=True), envvar="RSNOTIFY_SOURCE_KEEP",
              show_envvar=True, help="Days closed Change Lists stay listed [default: all are kept].")
@click.option("--exclude", "excludes", multiple=True, metavar="GLOB", envvar="RSNOTIFY_SOURCE_EXCLUDE",
              show_envvar=True, help="Leave out files and folders matching GLOB by name or by path in SRC "
                                     "(repeatable), besides hidden ones, editor scratch (*~, *.swp, #*#) and "
                                     "VCS folders, which are always left out.")
@click.option("--include-hidden", is_flag=True, envvar="RSNOTIFY_SOURCE_INCLUDE_HIDDEN", show_envvar=True,
              help="Serve hidden files and folders (.*) too; VCS folders and editor scratch stay out.")
@click.option("--header-timeout", type=FiniteFloatRange(min=0, min_open=True), default=15.0, show_default=True,
              envvar="RSNOTIFY_SOURCE_HEADER_TIMEOUT", show_envvar=True,
              help="Seconds a client has to send a request's headers, and an idle connection stays open.")
@click.option("--body-timeout", type=FiniteFloatRange(min=0, min_open=True), default=60.0, show_default=True,
              envvar="RSNOTIFY_SOURCE_BODY_TIMEOUT", show_envvar=True,
              help="Seconds a client has to send a request's body (408 beyond).")
@click.option("--write", "write_dir", metavar="OUT", is_flag=False, flag_value="", envvar="RSNOTIFY_SOURCE_WRITE",
              show_envvar=True, help="Write the documents into OUT [default: SRC] for a web server to serve; serve nothing.")
@click.option("--once", is_flag=True, help="With --write: scan, write, publish, then exit (cron, post-commit hook).")
@click.option("-v", "--verbose", is_flag=True, help="Log debug details too.")
@click.pass_context
def source(ctx: click.Context, src: str, base_url: str, hub_urls: tuple[str, ...], listen: str | None,
           token: str | None, db_path: str | None, rotate_seconds: float, keep_days: float | None,
           excludes: tuple[str, ...], include_hidden: bool, header_timeout: float, body_timeout: float,
           write_dir: str | None, once: bool, verbose: bool) -> None:
    """Serve the files of SRC under URL as a ResourceSync Source, and publish every change.

    Serves the files, the Source Description, the Capability List, the Resource List, the
    Change List and the topic URI (<URL>changes). Scans SRC at start against the change
    memory (so offline edits are published), then follows it. Changes are recorded, then
    sent to the hub through an outbox that retries while the hub is down.

    \b
    rsnotify source --dir ./data --base-url http://127.0.0.1:8000/dataset1/ --hub http://127.0.0.1:8080/

    With --write the documents are written as files for the web server that already serves
    SRC under URL (see the README for nginx and Apache); with --once as well, the command
    exits after one scan: 0 published, 1 a notification still waits in the outbox.
    """
    from rsnotify.neterrors import quiet_malformed_requests

    from ..client import Publisher
    from ..memory.store import ChangeMemory, ListPolicy
    from ..outbox import Outbox
    from . import static_cli
    from .folder import Exclusions, Folder
    from .server import RESERVED_NAMES, Source, SourceUrls

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_malformed_requests()
    logging.getLogger("watchfiles").setLevel(logging.DEBUG if verbose else logging.WARNING)  # one line per event otherwise
    folder_path = Path(src)
    if not folder_path.is_dir():
        raise click.BadParameter(f"{src} is not a folder", ctx, param_hint="--dir")
    base = _check_base_url(ctx, base_url)
    host, port = _listen_address(ctx, listen, base)
    hubs = tuple(url for value in hub_urls for url in value.split())
    urls = SourceUrls(base)
    memory_path = Path(db_path) if db_path else _default_db(folder_path)
    if _is_inside(memory_path, folder_path):
        raise click.BadParameter(f"{memory_path} is inside SRC; the change memory must live elsewhere", ctx, param_hint="--db")
    if once and write_dir is None:
        raise click.UsageError("--once needs --write: a served Source runs until stopped", ctx)
    out = static_cli.check_out(ctx, write_dir, folder_path, memory_path) if write_dir is not None else None
    policy = ListPolicy(rotate_seconds=rotate_seconds, keep_seconds=keep_days * 86_400 if keep_days else None)
    _held = _hold_memory(memory_path)   # released when the process ends, however it ends
    try:
        memory = ChangeMemory(memory_path, policy)
    except StateError as exc:
        # a --db in a folder that cannot be made or written: the user's to fix, not a traceback
        raise click.ClickException(str(exc)) from None
    try:
        publisher = Publisher(hubs, urls.topic, urls.capability_list, token, memory=memory)
    except (SettingsError, StateError) as exc:
        memory.close()
        raise click.UsageError(str(exc), ctx) from None
    problem = asyncio.run(_hub_problem(hubs))
    if problem:
        memory.close()
        raise click.ClickException(problem)
    exclusions = Exclusions(excludes, include_hidden)
    if out is not None:
        outbox = Outbox(memory_path, publisher, max_retry_delay=_MAX_RETRY_SECONDS, autostart=not once)
        try:
            static_cli.run(folder_path, urls, publisher, outbox, memory, _cache_dir(memory_path), out,
                           exclusions, once=once)
        except StateError as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            outbox.close()
            memory.close()
        return
    # The port is bound before anything is recorded or sent: a Source that cannot serve must
    # not publish changes (nobody could fetch them) nor announce its topic on the hub.
    try:
        sock = socket.create_server((host, port), family=_family(host))
    except OSError as exc:
        memory.close()
        # without --listen the address is the base URL's: a public name (https://data.example.org/)
        # that is not this machine's, so the way out is named
        # (a taken port is another matter: another program, or this Source already running)
        hint = ("; give --listen HOST:PORT to serve on another address than the base URL's"
                if exc.errno != errno.EADDRINUSE and not listen else "")
        raise click.ClickException(f"cannot serve on {host}:{port}: {exc.strerror or exc}{hint}") from None
    outbox = Outbox(memory_path, publisher, max_retry_delay=_MAX_RETRY_SECONDS)
    try:
        folder = Folder(folder_path, base, RESERVED_NAMES, exclusions)
        runner = Source(folder, urls, publisher, outbox, memory, _cache_dir(memory_path), body_timeout=body_timeout)
        click.echo(f"rsnotify source: {folder_path.resolve()} as {base} (capability list {urls.capability_list}); "
                   f"change memory {memory_path}", err=True)
        count = runner.sync_folder()
        click.echo(f"rsnotify source: start scan recorded {count} change(s)", err=True)
        eventloop.run(_serve(runner, sock, header_timeout))
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        sock.close()
        outbox.close()
        memory.close()


def _check_base_url(ctx: click.Context, url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise click.BadParameter(f"{url!r} is not an http(s) URL; expected e.g. http://127.0.0.1:8000/dataset1/",
                                 ctx, param_hint="--base-url")
    if parts.query or parts.fragment:
        raise click.BadParameter(f"{url!r} has a query or fragment; expected a plain folder URL", ctx, param_hint="--base-url")
    return url if url.endswith("/") else url + "/"


def _listen_address(ctx: click.Context, listen: str | None, base: str) -> tuple[str, int]:
    if listen is None:
        parts = urlsplit(base)
        return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{listen!r} is not HOST:PORT; expected e.g. 127.0.0.1:8000", ctx, param_hint="--listen")
    return host.strip("[]"), int(port)


def _default_db(folder: Path) -> Path:
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    return Path(click.get_app_dir("rsnotify")) / f"source-{digest}.db"


def _hold_memory(memory_path: Path) -> IO[str]:
    """One `rsnotify source` per change memory: two would each see every change in SRC and
    record it twice, as two notifications. The lock is on a file beside the memory (flock),
    never on the SQLite file itself, whose locks are SQLite's."""
    lock_path = memory_path.with_name(memory_path.name + ".lock")
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = lock_path.open("a+", encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot open the change memory {memory_path}: {exc.strerror or exc}") from None
    holder = lock_or_holder(handle)
    if holder is not None:
        raise click.ClickException(f"the change memory {memory_path} is in use by {holder}: one rsnotify source "
                                   "per SRC and change memory (stop it first, or give another --db)")
    write_holder(handle, f"rsnotify source (pid {os.getpid()})")
    return handle


def _cache_dir(memory_path: Path) -> Path:
    return memory_path.with_name(memory_path.name + ".lists")


def _is_inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


async def _hub_problem(hubs: tuple[str, ...]) -> str | None:
    """Why a hub cannot be reached or would refuse every notification, or None. Any HTTP
    answer counts as reachable."""
    import aiohttp

    from rsnotify.neterrors import describe_client_error

    timeout = aiohttp.ClientTimeout(total=_HUB_CHECK_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for hub in hubs:
            try:
                async with session.get(hub, allow_redirects=False) as response:
                    await response.release()
                named = await _hub_self_name(session, hub)
            except TimeoutError:
                return f"cannot reach the hub {hub}: no answer within {_HUB_CHECK_SECONDS:g} s"
            except (aiohttp.ClientError, OSError) as exc:
                return f"cannot reach the hub {hub}: {describe_client_error(exc)}"
            if named is not None and named != normalize_url(hub):
                return (f"the hub at {hub} calls itself {named} and refuses notifications that name it "
                        f"otherwise: give --hub {named}")
    return None


async def _hub_self_name(session: aiohttp.ClientSession, hub: str) -> str | None:
    """The public URL an rsnotify hub reports on /health, or None from any other hub.

    An rsnotify hub takes a notification only when its Link rel="hub" names that URL: a Source
    given http://localhost:8080/ for a hub started as http://127.0.0.1:8080/ reaches it, yet every
    notification would be refused for good. Asking first turns that into one line at start."""
    try:
        async with session.get(urljoin(hub, "health"), allow_redirects=False) as response:
            body = await response.json(content_type=None) if response.status in (200, 503) else None
    except ValueError:      # not JSON: some other server's health page
        return None
    named = body.get("hub_url") if isinstance(body, dict) else None
    return named if isinstance(named, str) else None


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


async def _serve(runner: Source, sock: socket.socket, header_timeout: float) -> None:
    from aiohttp import web

    stop = eventloop.stop_on_signals()
    # aiohttp closes a connection that has not sent a whole request within keepalive_timeout of
    # connecting (or of its last answer): the header deadline against trickling clients, as the hub's
    app_runner = web.AppRunner(runner.app(), access_log=None, keepalive_timeout=header_timeout)
    await app_runner.setup()
    try:
        await web.SockSite(app_runner, sock).start()
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"rsnotify source: serving on http://{shown}:{port}/; watching {runner.folder.root}", err=True)
        watcher = asyncio.create_task(runner.watch(stop))
        await stop.wait()
        await watcher
    finally:
        await app_runner.cleanup()
    click.echo("rsnotify source: stopped (undelivered notifications stay in the outbox)", err=True)
