"""Reading a subscription's diagnostics from an rsnotify hub: its status, lease, cursor and recent
delivery attempts, as the hub sees them.

A subscription with a secret signs `"{sid}\\n{timestamp}"` (GET /diagnostics/{sid}); one without
asks the hub (POST /diagnostics) to send a link to its callback (hub.mode=diagnostics), which
the subscription client's lifecycle keeps, and reads that link. sid is the hub's id of (topic, callback).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin

import aiohttp

from rsnotify.websub import SIGNATURE_HEADER, sign

from .errors import DiagnosticsError
from .lifecycle import Lifecycle
from .store import Subscription, SubscriptionStore

TIMESTAMP_HEADER = "X-RSNotify-Timestamp"


def hub_subscription_id(topic: str, callback: str) -> str:
    """The hub's id of a subscription: the first 32 hex digits of sha256(topic + "\\n" + callback)."""
    return hashlib.sha256(f"{topic}\n{callback}".encode()).hexdigest()[:32]


def diagnostics_url(subscription: Subscription) -> str:
    return urljoin(subscription.hub, f"diagnostics/{hub_subscription_id(subscription.topic, subscription.callback)}")


async def read_diagnostics(session: aiohttp.ClientSession, lifecycle: Lifecycle, subscription: Subscription,
                           *, link_timeout: float = 30.0) -> dict[str, Any]:
    """The hub's JSON report on `subscription`; DiagnosticsError when the hub does not give it.

    Without a secret the callback must be served while this waits (up to `link_timeout`
    seconds) for the hub's link; a link received earlier is used again while it works.
    """
    if subscription.secret is not None:
        sid = hub_subscription_id(subscription.topic, subscription.callback)
        timestamp = str(int(time.time()))
        headers = {TIMESTAMP_HEADER: timestamp,
                   SIGNATURE_HEADER: sign(f"{sid}\n{timestamp}".encode(), subscription.secret)}
        return await _get(session, diagnostics_url(subscription), headers, subscription)
    link = lifecycle.diagnostics_links.get(subscription.id)
    if link is not None:
        try:
            return await _get(session, link, {}, subscription)
        except DiagnosticsError as exc:
            if exc.status != 401:
                raise
            lifecycle.diagnostics_links.pop(subscription.id, None)  # expired: ask for a new one
    return await _get(session, await _request_link(session, lifecycle, subscription, link_timeout), {}, subscription)


async def _request_link(session: aiohttp.ClientSession, lifecycle: Lifecycle, subscription: Subscription,
                        timeout: float) -> str:
    waiter = lifecycle.expect(subscription.id, "diagnostics")
    try:
        url = urljoin(subscription.hub, "diagnostics")
        form = {"hub.topic": subscription.topic, "hub.callback": subscription.callback}
        try:
            async with session.post(url, data=form, allow_redirects=False) as response:
                reply = (await response.text(errors="replace"))[:500].strip()
                if response.status != 202:
                    raise DiagnosticsError(f"hub {subscription.hub} refused a diagnostics link for "
                                           f"{subscription.topic}: {response.status} {reply}", status=response.status)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise DiagnosticsError(f"cannot reach hub {subscription.hub} for diagnostics: "
                                   f"{exc or type(exc).__name__}") from exc
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            raise DiagnosticsError(
                f"hub {subscription.hub} sent no diagnostics link to {subscription.callback} within {timeout:g} s "
                "(it sends at most one a minute, only for a subscription it holds, and the callback must be "
                "served meanwhile)") from None
    finally:
        lifecycle.forget_waiter(subscription.id, "diagnostics", waiter)
    return lifecycle.diagnostics_links[subscription.id]


async def _get(session: aiohttp.ClientSession, url: str, headers: dict[str, str],
               subscription: Subscription) -> dict[str, Any]:
    try:
        async with session.get(url, headers=headers, allow_redirects=False) as response:
            text = await response.text(errors="replace")
            status = response.status
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise DiagnosticsError(f"cannot reach hub {subscription.hub} for diagnostics: "
                               f"{exc or type(exc).__name__}") from exc
    if status != 200:
        raise DiagnosticsError(f"hub {subscription.hub} answered {status} to the diagnostics request for "
                               f"{subscription.topic}: {text[:500].strip()}", status=status)
    try:
        report = json.loads(text)
    except ValueError as exc:
        raise DiagnosticsError(f"hub {subscription.hub} answered the diagnostics request with something "
                               f"other than JSON: {text[:200]!r}") from exc
    if not isinstance(report, dict):
        raise DiagnosticsError(f"hub {subscription.hub} answered the diagnostics request with JSON that is "
                               f"not an object: {text[:200]!r}")
    return report


async def diagnose_all(session: aiohttp.ClientSession, lifecycle: Lifecycle, subscriptions: list[Subscription],
                       *, signed_only: bool = False) -> list[tuple[Subscription, dict[str, Any] | DiagnosticsError]]:
    """The hub's report (or why there is none) for each subscription that has not ended.

    `signed_only`: for callers that do not serve the callback (a command line), a subscription
    without a secret gets a DiagnosticsError instead of a link request nobody would receive.
    """
    results: list[tuple[Subscription, dict[str, Any] | DiagnosticsError]] = []
    for subscription in subscriptions:
        if subscription.is_ended:
            continue
        if signed_only and subscription.secret is None:
            results.append((subscription, DiagnosticsError(
                "the subscription has no secret, so only its callback can receive the hub's diagnostics "
                "link; ask from the running application (Subscriber.diagnostics)")))
            continue
        try:
            results.append((subscription, await read_diagnostics(session, lifecycle, subscription)))
        except DiagnosticsError as exc:
            results.append((subscription, exc))
    return results


def status_line(subscription: Subscription, outcome: dict[str, Any] | DiagnosticsError) -> dict[str, Any]:
    """One JSON object for `rsnotify subscribe --status`: the local record and the hub's view."""
    line: dict[str, Any] = {"topic": subscription.topic, "hub": subscription.hub, "callback": subscription.callback,
                            "status": subscription.status,
                            "expires_at": subscription.expires_at.isoformat() if subscription.expires_at else None}
    if isinstance(outcome, DiagnosticsError):
        line["error"] = str(outcome)
    else:
        line["at_hub"] = outcome
    return line


async def print_status(state_file: str, store: SubscriptionStore, echo: Callable[..., Any]) -> int:
    """`rsnotify subscribe --status`: one JSON line per subscription in `store`; 0 when the hub
    answered for every one, 1 otherwise (the reason in the line's "error")."""
    subscriptions = [s for s in await store.all() if not s.is_ended]
    if not subscriptions:
        echo(f"rsnotify subscribe: no subscription in {state_file}", err=True)
        return 1
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        results = await diagnose_all(session, Lifecycle(), subscriptions, signed_only=True)
    for subscription, outcome in results:
        echo(json.dumps(status_line(subscription, outcome), ensure_ascii=False))
    return 0 if all(not isinstance(outcome, DiagnosticsError) for _, outcome in results) else 1
