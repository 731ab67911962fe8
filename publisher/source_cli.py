"""`rsnotify source`: serve a folder as a ResourceSync Source and publish its changes.

Exit codes: 0 stopped with Ctrl-C / SIGTERM, 1 the hub cannot be reached at start (or the
listen address is taken), 2 usage errors (no such folder, a base URL that is not http(s)).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import click
from aiohttp import web

from rsnotify import eventloop

from .client import Publisher
from .errors import SettingsError, StateError
from .folder import Folder
from .memory import ChangeMemory, ListPolicy
from .outbox import Outbox
from .source import RESERVED_NAMES, Source, SourceUrls

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
@click.option("--rotate", "rotate_seconds", type=click.FloatRange(min=0, min_open=True), default=86_400.0,
              show_default=True, envvar="RSNOTIFY_SOURCE_ROTATE", show_envvar=True,
              help="Seconds after which the open Change List is closed at the next notification.")
@click.option("--keep", "keep_days", type=click.FloatRange(min=0, min_open=True), envvar="RSNOTIFY_SOURCE_KEEP",
              show_envvar=True, help="Days closed Change Lists stay listed [default: all are kept].")
@click.option("-v", "--verbose", is_flag=True, help="Log debug details too.")
@click.pass_context
def source(ctx: click.Context, src: str, base_url: str, hub_urls: tuple[str, ...], listen: str | None,
           token: str | None, db_path: str | None, rotate_seconds: float, keep_days: float | None,
           verbose: bool) -> None:
    """Serve the files of SRC under URL as a ResourceSync Source, and publish every change.

    Serves the files, the Source Description, the Capability List, the Resource List, the
    Change List and the topic URI (<URL>changes). Scans SRC at start against the change
    memory (so offline edits are published), then follows it. Changes are recorded, then
    sent to the hub through an outbox that retries while the hub is down.

    \b
    rsnotify source --dir ./data --base-url http://127.0.0.1:8000/dataset1/ --hub http://127.0.0.1:8080/
    """
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    policy = ListPolicy(rotate_seconds=rotate_seconds, keep_seconds=keep_days * 86_400 if keep_days else None)
    try:
        memory = ChangeMemory(memory_path, policy)
        publisher = Publisher(hubs, urls.topic, urls.capability_list, token, memory=memory)
    except (SettingsError, StateError) as exc:
        raise click.UsageError(str(exc), ctx) from None
    problem = asyncio.run(_hub_problem(hubs))
    if problem:
        raise click.ClickException(problem)
    outbox = Outbox(memory_path, publisher, max_retry_delay=_MAX_RETRY_SECONDS)
    try:
        runner = Source(Folder(folder_path, base, RESERVED_NAMES), urls, publisher, outbox, memory, _cache_dir(memory_path))
        click.echo(f"rsnotify source: {folder_path.resolve()} as {base} (capability list {urls.capability_list}); "
                   f"change memory {memory_path}", err=True)
        count = runner.sync_folder()
        click.echo(f"rsnotify source: start scan recorded {count} change(s)", err=True)
        eventloop.run(_serve(runner, host, port))
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
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


def _cache_dir(memory_path: Path) -> Path:
    return memory_path.with_name(memory_path.name + ".lists")


def _is_inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


async def _hub_problem(hubs: tuple[str, ...]) -> str | None:
    """Why a hub cannot be reached, or None. Any HTTP answer counts as reachable."""
    timeout = aiohttp.ClientTimeout(total=_HUB_CHECK_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for hub in hubs:
            try:
                async with session.get(hub, allow_redirects=False) as response:
                    await response.release()
            except TimeoutError:
                return f"cannot reach the hub {hub}: no answer within {_HUB_CHECK_SECONDS:g} s"
            except (aiohttp.ClientError, OSError) as exc:
                return f"cannot reach the hub {hub}: {str(exc) or type(exc).__name__}"
    return None


async def _serve(runner: Source, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    app_runner = web.AppRunner(runner.app(), access_log=None)
    await app_runner.setup()
    try:
        await web.TCPSite(app_runner, host, port).start()
        click.echo(f"rsnotify source: serving on http://{host}:{port}/; watching {runner.folder.root}", err=True)
        watcher = asyncio.create_task(runner.watch(stop))
        await stop.wait()
        await watcher
    finally:
        await app_runner.cleanup()
    click.echo("rsnotify source: stopped (undelivered notifications stay in the outbox)", err=True)
