"""The pieces every sync step works with, in one object passed down (no globals)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp

from .apply import Applier
from .events import Events, Progress
from .fetcher import DEFAULT_MAX_BYTES, Fetcher
from .remote import ListOrigins
from .sink import FolderSink
from .state import SyncState


@dataclass
class SyncOptions:
    concurrency: int = 16          # resource GETs in flight at most
    keep_deleted: bool = False     # keep files whose resource left the Resource List
    dry_run: bool = False
    settle: float = 2.0            # seconds to wait for out-of-order deliveries before catching up
    # Resource records per state transaction during a baseline (and at most 200 ms apart):
    # a transaction rewrites every B-tree page its records touch, so 1,000 a time cost
    # ~6.8 us of SQLite per record against ~8.0 at 500 (10,000 records, tmpfs)
    commit_every: int = 1000
    max_resource_size: int = DEFAULT_MAX_BYTES   # bytes: a longer body is cut and refused
    exclude: tuple[str, ...] = ()  # --exclude GLOBs (exclude.py): resources neither fetched, deleted nor audited


@dataclass
class SyncContext:
    state: SyncState
    sink: FolderSink
    fetcher: Fetcher
    applier: Applier
    session: aiohttp.ClientSession          # for the Source's lists (same guard as resources)
    events: Events
    progress: Progress = field(default_factory=Progress)
    options: SyncOptions = field(default_factory=SyncOptions)
    resourcelist_url: str | None = None
    changelist_url: str | None = None
    list_origins: ListOrigins | None = None  # where the Source's lists may be (None: anywhere)
    wake: asyncio.Event | None = None       # set to make the live loop look again (a retry is due)
    retry_timer: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        self.applier.events = self.events   # refusals, conflicts, failures and escapes are events
