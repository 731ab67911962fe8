"""A client of a hub's admin JSON API (`/admin/...`): the HTTP calls `rsnotify admin` makes.

It speaks only HTTP and knows only the API's paths, never the hub's code, so it runs from any
machine with the plain install. aiohttp's errors become AdminError here, at one boundary.
"""
from __future__ import annotations

import json
from types import TracebackType
from typing import Any, Self
from urllib.parse import urljoin

import aiohttp

from .errors import RsnotifyError
from .neterrors import describe_client_error

TIMEOUT = 10.0   # s for one admin request


class AdminError(RsnotifyError):
    """The hub refused an admin request or could not be reached.

    `status`: the hub's HTTP status (None when there was no answer); `reason`: the hub's reply
    text (its own explanation: bad token, unknown subscription, ...) or the connection error.
    """

    def __init__(self, status: int | None, reason: str, url: str) -> None:
        self.status = status
        self.reason = reason
        self.url = url
        where = f"the hub at {url}"
        super().__init__(f"{where} answered {status}: {reason}" if status is not None
                         else f"cannot reach {where}: {reason}")


class AdminClient:
    """`async with AdminClient(hub_url, token=...) as admin: await admin.overview()`.

    `hub_url` is the hub's URL (its --public-url, or where it listens); the admin API lives
    under `admin/` beneath it. Without `token` the hub answers only loopback clients.
    """

    def __init__(self, hub_url: str, *, token: str | None = None, timeout: float = TIMEOUT) -> None:
        if not hub_url.startswith(("http://", "https://")):
            raise AdminError(None, f"the hub URL must start with http:// or https://, got {hub_url!r}", hub_url)
        self.hub_url = hub_url if hub_url.endswith("/") else hub_url + "/"
        self._token = token
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout))
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        if self._session is not None:
            await self._session.close()

    # --- reading ---------------------------------------------------------------------------

    async def overview(self) -> dict[str, Any]:
        return await self._call("GET", "admin/overview")

    async def topics(self, *, url: str | None = None, search: str | None = None, offset: int = 0,
                     limit: int = 100) -> dict[str, Any]:
        query = {"offset": offset, "limit": limit, **({"url": url} if url else {}),
                 **({"search": search} if search else {})}
        return await self._call("GET", "admin/topics", query)

    async def subscriptions(self, *, topic: str | None = None, callback: str | None = None,
                            state: str | None = None, trouble: bool = False, search: str | None = None,
                            offset: int = 0, limit: int = 100) -> dict[str, Any]:
        query: dict[str, Any] = {"offset": offset, "limit": limit}
        for name, value in (("topic", topic), ("callback", callback), ("state", state), ("search", search)):
            if value:
                query[name] = value
        if trouble:
            query["trouble"] = 1
        return await self._call("GET", "admin/subscriptions", query)

    async def subscription(self, sid: str) -> dict[str, Any]:
        return await self._call("GET", f"admin/subscriptions/{sid}")

    async def dead_letters(self, sid: str) -> dict[str, Any]:
        return await self._call("GET", f"admin/subscriptions/{sid}/dead-letters")

    # --- acting ----------------------------------------------------------------------------

    async def pause(self, sid: str) -> dict[str, Any]:
        return await self._call("POST", f"admin/subscriptions/{sid}/pause")

    async def resume(self, sid: str) -> dict[str, Any]:
        """Deliveries start again now; on an active subscription this clears its retry backoff."""
        return await self._call("POST", f"admin/subscriptions/{sid}/resume")

    async def retry(self, sid: str) -> dict[str, Any]:
        """Its pending retry is due now instead of when its backoff ends."""
        return await self._call("POST", f"admin/subscriptions/{sid}/retry")

    async def resend(self, sid: str, notification_id: str | None = None) -> dict[str, Any]:
        """Queue one dead letter (or, without `notification_id`, all of them) for sending again."""
        path = f"admin/subscriptions/{sid}/dead-letters/" + (f"{notification_id}/resend" if notification_id else "resend")
        return await self._call("POST", path)

    # --- the one HTTP boundary -------------------------------------------------------------

    async def _call(self, method: str, path: str, query: dict[str, Any] | None = None) -> Any:
        assert self._session is not None, "use AdminClient in `async with`"
        url = urljoin(self.hub_url, path)
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        # Actions go as JSON requests: a browser cannot send one cross-site without asking first,
        # which is how the hub tells an operator's tool from a forged form.
        body = b"{}" if method != "GET" else None
        if body is not None:
            headers["Content-Type"] = "application/json"
        params = {k: str(v) for k, v in (query or {}).items()}
        try:
            async with self._session.request(method, url, params=params, data=body, headers=headers,
                                             allow_redirects=False) as response:
                text = await response.text(errors="replace")
                if response.status >= 300:
                    raise AdminError(response.status, _reason(text), self.hub_url)
                try:
                    return json.loads(text)
                except ValueError:
                    raise AdminError(response.status, f"expected JSON from {url}, got {text[:120]!r} "
                                     "(is this a rsnotify hub?)", self.hub_url) from None
        except TimeoutError as exc:
            raise AdminError(None, f"no answer within {self._timeout:g} s", self.hub_url) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise AdminError(None, describe_client_error(exc), self.hub_url) from exc


def _reason(text: str) -> str:
    """The hub's refusal in one line (it answers text/plain, one problem a line)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return "; ".join(lines)[:500] or "(no reason given)"
