"""The fetch scheduler: resource GETs made concurrently through one keep-alive client
(rsnotify/outbound.py, the lean HTTP/1.1 client the hub delivers with), checked and written
atomically. The Source's lists stay on aiohttp (`get_in_origin`): a few requests, not thousands.

Trust: a loc is fetched only from the Source's own origins (scheme, host and port of its lists)
or a host allowed with --allow-host; the body is cut at the announced length and at
`max_bytes` (--max-resource-size), the partial file removed; a symlink in the target's path
inside DIR is refused.

A global cap (`concurrency`) that halves on 429/503 (honouring Retry-After) and grows back by
one per 100 successes; the client holds at most `concurrency` connections. Each body (gzip or
deflate undone, as the list's hashes are of the resource) is streamed to a temp file beside its
target while md5 and sha-256 are computed, compared with the announced length and hashes, and
renamed into place only when they match. Redirects are followed only within the same scheme,
host and port; the guard in `netguard` refuses other addresses. The sync's RequestRules
(--header to the Source only, --rate) are applied to every GET and redirect hop, as the list
session's middlewares apply them to the lists.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Self
from urllib.parse import urljoin

import aiohttp
from yarl import URL

from rsnotify import __version__
from rsnotify.backoff import backoff_delay
from rsnotify.netguard import Network
from rsnotify.outbound import Limits, OutboundClient, Response
from rsnotify.outbound_answer import (
    BodyTooLongError,
    ContentEncodingError,
    RequestFailedError,
)

from .headers import RequestRule, origin
from .outcomes import FetchOutcome, Refusal
from .session import HINT
from .sink import DISK_ERRNOS, FolderSink, PathConflictError, SymlinkRefusedError, write_problem
from .writer import BatchWriter

log = logging.getLogger(__name__)

USER_AGENT = f"rsnotify-sync/{__version__}"
HASHLIB_NAMES = {"md5": "md5", "sha-1": "sha1", "sha1": "sha1", "sha-256": "sha256", "sha256": "sha256",
                 "sha-512": "sha512"}
MAX_REDIRECTS = 5
MAX_RETRY_WAIT = 300.0  # s: the longest wait between two tries of one resource (also for Retry-After)
_REDIRECTS = (301, 302, 303, 307, 308)
DEFAULT_MAX_BYTES = 1024**3      # --max-resource-size
# bytes/s a resource's answer must average over each window of --timeout seconds. aiohttp's
# sock_read bounded only the gap between two reads, so one byte every timeout - 1 s held a GET
# (and its slot) forever; this floor makes any answer end within about its size / MIN_RATE
# (1 GiB: 12 days at worst, a typical 100 KB resource: timeout + 100 s), while a slow but real link
# (a dial-up modem does 5 KiB/s) is never cut.
MIN_RATE = 1024.0
# What each resource GET sends besides the client's own User-Agent and Accept: the codings
# aiohttp asked for before (the body is decoded, so hashes and lengths are the resource's).
_GET_HEADERS: dict[str, str] = {"Accept-Encoding": "gzip, deflate"}


@dataclass(frozen=True, slots=True)
class FetchResult:
    loc: str
    outcome: FetchOutcome
    md5: str | None = None
    sha256: str | None = None
    length: int | None = None
    detail: str = ""
    expected: str | None = None    # for MISMATCH: the announced hash or length
    rule: Refusal | None = None    # for REFUSED (and a body longer than announced): the rule
    local: bool = False            # for FAILED: the Destination's own disk failed, not the Source


class FetchError(Exception):
    def __init__(self, message: str, *, retry: bool, gone: bool = False, retry_after: float | None = None,
                 rule: Refusal | None = None) -> None:
        super().__init__(message)
        self.retry = retry
        self.gone = gone
        self.retry_after = retry_after
        self.rule = rule


class RedirectRefusedError(Exception):
    """A Source document redirected to another origin (scheme, host, port)."""


async def get_in_origin(session: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse:
    """GET `url`, following redirects only within its origin (a Source's lists stay on the
    Source). The caller closes the response (`async with`). RedirectRefusedError otherwise."""
    for _ in range(MAX_REDIRECTS + 1):
        response = await session.get(url, allow_redirects=False)
        location = response.headers.get("Location")
        if response.status not in _REDIRECTS or not location:
            return response
        response.release()
        target = _redirect_target(url, location)
        if target is None:
            raise RedirectRefusedError(f"{url} redirected to {location[:200]!r}, not a URL; refused")
        if not _same_origin(target, url):
            raise RedirectRefusedError(f"{url} redirected to {target}, another scheme, host or port; refused")
        url = target
    raise RedirectRefusedError(f"{url} redirected more than {MAX_REDIRECTS} times")


class Fetcher:
    """Fetches resources into a FolderSink. Use `async with` or call `close()`."""

    def __init__(self, sink: FolderSink, *, allowed_networks: Iterable[Network] | None = (),
                 allowed_hosts: Iterable[str] | None = None, allowed_origins: Iterable[str] = (),
                 concurrency: int = 16,
                 timeout: float = 30.0, tries: int = 5, retry_base: float = 1.0,
                 max_bytes: int = DEFAULT_MAX_BYTES, announced_by: str = "the Source announced",
                 rules: Sequence[RequestRule] = (), min_rate: float = MIN_RATE) -> None:
        self.sink = sink
        self.writer = BatchWriter(sink)   # small files for a slow disk, many per thread hand-off
        self.announced_by = announced_by
        self.max_concurrency = concurrency
        self.limit = concurrency
        # allowed_hosts: "HOST" (any port) or "HOST:PORT"; None: any loc. allowed_origins: URLs
        # whose scheme, host and port are the Source's own (its Capability List and lists).
        self.allowed_hosts = {h.lower() for h in allowed_hosts} if allowed_hosts is not None else None
        self.allowed_origins = {origin(url) for url in allowed_origins}
        self._allowed_prefixes: dict[str, bool] = {}   # "scheme://host[:port]" -> allowed (see refusal)
        self.tries = tries
        self.retry_base = retry_base
        self.max_bytes = max_bytes
        # `timeout` as aiohttp's sock_connect and sock_read were: to connect, and between two
        # reads; no bound on the whole, which a big resource that keeps coming may need
        self.client = OutboundClient(allowed=None if allowed_networks is None else tuple(allowed_networks), hint=HINT,
                                     limit=concurrency, max_idle=concurrency, user_agent=USER_AGENT,
                                     keep_headers=True)
        # The body's bytes as sent: a coded body may be a little longer than the resource (gzip
        # of incompressible data), never much; past this it is cut as a decoded one is past its
        # cap (`_receive` gives the decoded cap, the announced length or max_bytes, per resource).
        self.limits = Limits(timeout, None, max_bytes + max_bytes // 8 + 65536, read_timeout=timeout,
                             min_rate=min_rate)
        self.rules = tuple(rules)   # --rate, --header: the list session has them as middlewares
        self._active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._successes = 0
        # The last small-file writes timed on the loop (create + write + rename): their median
        # says whether the disk is slow. A mean was pulled over the line by the odd write that
        # waited for the CPU on a busy machine, and then stayed there (a thread-side write
        # also waits for its hand-off): a tmpfs baseline handed every file to the thread.
        # Each sample is whether that write took longer than SLOW_WRITE: the median is above the
        # line exactly when more than half of them are, which a running count tells without a
        # sort per write.
        self._write_times: deque[bool] = deque(maxlen=WRITE_SAMPLES)
        self._slow_writes = 0      # samples in _write_times above SLOW_WRITE
        self._slow_disk = False
        self._small_writes = 0
        self.requests = 0          # GETs sent (each try and redirect counts)
        self.throttled = 0         # 429/503 answers

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.client.close()

    # --- the cap ---------------------------------------------------------------------------

    async def _acquire(self) -> None:
        if self._active < self.limit and not self._waiters:
            self._active += 1
            return
        # Waiters are woken one at a time, in order, as slots free up (no thundering herd).
        granted = asyncio.get_running_loop().create_future()
        self._waiters.append(granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release()     # granted just as we were cancelled: hand the slot on
            elif granted in self._waiters:   # _grant may have popped it already (a stop cancels many)
                self._waiters.remove(granted)
            raise

    def _release(self) -> None:
        self._active -= 1
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self._active < self.limit:
            granted = self._waiters.popleft()
            if not granted.done():
                self._active += 1
                granted.set_result(None)

    def _throttle(self) -> None:
        self.throttled += 1
        self.limit = max(1, self.limit // 2)
        self._successes = 0

    def _succeeded(self) -> None:
        self._successes += 1
        if self._successes >= 100 and self.limit < self.max_concurrency:
            self.limit += 1
            self._successes = 0
            self._grant()

    def refusal(self, loc: str) -> tuple[Refusal, str] | None:
        """Why `loc` may not be fetched or deleted (the rule and a message), or None."""
        if self.allowed_hosts is None:
            return None
        # Most locs start with one of a few plain "scheme://host[:port]" prefixes, whose verdict
        # depends on nothing after them: judged once each (urlsplit per loc was ~5 % of a baseline).
        match = _PLAIN_ORIGIN.match(loc)
        if match is not None and self._allowed_prefixes.get(match.group()):
            return None
        refused = self._refusal(loc)
        if match is not None:
            if len(self._allowed_prefixes) >= 1024:
                self._allowed_prefixes.clear()
            self._allowed_prefixes[match.group()] = refused is None
        return refused

    def _refusal(self, loc: str) -> tuple[Refusal, str] | None:
        if self.allowed_hosts is None:
            return None
        try:
            where = origin(loc)
        except ValueError:
            return Refusal.HOST, f"{loc} has no valid host and port"
        _, host, port = where
        if where in self.allowed_origins or host in self.allowed_hosts or f"{host}:{port}" in self.allowed_hosts:
            return None
        if any(host == known for _, known, _ in self.allowed_origins):
            return Refusal.ORIGIN, (f"{loc} is on the Source's host but not its scheme and port "
                                    f"(allow it with --allow-host {host}:{port})")
        return Refusal.HOST, f"{loc} is not on the Source's host(s) (allow it with --allow-host)"

    # --- one resource ----------------------------------------------------------------------

    async def fetch(self, loc: str, path: Path | str, *, length: int | None = None,
                    hashes: tuple[tuple[str, str], ...] = ()) -> FetchResult:
        """GET `loc` into `path`; never raises for a fetch problem (the outcome says it)."""
        refused = self.refusal(loc)
        if refused is not None:
            return FetchResult(loc, FetchOutcome.REFUSED, detail=refused[1], rule=refused[0])
        attempt = 0
        while True:
            attempt += 1
            await self._acquire()
            try:
                result = await self._fetch_once(loc, path, length, hashes)
            except FetchError as exc:
                if exc.gone:
                    return FetchResult(loc, FetchOutcome.GONE, detail=str(exc))
                if exc.rule is not None:
                    return FetchResult(loc, FetchOutcome.REFUSED, detail=str(exc), rule=exc.rule)
                if not exc.retry or attempt >= self.tries:
                    return FetchResult(loc, FetchOutcome.FAILED, detail=str(exc))
                delay = backoff_delay(attempt, self.retry_base, MAX_RETRY_WAIT, retry_after=exc.retry_after)
                log.info("retrying %s in %.1f s (try %d of %d): %s", loc, delay, attempt + 1, self.tries, exc)
            except SymlinkRefusedError as exc:
                return FetchResult(loc, FetchOutcome.REFUSED, detail=str(exc), rule=Refusal.SYMLINK)
            except PathConflictError as exc:
                return FetchResult(loc, FetchOutcome.CONFLICT, detail=str(exc))
            except OSError as exc:
                # Only the folder's own file operations raise OSError here (network errors are
                # FetchErrors): a full or read-only disk, a folder without permission, an I/O
                # error. This resource fails alone and is tried again; the sync goes on.
                # A name the file system refuses (EINVAL, EILSEQ on vfat), a loop or a file where a
                # folder should be is no disk trouble: retried on the Source's schedule, not the disk's.
                return FetchResult(loc, FetchOutcome.FAILED, detail=write_problem(exc, path),
                                   local=exc.errno in DISK_ERRNOS)
            else:
                self._succeeded()
                return result
            finally:
                self._release()
            await asyncio.sleep(delay)

    async def _fetch_once(self, loc: str, path: Path | str, length: int | None,
                          hashes: tuple[tuple[str, str], ...]) -> FetchResult:
        url = loc
        for _ in range(MAX_REDIRECTS + 1):
            self.requests += 1
            try:
                response = await self._open(url)
            except RequestFailedError as exc:
                raise FetchError(f"cannot fetch {url}: {exc}", retry=True) from exc
            try:
                status = response.status
                location = response.headers.get("location")
                if status in _REDIRECTS and location:
                    target = _redirect_target(url, location)
                    if target is None:
                        raise FetchError(f"GET {url} redirected to {location[:200]!r}, not a URL; refused",
                                         retry=False, rule=Refusal.REDIRECT)
                    if not _same_origin(target, url):
                        raise FetchError(f"GET {url} redirected to another host ({target}); refused",
                                         retry=False, rule=Refusal.REDIRECT)
                    url = target
                    continue
                if status in (404, 410):
                    raise FetchError(f"GET {url} answered {status}", retry=False, gone=True)
                if status in (429, 503):
                    self._throttle()
                    raise FetchError(f"GET {url} answered {status}", retry=True,
                                     retry_after=_retry_after(response.headers.get("retry-after")))
                if status >= 500:
                    raise FetchError(f"GET {url} answered {status}", retry=True)
                if status != 200:
                    raise FetchError(f"GET {url} answered {status}; expected 200", retry=False)
                return await self._receive(loc, response, path, length, hashes)
            except RequestFailedError as exc:       # the body broke off, or went silent
                raise FetchError(f"cannot fetch {url}: {exc}", retry=True) from exc
            except ContentEncodingError as exc:
                raise FetchError(f"cannot fetch {url}: {exc}", retry=False) from exc
            finally:
                response.close()                    # back to the pool if its body was read to the end
        raise FetchError(f"GET {loc} redirected more than {MAX_REDIRECTS} times", retry=False)

    async def _open(self, url: str) -> Response:
        """GET `url` through the sync's rules; the answer once its head came."""
        headers = _GET_HEADERS
        if self.rules:
            headers = dict(_GET_HEADERS)
            for rule in self.rules:
                await rule.apply(url, headers)
        try:
            target = URL(url)
        except ValueError as exc:
            raise RequestFailedError(f"not a URL ({exc})") from None
        return await self.client.open("GET", target, headers, self.limits)

    async def _receive(self, loc: str, response: Response, path: Path | str, length: int | None,
                       hashes: tuple[tuple[str, str], ...]) -> FetchResult:
        md5, sha256 = hashlib.md5(), hashlib.sha256()
        others = _other_hashers(hashes)
        # Never more than announced (the list's length) nor than --max-resource-size: a body
        # that runs past either is cut there and its partial file removed.
        cap = self.max_bytes if length is None else min(length, self.max_bytes)
        # Content-Length counts the bytes sent; a compressed body (Content-Encoding) decodes to
        # another size, so it is only streamed and cut at `cap` like a chunked one (a gzip bomb
        # never fills memory, a small file compressed a little larger is not refused).
        encoded = response.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity")
        sent = None if encoded else _content_length(response.headers.get("content-length"))
        if sent is not None and sent > cap:
            raise self._too_long(loc, sent, length)
        if sent is not None and sent <= SMALL_BODY:
            return await self._receive_small(loc, response, path, length, hashes, md5, sha256, others)
        out, tmp = await asyncio.to_thread(self.sink.open_partial, Path(path))
        hashers = (md5, sha256, *others.values())

        def write(chunk: bytes) -> None:
            # on the loop as it comes, as the chunk loop wrote it before (the temp file is local)
            out.write(chunk)
            for hasher in hashers:
                hasher.update(chunk)

        try:
            with out:
                try:
                    size = await response.stream(write, cap)
                except BodyTooLongError as exc:
                    raise self._too_long(loc, exc.received, length, at_least=True) from None
            computed = _digests(md5, sha256, others)
            problem = _fixity_problem(size, computed, length, hashes, self.announced_by)
            if problem is not None:
                self.sink.discard(tmp)
                detail, expected = problem
                return FetchResult(loc, FetchOutcome.MISMATCH, computed["md5"], computed["sha256"], size, detail,
                                   expected)
            self.sink.install(tmp, Path(path))
        except BaseException as exc:
            # the disk refused (a full one mid-body): the folders made for this file go too
            self.sink.discard(tmp, unmake=isinstance(exc, OSError))
            raise
        return FetchResult(loc, FetchOutcome.STORED, computed["md5"], computed["sha256"], size)

    def _too_long(self, loc: str, size: int, length: int | None, *, at_least: bool = False) -> FetchError:
        more = "more than " if at_least else ""
        if length is not None and length <= self.max_bytes:
            return FetchError(f"length is {more}{size} bytes; {self.announced_by} {length}: cut there",
                              retry=False, rule=Refusal.LENGTH)
        return FetchError(f"{loc} sent {more}{size} bytes, over --max-resource-size {self.max_bytes}: cut there",
                          retry=False, rule=Refusal.SIZE)

    async def _receive_small(self, loc: str, response: Response, path: Path | str, length: int | None,
                             hashes: tuple[tuple[str, str], ...], md5: Any, sha256: Any,
                             others: dict[str, Any]) -> FetchResult:
        # The caller checked Content-Length <= `cap` and that no Content-Encoding changes the size,
        # and llhttp never gives more than Content-Length bytes: one read() is the whole body,
        # still bounded by `cap` (no chunk loop per resource; usually it came with the head).
        body = await response.read(SMALL_BODY)
        md5.update(body)
        sha256.update(body)
        for hasher in others.values():
            hasher.update(body)
        computed = _digests(md5, sha256, others)
        md5_hex, sha256_hex = computed["md5"], computed["sha256"]
        problem = _fixity_problem(len(body), computed, length, hashes, self.announced_by)
        if problem is not None:
            detail, expected = problem
            return FetchResult(loc, FetchOutcome.MISMATCH, md5_hex, sha256_hex, len(body), detail, expected)
        self._small_writes += 1
        if len(body) <= INLINE_WRITE and (not self._slow_disk or self._small_writes % PROBE_EVERY == 0):
            # On a quick disk a handoff to a thread costs more than the write itself; on a slow
            # one every PROBE_EVERY-th write is still timed here, to notice it got quick again.
            started = time.perf_counter()
            self.sink.write_small(path, body)
            self._timed_write(time.perf_counter() - started)
        else:
            # A slow disk (or a big body): the loop keeps fetching while a thread waits on it.
            await self.writer.write(path, body)
        return FetchResult(loc, FetchOutcome.STORED, md5_hex, sha256_hex, len(body))

    def _timed_write(self, seconds: float) -> None:
        times = self._write_times
        slow = seconds > SLOW_WRITE
        if len(times) == WRITE_SAMPLES:
            self._slow_writes -= times[0]      # the sample append() pushes out
        times.append(slow)
        self._slow_writes += slow
        if len(times) == WRITE_SAMPLES:
            self._slow_disk = self._slow_writes > WRITE_SAMPLES // 2


# "http(s)://host[:port]" followed by "/": nothing in the host part urlsplit would read
# otherwise (no user info, query, fragment, escape, space), so the loc's origin is the prefix's.
_PLAIN_ORIGIN = re.compile(r"https?://[A-Za-z0-9.\-]+(?::[0-9]{1,5})?(?=/)|https?://\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?(?=/)")
SMALL_BODY = 256 * 1024   # bodies sent with up to this Content-Length are read whole, then written at once
INLINE_WRITE = 64 * 1024  # up to this size on the event loop itself; larger ones by a worker thread
SLOW_WRITE = 0.0003       # s: small files go to worker threads while the median write takes longer
WRITE_SAMPLES = 15        # the writes that median is taken of (the first ones are all made inline)
PROBE_EVERY = 32          # with a slow disk, one small write in this many is still timed on the loop


def _other_hashers(hashes: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """A hasher for each announced algorithm other than md5 and sha-256 (always computed)."""
    if all(algorithm in _ALWAYS_COMPUTED for algorithm, _ in hashes):
        return {}     # the usual case (an md5, a sha-256 or none), without the lookups below
    return {alg.lower(): hashlib.new(HASHLIB_NAMES[alg.lower()]) for alg, _ in hashes
            if alg.lower() in HASHLIB_NAMES and HASHLIB_NAMES[alg.lower()] not in ("md5", "sha256")}


_ALWAYS_COMPUTED = frozenset({"md5", "sha-256", "sha256"})


def _digests(md5: Any, sha256: Any, others: dict[str, Any]) -> dict[str, str]:
    """Every computed digest by algorithm name ("sha-256" and "sha256" both), for _fixity_problem."""
    sha256_hex = sha256.hexdigest()
    computed = {"md5": md5.hexdigest(), "sha-256": sha256_hex, "sha256": sha256_hex}
    for alg, hasher in others.items():
        computed[alg] = hasher.hexdigest()
    return computed


def _fixity_problem(size: int, computed: dict[str, str], length: int | None,
                    hashes: tuple[tuple[str, str], ...], announced_by: str) -> tuple[str, str] | None:
    if length is not None and size != length:
        return f"length is {size} bytes; {announced_by} {length}", f"length:{length}"
    for algorithm, expected in hashes:
        actual = computed.get(algorithm.lower())
        if actual is not None and actual != expected.lower():
            return f"{algorithm} is {actual}; {announced_by} {expected}", f"{algorithm}:{expected}"
    return None


def _content_length(value: str | None) -> int | None:
    """Content-Length as llhttp framed the body (it refused a bad or conflicting one), or None."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _redirect_target(url: str, location: str) -> str | None:
    """`location` resolved against `url`, or None when it is no URL: urljoin raises ValueError
    for a Source's "http://[::1/x" (an unclosed IPv6 bracket), which must be a refusal, not a traceback."""
    try:
        return urljoin(url, location)
    except ValueError:
        return None


def _same_origin(a: str, b: str) -> bool:
    try:
        return origin(a) == origin(b)
    except ValueError:
        return False


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        # isascii first: "\xb2" (a latin-1 "²") is a digit to str.isdigit, and float() raised on it
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
