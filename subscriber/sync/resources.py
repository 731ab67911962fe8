"""The Source's Resource List (or Resource List Index) as one stream of chunks of Resources,
with the snapshot instant `at` (the index's, else the oldest part's)."""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

import aiohttp

from rsnotify.lists import RESOURCE_LIST, ListRef, Resource

from .listdates import refuse_bad_bounds
from .remote import ListOrigins, RemoteList, SourceDocumentError


@dataclass
class ResourceListRead:
    url: str
    at: datetime | None = None
    hint: int | None = None       # expected entries (from the first document), for progress


async def resource_chunks(session: aiohttp.ClientSession, url: str, read: ResourceListRead,
                          origins: ListOrigins | None = None) -> AsyncIterator[list[Resource]]:
    """`origins`: where the list and its index's parts may be (a part elsewhere is refused
    before anything of it is used)."""
    top = await RemoteList.open(session, url, "Resource List", origins)
    _check_head(top, part=False)
    read.at = top.info.at
    if not top.info.is_index:
        read.hint = top.entries_hint
        async for chunk in top.chunks():
            yield [e for e in chunk if isinstance(e, Resource)]
        return
    parts: list[ListRef] = []
    async for chunk in top.chunks():
        parts.extend(e for e in chunk if isinstance(e, ListRef))
    for ref in parts:
        refuse_bad_bounds("Resource List Index", url, ref)
        remote = await RemoteList.open(session, ref.loc, "Resource List", origins)
        _check_head(remote, part=True)
        if top.info.at is None and remote.info.at is not None and (read.at is None or remote.info.at < read.at):
            read.at = remote.info.at   # an index without `at`: the oldest part's
        async for chunk in remote.chunks():
            yield [e for e in chunk if isinstance(e, Resource)]


def _check_head(remote: RemoteList, *, part: bool) -> None:
    """Refuse (and close) a document that is not a Resource List (or, at the top, its index), or
    one dated in the future (its `at` would be the high-water mark). Read as one anyway, a Change
    List or a nested index would list no resource, and the baseline would delete the whole copy."""
    info = remote.info
    try:
        if info.capability != RESOURCE_LIST:
            raise SourceDocumentError(f"{remote.url} is a {info.capability} document; expected a Resource List"
                                      + (" (a part of the Resource List Index)" if part else ""))
        if part and info.is_index:
            raise SourceDocumentError(f"{remote.url} is an index inside a Resource List Index; expected a "
                                      "Resource List")
        refuse_bad_bounds("Resource List", remote.url, info)
    except BaseException:
        remote.close()
        raise
