"""TopicLog: a window of one topic's log shared by the subscriptions a fan-out serves."""
from __future__ import annotations

import asyncio
import bisect
import time

from ..records import LogEntry, parse_entry_id
from . import batched
from .context import WorkerContext
from .runs import Item, make_item

WINDOW = 512              # log entries a fan-out keeps in memory for its topic
# ... and at most, while a run serving from the window has yet to send them (a run that falls
# behind the window reads the log on its own: every entry read twice, the follower's read wasted)
MAX_WINDOW = 8 * WINDOW
MAX_WINDOW_BYTES = 32 * 1024 * 1024
READ_BATCH = 100          # entries read at once for a subscription behind that window
FRESH = 0.002             # s: an empty log read this recent is trusted (the release re-checks anyway)


class TopicLog:
    """A window of one topic's log shared by the subscriptions a fan-out serves, so the log is
    read once per round for all of them instead of once per subscription."""

    def __init__(self, ctx: WorkerContext, tid: str, topic: str) -> None:
        self.ctx, self.tid, self.topic = ctx, tid, topic
        self.hub_url = ctx.settings.hub_url
        self.items: list[Item] = []
        self.keys: list[tuple[int, int]] = []
        self.start_key: tuple[int, int] | None = None   # the window holds entries after this
        self.end_id = ""
        self.end_key = (0, 0)
        self._refresh: asyncio.Future[None] | None = None
        # runs waiting for the window to grow (wait_beyond): each a future, done at the growth
        self._waiters: list[asyncio.Future[None]] = []
        self._refreshed_at = 0.0
        self._bytes = 0                                   # the bodies in the window
        self._trim_at = 2 * WINDOW                        # entries at which the window is trimmed
        # the log as far as this worker's follower of the topic has read it (None: nobody feeds
        # the window); a window that reaches it needs no read of its own, the follower's next
        # read brings what comes
        self.fed_key: tuple[int, int] | None = None
        # for sharing a followed topic among workers (fanout._linger): the live followers, the
        # topic's subscriptions as this worker's first fan-out found them (0: unknown), and the
        # subscriptions this worker holds on it now
        self.followers = 1
        self.subscriptions = 0
        self.holders: set[str] = set()
        # the topic's subscriptions and their change counter as the last claim pass saw them
        # (fanout._dispatch): while the counter stays and this worker's runs hold that many, every
        # subscription of the topic is served from this window and a pass could claim none
        self.passed_subscriptions = 0
        self.passed_changes: bytes | None = None

    def item(self, entry: LogEntry, key: tuple[int, int] | None = None) -> Item:
        return make_item(entry, self.topic, self.hub_url, key)

    def fair_share(self) -> int | None:
        """How many of the topic's subscriptions this worker should hold while several follow it
        (None: no limit, when it follows alone or does not know how many there are)."""
        if self.followers <= 1 or not self.subscriptions:
            return None
        return -(-self.subscriptions // self.followers)

    def note_pass(self, subscriptions: int, changes: bytes | None) -> None:
        """A claim pass saw `subscriptions` subscriptions of the topic and its change counter at `changes`."""
        self.passed_subscriptions, self.passed_changes = subscriptions, changes

    def holds_all(self, changes: bytes | None) -> bool:
        """Every subscription of the topic is held by a run of this window, with the topic's
        change counter read at `changes` (after the entries just read): no claim pass is needed
        for them. The set is the one the last pass saw while the counter stays, and a held one
        is one of them, so holding as many means holding them all. A run leaves `holders` before
        it lets its claim go (its release looks at the log once more), so one that is letting
        go is never counted on to send what comes next."""
        # a topic whose subscriptions have not changed since the counter came has none ("" in the
        # pass's answer, None from the follower's read): the same
        return (self.passed_subscriptions > 0 and (changes or b"") == (self.passed_changes or b"")
                and len(self.holders) >= self.passed_subscriptions)

    @property
    def is_primed(self) -> bool:
        return self.start_key is not None

    def feed(self, after: str, entries: list[LogEntry]) -> None:
        """Extend the window with entries just read after `after` (XREAD), when no entry can lie
        between the window's end and them; otherwise the next `after` call reads them itself."""
        if entries:
            self.fed_key = parse_entry_id(entries[-1].notification_id)
        if not self.is_primed or parse_entry_id(after) > self.end_key:
            return
        self._append(entries)

    async def prime(self, after: str) -> None:
        self.start_key = parse_entry_id(after)
        self.end_id, self.end_key = after, self.start_key
        await self._read_more()

    async def after(self, cursor: str, cursor_key: tuple[int, int], must_reach: tuple[int, int] | None = None,
                    ) -> list[Item]:
        """Entries after `cursor`, oldest first (a batch, not necessarily all)."""
        if self.start_key is None or cursor_key < self.start_key:
            entries = await self._xrange(cursor, READ_BATCH)   # behind the window: its own read
            return [self.item(e) for e in entries]
        if cursor_key >= self.end_key:
            if self._refresh is not None:
                await asyncio.shield(self._refresh)
            elif ((must_reach is not None and self.end_key < must_reach)
                  or (time.monotonic() - self._refreshed_at > FRESH and not self._is_fed())):
                await self._read_more()
            if cursor_key >= self.end_key:
                return []
        index = bisect.bisect_right(self.keys, cursor_key)
        return self.items[index:index + READ_BATCH]

    def _is_fed(self) -> bool:
        """The window holds all this worker's follower has read of the log, and the follower is
        still reading: a read now would only find what its next read feeds in a moment (a
        lingering run waits for that), so a run that caught up costs no read of its own. Not
        while the slots are all taken: runs do not linger then (fanout._linger), and a read may
        spare one a release and a new claim."""
        d = self.ctx.deliveries
        return (self.fed_key is not None and self.end_key >= self.fed_key and self.tid in d.following
                and not d.slots.locked())

    async def wait_beyond(self, key: tuple[int, int], timeout: float) -> bool:
        """Wait up to `timeout` for the window to hold an entry after `key`; True when it does."""
        if self.end_key <= key:
            # a future and a timer that ends it, not wait_for (a task per wait) nor asyncio.timeout
            # around an Event (a timeout object, and an Event made anew at every read, ~4 µs a
            # wait): a lingering run waits here after nearly every read of a followed topic
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            if len(self._waiters) >= 64:
                # the waits that timed out (or were cancelled) since the last growth
                self._waiters = [w for w in self._waiters if not w.done()]
            self._waiters.append(waiter)
            timer = loop.call_later(timeout, _end_wait, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
        return self.end_key > key

    async def _read_more(self) -> None:
        self._refresh = asyncio.get_running_loop().create_future()
        try:
            self._append(await self._xrange(self.end_id, WINDOW))
            self._refreshed_at = time.monotonic()
        finally:
            self._refresh.set_result(None)
            self._refresh = None

    def _append(self, entries: list[LogEntry]) -> None:
        # a read and a feed can overlap: keep each entry once, in log order
        grown = False
        for entry in entries:
            key = parse_entry_id(entry.notification_id)
            if key > self.end_key:
                self.items.append(self.item(entry, key))
                self.keys.append(key)
                self.end_id, self.end_key = entry.notification_id, key
                self._bytes += len(entry.body)
                grown = True
        if grown and self._waiters:     # once per read, not per entry: the waiters look at end_key anyway
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if len(self.items) > self._trim_at:
            self._trim()

    def _trim(self) -> None:
        """Keep the last WINDOW entries, and the older ones a run holding the topic has yet to
        send (up to MAX_WINDOW entries and MAX_WINDOW_BYTES of bodies)."""
        items, runs = self.items, self.ctx.deliveries.runs
        cursors = [runs[sid].cursor_key for sid in self.holders if sid in runs]
        most = len(items) - WINDOW
        drop = most
        if cursors:
            drop = min(drop, bisect.bisect_right(self.keys, min(cursors)))
        drop = max(drop, len(items) - MAX_WINDOW)
        freed = sum(len(item.entry.body) for item in items[:drop])
        while drop < most and self._bytes - freed > MAX_WINDOW_BYTES:
            freed += len(items[drop].entry.body)
            drop += 1
        if drop > 0:
            self._bytes -= freed
            self.start_key = self.keys[drop - 1]
            del items[:drop], self.keys[:drop]
        # the next trim once the window has grown by WINDOW again: not at every read while it
        # keeps what a lagging run still needs
        self._trim_at = len(items) + WINDOW

    async def _xrange(self, after: str, count: int) -> list[LogEntry]:
        return await batched.read_log(self.ctx.batch, self.tid, after, count)


def _end_wait(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
