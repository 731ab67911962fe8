"""`rsnotify source --write [OUT] [--once]`: the write mode of `rsnotify source` (its options
live in `source_cli`): the documents go into OUT for an existing web server, nothing is served.

Exit codes with --once: 0 scanned, written and every notification accepted by the hub(s);
1 a notification is still pending (it stays in the outbox and goes out at the next run), or a
hub refused one for good (a 4xx: it is not sent again).
"""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import click

from rsnotify import eventloop

from ..client import Publisher
from ..memory.store import ChangeMemory
from ..outbox import Outbox
from .folder import Exclusions, Folder
from .server import RESERVED_NAMES, SourceUrls
from .static import TEMPORARY_PREFIX, StaticSource

ONCE_FLUSH_SECONDS = 60.0  # how long --once waits for the hub(s) to accept what it recorded


def check_out(ctx: click.Context, write_dir: str, src: Path, memory_path: Path) -> Path:
    """OUT as a path: SRC itself (an empty --write), or a folder outside SRC."""
    out = Path(write_dir) if write_dir else src
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{write_dir} exists and is not a folder", ctx, param_hint="--write")
    resolved, root = out.resolve(), src.resolve()
    if resolved != root and resolved.is_relative_to(root):
        # Only SRC's top-level names are reserved: documents in a subfolder would be listed
        # as resources of the Source they describe.
        raise click.BadParameter(f"{write_dir} is inside SRC; write into SRC itself or a folder outside it",
                                 ctx, param_hint="--write")
    if memory_path.resolve().is_relative_to(resolved):
        raise click.BadParameter(f"the change memory {memory_path} is inside OUT, where the web server would serve it",
                                 ctx, param_hint="--db")
    return out


def _check_writable(out: Path) -> None:
    """Create OUT if needed and write (then remove) a temporary file there; OSError when it cannot."""
    out.mkdir(parents=True, exist_ok=True)
    probe = out / f"{TEMPORARY_PREFIX}probe-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def run(src: Path, urls: SourceUrls, publisher: Publisher, outbox: Outbox, memory: ChangeMemory,
        cache_dir: Path, out: Path, exclusions: Exclusions, *, once: bool) -> None:
    """Scan, record, write and publish; then exit (`once`) or follow SRC until Ctrl-C/SIGTERM."""
    in_src = out.resolve() == src.resolve()
    reserved = (*RESERVED_NAMES, f"{TEMPORARY_PREFIX}*") if in_src else RESERVED_NAMES
    folder = Folder(src, urls.base, reserved, exclusions, owns_reserved=in_src)
    runner = StaticSource(folder, urls, publisher, outbox, memory, cache_dir, out=out)
    click.echo(f"rsnotify source: {folder.root} as {urls.base}, documents written into {out.resolve()}; "
               f"change memory {memory.path}", err=True)
    try:  # as a served Source binds its port first: an OUT that cannot be written records nothing
        _check_writable(out)
    except OSError as exc:
        raise click.ClickException(f"cannot write the documents into {out}: {exc.strerror or exc}; "
                                   "nothing was recorded or published") from None
    try:
        count = runner.sync_folder()
        runner.write_all()
    except OSError as exc:
        raise click.ClickException(f"cannot write the documents into {out}: {exc.strerror or exc}") from None
    click.echo(f"rsnotify source: scan recorded {count} change(s); documents written", err=True)
    if once:
        # A hub's refusal (a 4xx the outbox sets aside for good) ends a delivery as surely as an
        # acceptance does, so flush() returns for both: only the refusals of this run tell them apart.
        refused_before = {(e.document_id, e.hub_url) for e in outbox.entries("refused")}
        outbox.start()
        _flush_once(outbox)
        refused = [e for e in outbox.entries("refused") if (e.document_id, e.hub_url) not in refused_before]
        if refused:
            first = refused[0]
            raise click.ClickException(f"{len(refused)} notification(s) refused for good, first by {first.hub_url}: "
                                       f"{first.last_error}")
        click.echo("rsnotify source: every notification accepted by the hub(s)", err=True)
        return
    asyncio.run(_follow(runner))


# A hub that answers 401 or 403 refuses this publisher's credential: retried by the outbox (a
# running Source may see the hub's tokens fixed), but no retry within one --once run can cure it.
_CREDENTIAL_REFUSED = (401, 403)


def _flush_once(outbox: Outbox) -> None:
    """Wait up to ONCE_FLUSH_SECONDS for the hub(s) to take every pending notification; a
    ClickException when they do not, at once when a hub refused the credential."""
    deadline = time.monotonic() + ONCE_FLUSH_SECONDS
    while True:
        try:
            outbox.flush(min(1.0, max(0.0, deadline - time.monotonic())))
            return
        except TimeoutError as exc:
            denied = [e for e in outbox.entries("pending") if e.status in _CREDENTIAL_REFUSED]
            if denied:
                raise click.ClickException(
                    f"{denied[0].hub_url} refused this publisher's credential ({denied[0].last_error}): check "
                    "--token / RSNOTIFY_HUB_TOKEN; the notification is sent at the next run") from None
            if time.monotonic() >= deadline:
                raise click.ClickException(f"{exc}; it is sent at the next run") from None


async def _follow(runner: StaticSource) -> None:
    stop = eventloop.stop_on_signals()
    click.echo(f"rsnotify source: watching {runner.folder.root}", err=True)
    await runner.watch(stop)
    click.echo("rsnotify source: stopped (undelivered notifications stay in the outbox)", err=True)
