"""A Subscriber closes the SQLite store it opened itself: short-lived ones (a script, a test
helper reading the state) do not leave a connection and its files open each."""
from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path

from rsnotify.subscriber.client import Subscriber
from rsnotify.subscriber.settings import SubscriberSettings
from rsnotify.subscriber.store import Subscription

CALLS = 200


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_closed_subscriber_leaves_no_sqlite_connection_open(tmp_path: Path) -> None:
    settings = SubscriberSettings(state_file=str(tmp_path / "subscriptions.db"))

    async def read() -> list[Subscription]:
        subscriber = Subscriber(settings=settings)
        try:
            return await subscriber.subscriptions()
        finally:
            await subscriber.close()

    asyncio.run(read())         # the first one creates the file
    # closed by close(), not by the garbage collector finding the Subscriber unreachable later
    gc.disable()
    try:
        before = open_files()
        for _ in range(CALLS):
            assert asyncio.run(read()) == []
        after = open_files()
    finally:
        gc.enable()
    assert after - before < 3, f"{after - before} files left open by {CALLS} subscribers"

