"""How the subscriber toolkit runs an application's hook: a coroutine function on the loop, a
plain function in a worker thread (so it never blocks the loop), its errors logged, or, while
a hub waits for the answer, turned into HandlerFailedError so the hub is told to retry.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

log = logging.getLogger(__name__)

Hook = Callable[..., Awaitable[None] | None]


class HandlerFailedError(Exception):
    """A hook raised while the hub waited for the answer (ack="after_handler")."""


async def call_hook(hook: Hook, *args: Any, what: str, raising: bool = False) -> None:
    """Run one hook. Errors are logged; with `raising` (the hub still waits for the answer)
    they become HandlerFailedError."""
    try:
        if inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(type(hook).__call__):
            await cast(Awaitable[None], hook(*args))
        else:
            result = await asyncio.to_thread(hook, *args)
            if inspect.isawaitable(result):
                await result
    except Exception as exc:
        if not raising:
            log.exception("%s failed", what)
            return
        log.warning("%s failed; the hub is asked to deliver again", what, exc_info=True)
        raise HandlerFailedError(f"{what} raised {type(exc).__name__}") from exc


class Hooks:
    """Hooks by event, each event's run in registration order."""

    def __init__(self, events: Iterable[str], error: Callable[[str], Exception]) -> None:
        self.by_event: dict[str, list[Hook]] = {event: [] for event in events}
        self._error = error
        self._background: set[asyncio.Task[Any]] = set()

    def add(self, event: str, hook: Hook) -> Hook:
        """Call `hook` on `event`, after those added before; returns it."""
        if event not in self.by_event:
            raise self._error(f"hook event must be one of {', '.join(self.by_event)}, got {event!r}")
        self.by_event[event].append(hook)
        return hook

    def fire(self, event: str, *args: Any) -> None:
        """Run the hooks of `event` in the background; their errors are logged."""
        for hook in self.by_event[event]:
            task = asyncio.ensure_future(call_hook(hook, *args, what=f"{event} hook"))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for the hooks fired so far."""
        if self._background:
            await asyncio.wait_for(asyncio.gather(*self._background), timeout)
