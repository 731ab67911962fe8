"""Moving a folder synced before exact names (percent-encoded file names, `_index` for a
trailing "/") to today's layout, once, on the first start: each tracked file is renamed in
place; one that cannot be is removed and its record marked for a fetch (the next pass gets it,
the others are skipped by their hash)."""
from __future__ import annotations

import logging
from dataclasses import replace

from .apply import want_of
from .context import SyncContext
from .outcomes import ResourceState
from .state import ResourceRecord

log = logging.getLogger(__name__)

NAMES_LAYOUT = "exact-1"    # channel `names_layout`: the layout the files are in


def migrate_names(ctx: SyncContext) -> None:
    """Rename the files of records whose path is not the one their loc maps to now."""
    state = ctx.state
    if ctx.options.dry_run or state.get("names_layout") == NAMES_LAYOUT:
        return
    moved = refetch = 0
    batch: list[ResourceRecord] = []
    for record in state.iter_records():
        try:
            new = ctx.sink.relative(ctx.sink.path_for(record.loc))
        except ValueError:
            continue
        if record.path is None or record.path == new:
            continue
        if not record.holds_file:
            batch.append(replace(record, path=new))
            continue
        try:
            ctx.sink.move(ctx.sink.absolute(record.path), ctx.sink.absolute(new))
            batch.append(replace(record, path=new))
            moved += 1
        except (OSError, ValueError) as exc:
            log.info("cannot rename %s to %s (%s): fetching it again", record.path, new, exc)
            try:
                ctx.sink.delete(ctx.sink.absolute(record.path))
            except OSError:
                pass
            batch.append(replace(record, path=new, state=ResourceState.FAILED, md5=None, sha256=None, length=None,
                                 last_error=f"renaming the old name {record.path} failed: {exc}"[:500],
                                 attempts=0, next_retry_at=0.0,
                                 want=want_of("updated", record.changed_at, record.lastmod, (), None)))
            refetch += 1
        if len(batch) >= 1000:
            state.commit(batch)
            batch = []
    state.commit(batch, names_layout=NAMES_LAYOUT)
    if moved or refetch:
        ctx.applier.report(f"file names: {moved:,} renamed to their exact names, {refetch:,} to fetch again")
