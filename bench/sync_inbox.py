"""The Destination's callback endpoint alone, for the inbox-rate figure, run as its own process:
`python -m bench.sync_inbox PORT DIR`. It serves `rsnotify sync`'s Push (callback core with
ack after the inbox write) for one stored, active, unsigned subscription, and prints its
callback URL once it listens."""
from __future__ import annotations

import asyncio
import signal
import sys

from rsnotify.subscriber.settings import SubscriberSettings
from rsnotify.subscriber.store import Subscription
from rsnotify.subscriber.sync.push import Push
from rsnotify.subscriber.sync.state import SyncState

SUBSCRIPTION_ID = "benchinboxsubscription0001"


async def serve(port: int, folder: str) -> None:
    state = SyncState.in_dir(folder)
    push = Push(state, SubscriberSettings(listen_port=port, remembered_ids=50), asyncio.Event())
    base = await push.start()
    await push.store.put(Subscription(id=SUBSCRIPTION_ID, topic="http://127.0.0.1:9/changes",
                                      hub="http://127.0.0.1:9/", callback=f"{base}/{SUBSCRIPTION_ID}",
                                      status="active"))
    print(f"{base}/{SUBSCRIPTION_ID}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await push.close(unsubscribe=False)
    state.close()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), sys.argv[2]))
