"""Deliveries: this worker process's delivery machinery — claims (with their lock renewal),
concurrency slots, ordered checkpoints, counters, and the decrypted-secret cache."""
from __future__ import annotations

import asyncio
import bisect
import logging
import os
import socket
import time
import uuid
from collections import defaultdict
from typing import Any

from cryptography.fernet import Fernet
from redis.exceptions import RedisError

from rsnotify.outbound import Limits

from ..batch import RedisBatcher
from ..callbacks import delivery_url
from ..crypto import decrypt_secret
from ..logs import DeliverySummary, redact_callback
from ..records import (
    LATENCY_BUCKETS,
    RECENT_ATTEMPTS,
    LogEntry,
    parse_entry_id,
    text,
    to_int,
)
from ..settings import HubSettings
from ..store import history
from . import batched, claims
from .hosts import HostGates, host_of
from .runs import SubRun

log = logging.getLogger(__name__)

REPORT_EVERY = 5.0      # s between two reports of this worker's state (store.history.WORKER_STATUS_TTL: 30)

# s between cursor/attempt writes of running subscriptions. A run at full fan-out delivers a few
# notifications a second, so at 0.2 s nearly every delivery cost a checkpoint script (~30 µs in
# the worker, ~45 µs in Redis); at 0.5 s a worker killed with -9 sends at most ~0.5 s of each of
# its runs again (at-least-once: the notification id lets subscribers drop repeats)
CHECKPOINT_EVERY = 0.5
SECRET_CACHE = 10_000     # decrypted secrets kept per process
TOPIC_URLS = 10_000       # topic URLs cached per process


class Deliveries:
    """This process's delivery machinery: claims (with their lock renewal), concurrency slots,
    ordered checkpoints, counters, and the decrypted-secret cache. One per worker context."""

    def __init__(self, settings: HubSettings, batch: RedisBatcher, fernet: Fernet, concurrency: int, *,
                 follow_seconds: float = 0.0, worker_id: str | None = None) -> None:
        self.settings, self.batch, self.fernet = settings, batch, fernet
        # the lanes: new notifications (fan-outs) and due retries each have slots of their own,
        # and every callback host a cap over both (hosts.py)
        self.slots = asyncio.Semaphore(concurrency)
        self.retry_slots = asyncio.Semaphore(settings.retry_concurrency)
        self.hosts = HostGates(settings.host_concurrency)
        self.follow_seconds = follow_seconds      # 0: never follow a topic (burst workers, tests)
        self.following: set[str] = set()
        self.runs: dict[str, SubRun] = {}
        self.claimed = 0                          # claims served so far (for tests and the curious)
        self._topic_urls: dict[str, str] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.stopping = False
        self.worker_id = worker_id or uuid.uuid4().hex[:12]   # claims name it (heartbeat.py)
        self._claims = 0
        self._secrets: dict[str, str] = {}
        self._stats: defaultdict[str, float] = defaultdict(float)
        self.summary = DeliverySummary(log)       # one INFO line a minute instead of one per success
        self.name: str | None = None              # the RQ worker's name, once its process has one
        self.concurrency = concurrency
        self._reported = 0.0
        self._keeper: asyncio.Task[None] | None = None
        self.stranded: dict[str, SubRun] = {}     # runs Redis failed under: claims to hand back
        self.limits = Limits(settings.connect_timeout, settings.delivery_timeout, settings.max_response_bytes)

    # -- lifecycle

    def start(self) -> None:
        self._keeper = asyncio.get_running_loop().create_task(self._keep())

    async def close(self, *, drain: bool, grace: float) -> None:
        """Stop: with `drain` let every run finish its backlog, else only its current delivery."""
        self.stopping = not drain
        pending = [t for t in self.tasks if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=5)
        if self._keeper:
            self._keeper.cancel()
            try:
                await self._keeper
            except asyncio.CancelledError:
                pass
        try:
            await self._flush_stats()
        except RedisError as exc:
            log.warning("could not write the last delivery counters: %s", exc)

    async def tracked(self, coro: Any) -> Any:
        """Await `coro` as a task `close` waits for (a fan-out its job stopped waiting for)."""
        return await self.spawn(coro)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- claims

    def new_token(self) -> str:
        # one token per claim, so a late write from an earlier claim of this worker is refused too
        self._claims += 1
        return f"{self.worker_id}:{self._claims}"

    async def claim(self, sid: str) -> SubRun | None:
        """Own the subscription (lock with TTL) and read its delivery state; None when owned elsewhere."""
        token = self.new_token()
        values = await claims.claim(self.batch, sid, token, int(self.settings.lock_ttl * 1000))
        return None if values is None else self.run_from(sid, token, values)

    def strand(self, run: SubRun) -> None:
        """Keep the claim of a run that stopped because Redis failed, to hand back once it answers."""
        run.stop = True
        self.stranded[run.sid] = run

    async def _hand_back(self) -> None:
        """Release the stranded claims (writing their cursors) and make their subscriptions due
        now, so a worker takes each up again at once; those Redis still fails for wait."""
        for sid, run in list(self.stranded.items()):
            if sid in self.runs:                 # taken up again meanwhile by this worker
                del self.stranded[sid]
                continue
            await self.checkpoint(run, release=True, due_at=time.time())
            del self.stranded[sid]
            log.info("subscription %s (%s) handed back after a Redis failure; it goes on at once",
                     sid, redact_callback(run.callback))

    async def topic_url(self, tid: str) -> str:
        url = self._topic_urls.get(tid)
        if url is None:
            url = await batched.topic_url(self.batch, tid)
            if len(self._topic_urls) >= TOPIC_URLS:
                self._topic_urls.clear()
            self._topic_urls[tid] = url
        return url

    def run_from(self, sid: str, token: str, v: dict[str, bytes | None]) -> SubRun:
        """The run of a claim, from the claimed subscription's DELIVERY_FIELDS."""
        callback = text(v["callback"])
        cursor = text(v["cursor"], "0-0")
        url = delivery_url(callback)
        return SubRun(
            sid=sid, token=token, topic=text(v["topic"]), callback=callback, tid=text(v["tid"]),
            url=url, host=host_of(url), secret=self._secret(text(v["secret"])),
            state=text(v["state"], "active"), expires=to_int(v["expires"]), cursor=cursor,
            cursor_key=parse_entry_id(cursor),
            cursor_seq=None if v["cursor_seq"] is None else to_int(v["cursor_seq"]),
            attempts=to_int(v["attempts"]), next_attempt=float(text(v["retry_at"]) or 0),
            resend=to_int(v["resend"]), renewals=to_int(v["renewals"]))

    def _secret(self, token: str) -> str | None:
        if not token:
            return None
        secret = self._secrets.get(token)
        if secret is None:
            if len(self._secrets) >= SECRET_CACHE:
                self._secrets.clear()
            secret = self._secrets[token] = decrypt_secret(self.fernet, token) or ""
        return secret or None

    async def _take_up_renewed_secrets(self) -> None:
        """Re-read the secrets of the runs held here that a renewal setting, changing or dropping
        one may have outdated: those claimed before the renewals counter last moved.

        A run signs with the secret read when it claimed the subscription, and on a busy topic it
        holds the claim for as long as publishes keep coming: without this, a verified renewal's
        new secret (or none, WebSub 5.1) would reach the deliveries only at the next claim. The
        claim read the counter with the secret, in one script, so a renewal between that read and
        the run's start here is seen too. One GET per look while runs are held; the secrets are
        read only for runs behind the counter."""
        if not self.runs:
            return                               # runs claimed later read the secret they claim
        count = await batched.renewal_count(self.batch)
        runs = [run for run in self.runs.values() if not run.stop and run.renewals < count]
        if not runs:
            return
        tokens = await asyncio.gather(*(batched.subscription_secret(self.batch, run.sid) for run in runs))
        for run, token in zip(runs, tokens, strict=True):
            if token is not None:                # a removed one stops at its next checkpoint
                run.secret = self._secret(token)
                run.renewals = count

    async def checkpoint(self, run: SubRun, *, release: bool, due_at: float | None = None) -> list[Any]:
        """Write the run's pending state; with `release` also give up the claim. The answer tells
        what the subscription looks like now: {1, state, expires, last log id, resend, next_attempt},
        {0} when the claim was lost, {-1} when the subscription is gone."""
        fields = run.take_fields()
        records = run.records[-RECENT_ATTEMPTS:]   # oldest first: LPUSH leaves the newest on top
        delivered, gaps = run.delivered, run.gaps
        run.records, run.delivered, run.gaps = [], 0, 0
        answer = await claims.checkpoint(self.batch, run.sid, run.tid, run.token, release=release, fields=fields,
                                         records=records, delivered=delivered, gaps=gaps, due_at=due_at)
        if answer[0] != 1:
            run.stop = True
        else:
            run.state, run.expires = text(answer[1]), to_int(answer[2])
            if run.state != "active":
                run.stop = True
        return answer

    # -- counters

    def count(self, outcome: str, status: int | None, seconds: float, entry: LogEntry) -> None:
        # once per delivery: the counter names are built once per process (_OUTCOMES, _STATUSES,
        # _Histogram), not as f-strings per delivery
        s = self._stats
        self.summary.add(outcome, seconds * 1000)
        s[_OUTCOMES.get(outcome) or f"outcome:{outcome}"] += 1
        s["status:error" if status is None else _STATUSES.get(status // 100) or f"status:{status // 100}xx"] += 1
        _DELIVERY_SECONDS.observe(s, seconds)
        if outcome == "delivered" and entry.published_ms:
            _PUBLISH_TO_DELIVERY.observe(s, max(0.0, time.time() - entry.published_ms / 1000))

    async def _flush_stats(self) -> None:
        stats, self._stats = self._stats, defaultdict(float)
        # the status page's per-minute history, in the same pipeline as the counters
        minute = [self.batch.execute(*command) for command in history.minute_commands(stats, time.time())]
        await batched.add_stats(self.batch, stats)
        await asyncio.gather(*minute)

    def _report(self) -> None:
        """What the status page's workers table shows about this worker, every few seconds."""
        now = time.time()
        if self.name is None or now - self._reported < REPORT_EVERY:
            return
        self._reported = now
        status = {"host": socket.gethostname(), "pid": os.getpid(), "seen": round(now, 3),
                  "claims": len(self.runs), "following": len(self.following), "slots": self.concurrency}
        for command in history.worker_status_commands(self.name, status):
            self.batch.execute(*command)

    # -- the keeper: checkpoints, lock renewal, counters

    async def _keep(self) -> None:
        ttl = self.settings.lock_ttl
        renew_every = max(0.05, ttl / 3)
        last_renew = time.monotonic()
        while True:
            await asyncio.sleep(min(CHECKPOINT_EVERY, renew_every))
            try:
                runs = [r for r in self.runs.values() if r.is_dirty and not r.stop]
                if runs:
                    await asyncio.gather(*(self.checkpoint(r, release=False) for r in runs))
                await self._take_up_renewed_secrets()
                if self.stranded:
                    await self._hand_back()
                if time.monotonic() - last_renew >= renew_every:
                    last_renew = time.monotonic()
                    await self._renew(list(self.runs.values()))
                await self._flush_stats()
                self.summary.log_if_due()
                self._report()
            except RedisError as exc:
                log.error("delivery keeper: Redis failed: %s", exc)
            except Exception:   # the keeper must outlive any one look, or claims lapse
                # without it no checkpoint is written and no claim renewed: every held
                # subscription would go to another worker and its deliveries be sent twice
                log.exception("delivery keeper: one look failed; it goes on")

    async def _renew(self, runs: list[SubRun]) -> None:
        ttl_ms = int(self.settings.lock_ttl * 1000)
        for start in range(0, len(runs), 500):
            chunk = runs[start:start + 500]
            answer = await claims.renew(self.batch, [(r.sid, r.token) for r in chunk], ttl_ms)
            for run, kept in zip(chunk, answer):
                if not kept and not run.stop:
                    log.warning("lost the claim on subscription %s (%s); another worker takes over",
                                run.sid, redact_callback(run.callback))
                    run.stop = True


class _Histogram:
    """A latency histogram's counter names in the stats hash ("<name>:le:<bound>", ":sum", ":count")."""

    def __init__(self, name: str) -> None:
        self.buckets = [f"{name}:le:{bound!r}" for bound in LATENCY_BUCKETS] + [f"{name}:le:+Inf"]
        self.sum, self.count = f"{name}:sum", f"{name}:count"

    def observe(self, stats: defaultdict[str, float], seconds: float) -> None:
        stats[self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)]] += 1
        stats[self.sum] += seconds
        stats[self.count] += 1


_OUTCOMES = {name: f"outcome:{name}" for name in ("delivered", "retry", "dead", "gone")}
_STATUSES = {n: f"status:{n}xx" for n in range(1, 6)}
_DELIVERY_SECONDS = _Histogram("delivery_seconds")
_PUBLISH_TO_DELIVERY = _Histogram("publish_to_delivery_seconds")

