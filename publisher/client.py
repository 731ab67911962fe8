"""The Publisher: order, split and chain resource changes into change notifications, and POST
each one to the topic's hub(s) (spec §4.1).

`await publisher.publish(changes)` for async code, `publisher.publish_blocking(changes)` for
everything else. aiohttp's errors are translated here into PublishError.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Self

import aiohttp

from rsnotify.backoff import backoff_delay
from rsnotify.datetimes import format_datetime
from rsnotify.errors import (
    DocumentParseError,
    NotificationError,
    ValidationError,
    WireError,
)
from rsnotify.neterrors import describe_client_error
from rsnotify.notification import (
    FUTURE_SKEW,
    ChangeNotification,
    ResourceChange,
    future_problems,
)
from rsnotify.splitter import split_changes
from rsnotify.websub import (
    NOTIFICATION_ID_HEADER,
    SEQUENCE_HEADER,
    build_link_header,
    check_url,
)
from rsnotify.xml import parse_notification, to_xml

from .changes import ChangeLike, to_resource_changes
from .errors import ChangeInputError, HubUnreachableError, PublishError, SettingsError
from .memory.chain import LocalChain
from .memory.store import ChangeMemory
from .receipt import Receipt
from .settings import PublisherSettings

log = logging.getLogger(__name__)

XML_CONTENT_TYPE = "application/xml"
IDEMPOTENCY_HEADER = "Idempotency-Key"   # an rsnotify hub stores a repeated key's document once (7 days)
_MAX_REASON_CHARS = 2_000         # a hub's refusal text is kept up to this many characters
_RETRY_STATUSES = {408, 425, 429}  # 4xx that mean "try again later", retried like 5xx


def utc_now() -> datetime:
    return datetime.now(UTC)


class Publisher:
    """Publishes a topic's resource changes to its hub(s).

    `hub_url`: one hub URL or several (every document goes to each). `capability_list_url`:
    when known, sent as `Link rel="resourcesync"` and written as `<rs:ln rel="up">` in each
    document. `state_path`: the change memory file (SQLite, shared with an Outbox): every
    prepared notification's changes are recorded there, in the transaction that advances the
    topic's from/until chain, before the hub POST; any number of publishers, threads and
    processes on one file make one unbroken chain. `memory`: an open ChangeMemory instead.
    Without either, the chain lives in this object only. `blocking_deadline`: seconds
    `publish_blocking` may take in all. `now` is the clock for changes given without a
    datetime. `session`: an aiohttp ClientSession to use (not closed by us).
    """

    def __init__(
        self,
        hub_url: str | Sequence[str],
        topic_url: str,
        capability_list_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        max_attempts: int = 5,
        retry_delay: float = 0.5,
        max_retry_delay: float = 30.0,
        state_path: str | None = None,
        memory: ChangeMemory | None = None,
        blocking_deadline: float = 10.0,
        max_entries: int = 50_000,
        max_bytes: int = 50_000_000,
        future_skew: float = FUTURE_SKEW,
        now: Callable[[], datetime] = utc_now,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        hubs = [hub_url] if isinstance(hub_url, str) else list(hub_url)
        if not hubs:
            raise SettingsError("a publisher needs at least one hub URL, got none")
        self.hub_urls = tuple(_check("hub URL", hub) for hub in hubs)
        self.topic_url = _check("topic URL", topic_url)
        self.capability_list_url = (
            _check("Capability List URL", capability_list_url) if capability_list_url else None
        )
        self._token = token
        if max_attempts < 1:
            raise SettingsError(f"max_attempts must be at least 1, got {max_attempts}")
        if timeout <= 0:
            raise SettingsError(f"timeout must be a positive number of seconds, got {timeout}")
        if blocking_deadline <= 0:
            raise SettingsError(f"blocking_deadline must be a positive number of seconds, got {blocking_deadline}")
        if not 0 <= future_skew < math.inf:
            raise SettingsError(f"future_skew must be a number of seconds >= 0, got {future_skew}")
        self.timeout = timeout
        self.blocking_deadline = blocking_deadline
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.future_skew = future_skew
        self.memory = memory if memory is not None else (ChangeMemory(state_path) if state_path else None)
        self.chain: ChangeMemory | LocalChain = self.memory if self.memory is not None else LocalChain()
        self.latest_document: bytes | None = None  # the last accepted document: the topic URI's body
        self._now = now
        self._session = session
        self._owns_session = session is None
        # One publish at a time per publisher, async or blocking alike, so its documents reach
        # the hub in chain order (each one's `from` is the previous one's `until`).
        self._turn = threading.Lock()

    @classmethod
    def from_settings(cls, settings: PublisherSettings, **kwargs: Any) -> Publisher:
        if not settings.topic_url:
            raise SettingsError("a topic URL is required (RSNOTIFY_TOPIC_URL / --topic), got none")
        return cls(
            settings.hub_urls,
            settings.topic_url,
            settings.capability_list_url,
            settings.token,
            timeout=settings.timeout,
            max_attempts=settings.max_attempts,
            retry_delay=settings.retry_delay,
            max_retry_delay=settings.max_retry_delay,
            state_path=settings.state_path,
            max_entries=settings.max_entries,
            max_bytes=settings.max_bytes,
            future_skew=settings.future_skew,
            **kwargs,
        )

    def __repr__(self) -> str:  # the token stays out of logs
        return f"Publisher(hub_url={list(self.hub_urls)!r}, topic_url={self.topic_url!r})"

    # -- session lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self._get_session()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session this publisher opened (not one that was passed in)."""
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
            self._owns_session = True
        return self._session

    # -- building documents ------------------------------------------------------------------

    def prepare(
        self, changes: Iterable[ChangeLike], *, after: datetime | None = None
    ) -> list[ChangeNotification]:
        """The change notifications that carry `changes`, chained after the topic's last `until`
        (or after `after` when given), split at the Sitemap limits. Changes nothing.

        Raises ChangeInputError for a bad change, one dated before the chain's end (a
        notification already claimed to hold every change up to then), or one dated more than
        `future_skew` seconds after now (the chain would move past every change to come).
        """
        last_until = after if after is not None else self.chain.last_until(self.topic_url)
        # A change given without a datetime is dated by the clock, but never before the chain's
        # end: after the clock was set back (NTP correcting a fast clock) it takes that end, so
        # publishing goes on instead of refusing every change until the clock catches up.
        resource_changes = to_resource_changes(changes, self._now if last_until is None else
                                               lambda: max(self._now(), last_until))
        if not resource_changes:
            return []
        self._check_not_future(resource_changes, None)
        first, latest = resource_changes[0].changed_at, resource_changes[-1].changed_at
        assert first is not None and latest is not None  # to_resource_changes dates every change
        if last_until is not None and first < last_until:
            late = [c.loc for c in resource_changes if c.changed_at < last_until]  # type: ignore[operator]
            raise ChangeInputError(
                f"{len(late)} change(s) (first: {late[0]}) dated {format_datetime(first)}, before the end of "
                f"topic {self.topic_url}'s last notification ({format_datetime(last_until)}); expected "
                "datetimes at or after it: that notification already covered up to then"
            )
        try:
            return split_changes(
                resource_changes,
                from_time=last_until if last_until is not None else first,
                until_time=latest,
                up=self.capability_list_url,
                max_entries=self.max_entries,
                max_bytes=self.max_bytes,
            )
        except NotificationError as exc:  # e.g. one change alone larger than max_bytes
            raise ChangeInputError(str(exc)) from None

    def _check_not_future(self, changes: Iterable[ResourceChange], until_time: datetime | None) -> None:
        problems = future_problems(changes, until_time, self._now(), self.future_skew)
        if problems:
            raise ChangeInputError("\n".join(problems))

    # -- publishing --------------------------------------------------------------------------

    async def publish(self, changes: Iterable[ChangeLike]) -> list[str | None]:
        """Publish `changes`; the notification ids the hub(s) gave, one per document and hub.

        Raises ChangeInputError for bad changes (nothing sent) and PublishError when a hub
        refuses (`.accepted` and `.unsent` tell what got through).
        """
        receipts = await self.publish_receipts(changes)
        return [receipt.notification_id for receipt in receipts]

    async def publish_receipts(self, changes: Iterable[ChangeLike]) -> list[Receipt]:
        """Like `publish`, with the whole receipt of each accepted notification."""
        return await self._publish(changes, await self._get_session())

    def publish_blocking(self, changes: Iterable[ChangeLike], *, deadline: float | None = None) -> list[str | None]:
        """`publish` for code without an event loop (it runs one for the call).

        Takes at most `deadline` seconds in all (default: `blocking_deadline`, 10 s): a hub that
        never answers raises HubUnreachableError within it.
        """
        limit = self.blocking_deadline if deadline is None else deadline
        return [r.notification_id for r in self._run_blocking(lambda s: self._publish(changes, s), limit)]

    async def submit(
        self,
        document: ChangeNotification | bytes,
        *,
        hubs: Sequence[str] | None = None,
        attempts: int | None = None,
        session: aiohttp.ClientSession | None = None,
        record: bool = True,
    ) -> list[Receipt]:
        """POST one document to each hub (all of them unless `hubs` is given); a receipt each.

        Bytes are validated as a change notification, then sent as they are. With a change
        memory the document is recorded first (unless `record=False`: the outbox sends what it
        recorded already); without one, the chain advances to its `until` once every hub
        accepted. `attempts` overrides `max_attempts` (the outbox keeps its own, durable retry
        schedule and passes 1). `session`: an aiohttp session of the running loop to use.
        """
        return await self._submit(document, session or await self._get_session(), hubs, attempts, record=record)

    def submit_blocking(
        self, document: ChangeNotification | bytes, *, hubs: Sequence[str] | None = None
    ) -> list[Receipt]:
        """`submit` for code without an event loop (within `blocking_deadline` seconds)."""
        return self._run_blocking(lambda s: self._submit(document, s, hubs), self.blocking_deadline)

    def _run_blocking(
        self, work: Callable[[aiohttp.ClientSession], Awaitable[list[Receipt]]], deadline: float
    ) -> list[Receipt]:
        async def run() -> list[Receipt]:
            async with aiohttp.ClientSession() as session:
                try:
                    return await asyncio.wait_for(work(session), deadline)
                except TimeoutError:
                    raise HubUnreachableError(
                        f"no answer within the {deadline:g} s deadline", ", ".join(self.hub_urls)
                    ) from None

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(run())
        raise RuntimeError(
            "publish_blocking()/submit_blocking() was called inside a running event loop; "
            "use `await publisher.publish(...)` there"
        )

    async def _publish(self, changes: Iterable[ChangeLike], session: aiohttp.ClientSession) -> list[Receipt]:
        # A thread lock, polled: it serves every loop and thread, and a cancelled wait holds nothing.
        while not self._turn.acquire(blocking=False):
            await asyncio.sleep(0.002)
        try:
            return await self._publish_in_turn(changes, session)
        finally:
            self._turn.release()

    def _reserve(self, changes: Iterable[ChangeLike]) -> list[ChangeNotification]:
        """The documents for `changes`; with a change memory, recorded with the chain's advance
        in one transaction before anything is sent."""
        if self.memory is None:
            return self.prepare(changes)
        items = list(changes)
        return self.memory.reserve(self.topic_url, lambda after: self.prepare(items, after=after))

    async def _publish_in_turn(self, changes: Iterable[ChangeLike], session: aiohttp.ClientSession) -> list[Receipt]:
        documents = self._reserve(changes)
        accepted: list[Receipt] = []
        for index, document in enumerate(documents):
            try:
                accepted.extend(await self._submit(document, session, None, record=False))
            except PublishError as exc:
                exc.accepted = accepted
                exc.unsent = [change for doc in documents[index:] for change in doc.changes]
                raise
        return accepted

    async def _submit(
        self,
        document: ChangeNotification | bytes,
        session: aiohttp.ClientSession,
        hubs: Sequence[str] | None,
        attempts: int | None = None,
        *,
        record: bool = True,
    ) -> list[Receipt]:
        if isinstance(document, ChangeNotification):
            notification, body = document, to_xml(document)
        else:
            body, notification = bytes(document), validate_document(bytes(document))
        if record:      # a document handed in; the outbox's own (record=False) were checked when prepared
            self._check_not_future(notification.changes, notification.until_time)
        if record and self.memory is not None:
            self.memory.record_documents(self.topic_url, [notification])
        results = await asyncio.gather(
            *(self._post(session, hub, body, notification, attempts or self.max_attempts) for hub in (hubs or self.hub_urls)),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        for failure in failures:
            if not isinstance(failure, PublishError):
                raise failure  # a bug, not a hub's answer
        if failures:
            for other in failures[1:]:
                log.error("publish to %s failed too: %s", getattr(other, "hub_url", "?"), other)
            raise failures[0]
        if isinstance(self.chain, LocalChain):
            self.chain.advance(self.topic_url, notification.until_time)
        self.latest_document = body
        return [r for r in results if isinstance(r, Receipt)]

    async def _post(
        self,
        session: aiohttp.ClientSession,
        hub: str,
        body: bytes,
        notification: ChangeNotification,
        max_attempts: int,
    ) -> Receipt:
        """POST `body` to one hub; retry 5xx, 408/425/429 and connection errors with backoff."""
        # the same document is the same publish: a hub that stored it once answers a repeat (a
        # retry here, or the outbox's after a restart) with the first id instead of storing it twice
        headers = {**self._headers(hub), IDEMPOTENCY_HEADER: hashlib.sha256(body).hexdigest()}
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        error: PublishError | None = None
        for attempt in range(1, max_attempts + 1):
            retry_after: float | None = None
            try:
                async with session.post(
                    hub, data=body, headers=headers, timeout=timeout, allow_redirects=False
                ) as response:
                    text = await _read_text(response)
                    if 200 <= response.status < 300:
                        receipt = _receipt(response, text, hub, self.topic_url, notification)
                        log.info(
                            "published %s (%d changes) to %s for %s: %s",
                            receipt.notification_id, receipt.change_count, hub, self.topic_url, response.status,
                        )
                        return receipt
                    error = PublishError(response.status, _reason(response, text), hub, attempts=attempt)
                    if not _is_transient(response.status):
                        log.info("hub %s refused a notification for %s: %s", hub, self.topic_url, error.reason)
                        raise error
                    retry_after = _retry_after(response)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                error = HubUnreachableError(_describe(exc), hub, attempts=attempt)
            if attempt < max_attempts:
                delay = self._backoff(attempt, retry_after)
                log.info("hub %s: %s; retry %d in %.2fs", hub, error, attempt, delay)
                await asyncio.sleep(delay)
        assert error is not None
        raise error

    def _headers(self, hub: str) -> dict[str, str]:
        links = [(self.topic_url, "self"), (hub, "hub")]
        if self.capability_list_url:
            links.append((self.capability_list_url, "resourcesync"))
        headers = {"Content-Type": XML_CONTENT_TYPE, "Link": build_link_header(links)}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter (so many publishers don't retry in step), capped."""
        return backoff_delay(attempt, self.retry_delay, self.max_retry_delay, retry_after=retry_after)


# -- helpers -------------------------------------------------------------------------------


def _check(name: str, url: str) -> str:
    try:
        return check_url(name, url)
    except WireError as exc:
        raise SettingsError(str(exc)) from None


def validate_document(body: bytes) -> ChangeNotification:
    """The change notification in `body`; ChangeInputError listing every problem otherwise."""
    try:
        return parse_notification(body)
    except ValidationError as exc:
        raise ChangeInputError("the document is not a valid change notification:\n" + "\n".join(exc.problems)) from None
    except DocumentParseError as exc:
        raise ChangeInputError(f"the document is not a change notification: {exc}") from None


def _is_transient(status: int) -> bool:
    return status >= 500 or status in _RETRY_STATUSES


async def _read_text(response: aiohttp.ClientResponse) -> str:
    raw = await response.content.read(64 * 1024)  # a hub's answer is short; never read a huge one whole
    return raw.decode(response.charset or "utf-8", errors="replace")


def _reason(response: aiohttp.ClientResponse, text: str) -> str:
    text = text.strip()
    if 300 <= response.status < 400:
        where = response.headers.get("Location", "?")
        return f"redirect to {where}; expected 200 (publish to the final hub URL instead)"
    return text[:_MAX_REASON_CHARS] if text else (response.reason or "no reason given")


def _retry_after(response: aiohttp.ClientResponse) -> float | None:
    value = response.headers.get("Retry-After", "").strip()
    return float(value) if value.isdigit() else None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out waiting for the hub"
    return describe_client_error(exc)  # the message names the hub already


def _receipt(
    response: aiohttp.ClientResponse, text: str, hub: str, topic: str, notification: ChangeNotification
) -> Receipt:
    """Read the hub's acknowledgement liberally: JSON body, then the id header, then plain text."""
    notification_id: str | None = None
    sequence: int | None = None
    if "json" in (response.content_type or ""):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            if data.get("notification_id") is not None:
                notification_id = str(data["notification_id"])
            if isinstance(data.get("sequence"), int):
                sequence = data["sequence"]
    notification_id = notification_id or response.headers.get(NOTIFICATION_ID_HEADER) or _plain_id(response, text)
    if sequence is None and (header := response.headers.get(SEQUENCE_HEADER, "")).strip().isdigit():
        sequence = int(header)
    return Receipt(
        notification_id=notification_id,
        hub_url=hub,
        topic_url=topic,
        status=response.status,
        sequence=sequence,
        from_time=notification.from_time,
        until_time=notification.until_time,
        change_count=len(notification.changes),
    )


def _plain_id(response: aiohttp.ClientResponse, text: str) -> str | None:
    """A plain-text body that is one short token is taken as the id."""
    if "json" in (response.content_type or "") or "html" in (response.content_type or ""):
        return None
    token = text.strip()
    return token if token and len(token) <= 200 and not any(c.isspace() for c in token) else None


__all__ = ["XML_CONTENT_TYPE", "Publisher", "Receipt", "ResourceChange", "utc_now", "validate_document"]
