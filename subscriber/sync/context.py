"""The pieces every sync step works with, in one object passed down (no globals)."""
from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp

from .apply import Applier
from .events import Events, Progress
from .fetcher import Fetcher
from .sink import FolderSink
from .state import SyncState


@dataclass
class SyncOptions:
    concurrency: int = 16          # resource GETs in flight at most
    keep_deleted: bool = False     # keep files whose resource left the Resource List
    dry_run: bool = False
    settle: float = 2.0            # seconds to wait for out-of-order deliveries before catching up
    commit_every: int = 500        # resource records per state transaction during a baseline


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
