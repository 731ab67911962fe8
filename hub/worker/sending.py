"""Sending one notification to one subscriber (how long to wait before trying again is rsnotify.backoff)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import aiohttp

from rsnotify.websub import SIGNATURE_HEADER, sign

from ..netguard import describe_refusal
from .context import WorkerContext
from .runs import Item, SubRun


@dataclass(frozen=True, slots=True)
class Response:
    """What one POST to a callback came to."""

    status: int | None            # None: no HTTP answer (timeout, connection refused, reset...)
    error: str
    seconds: float


async def send(ctx: WorkerContext, run: SubRun, item: Item) -> Response:
    """POST one notification to the subscription's exact callback: the exact body, its headers,
    the signature when there is a secret. Never follows redirects; bounded in time and size."""
    headers = item.headers
    if run.secret is not None:
        headers = {**headers, SIGNATURE_HEADER: sign(item.entry.body, run.secret, ctx.settings.signature_algorithm)}
    started = time.perf_counter()
    status: int | None = None
    error = ""
    try:
        async with ctx.session.post(run.url, data=item.payload or item.entry.body, headers=headers,
                                    allow_redirects=False, timeout=ctx.deliveries.timeout) as response:
            status = response.status
            remaining = ctx.settings.max_response_bytes
            content = response.content
            # read a little of the answer, then ignore it (a short answer is all there at once:
            # at_eof spares a second read that would only find the end)
            while remaining > 0 and not content.at_eof():
                chunk = await content.read(remaining)
                if not chunk:
                    break
                remaining -= len(chunk)
    except TimeoutError:
        if status is None:
            error = f"no answer within {ctx.settings.delivery_timeout:g} s"
    except aiohttp.ClientError as exc:
        if status is None:
            error = describe_refusal(exc) or f"{type(exc).__name__}: {exc}"
    return Response(status, error, time.perf_counter() - started)
