"""Destination sync: keep a folder equal to a Source (baseline, live notifications, catch-up
after any gap, audit). `rsnotify sync` and `rsnotify audit` are thin layers over these.

    engine = SyncEngine("mirror/", capability_list="https://src.example.org/capabilitylist.xml",
                        push_settings=SubscriberSettings(listen_port=8081))
    engine.events.listeners.append(print)
    await engine.open()
    await engine.run(stop_event)        # or: await engine.sync_once() / await engine.audit(deep=True)
    await engine.close()
"""
from .context import SyncOptions
from .engine import SyncEngine
from .events import SyncEvent
from .sink import FolderSink
from .state import ResourceRecord, SyncState

__all__ = ["FolderSink", "ResourceRecord", "SyncEngine", "SyncEvent", "SyncOptions", "SyncState"]
