"""The event loop every rsnotify process runs: uvloop when it is installed (the hub extra
brings it), else asyncio's own. Same behaviour, less CPU per request and per delivery."""
from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # optional: a Destination or publisher installed without the hub extra has none
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on new_event_loop()."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def stop_on_signals() -> asyncio.Event:
    """An event SIGINT or SIGTERM sets, on the running loop: a server's way to stop cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return stop
