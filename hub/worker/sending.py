"""Sending one notification to one subscriber (how long to wait before trying again is rsnotify.backoff)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from rsnotify.websub import SIGNATURE_HEADER, sign

from ..logs import redact_callback, redact_in
from .context import WorkerContext
from .runs import Item, SubRun

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Response:
    """What one POST to a callback came to."""

    status: int | None            # None: no HTTP answer (timeout, connection refused, reset...)
    error: str
    seconds: float


async def send(ctx: WorkerContext, run: SubRun, item: Item) -> Response:
    """POST one notification to the subscription's exact callback: the exact body, its headers,
    the signature when there is a secret. Never follows redirects; bounded in time and size.

    Whatever keeps one notification from going to one subscriber is that attempt's failure
    (retried, then a dead letter), never a stuck cursor or a dead run."""
    if item.problem:
        return Response(None, item.problem, 0.0)
    try:
        headers = item.headers
        if run.secret is not None:
            headers = headers.plus((SIGNATURE_HEADER, sign(item.entry.body, run.secret,
                                                           ctx.settings.signature_algorithm)))
        started = time.perf_counter()
        # the answer's body is read (at most max_response_bytes) only so the connection can carry the next POST
        answer = await ctx.outbound.request("POST", run.url, headers, item.entry.body, ctx.deliveries.limits)
        return Response(answer.status, answer.error, time.perf_counter() - started)
    except Exception as exc:  # noqa: BLE001 - a request that cannot even be built fails this attempt only
        log.warning("could not send %s to %s: %s: %s", item.entry.notification_id, redact_callback(run.callback),
                    type(exc).__name__, redact_in(exc, run.callback))
        return Response(None, f"cannot be sent: {type(exc).__name__}: {exc}", 0.0)
