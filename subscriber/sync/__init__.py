"""Destination sync: keep a folder equal to a Source (baseline, live notifications, catch-up
after any gap, audit). `rsnotify sync` and `rsnotify audit` are thin layers over these.

    engine = SyncEngine("mirror/", capability_list="https://src.example.org/capabilitylist.xml",
                        push_settings=SubscriberSettings(listen_port=8081))
    engine.events.listeners.append(print)
    await engine.open()
    await engine.run(stop_event)        # or: await engine.sync_once() / await engine.audit(deep=True)
    await engine.close()

File names in DIR are the Source's own (each loc path segment percent-decoded once); names no
file system can hold get the reversible `%%` escape described in sink.py and the README.
"""
from .context import SyncOptions
from .engine import SyncEngine
from .events import SyncEvent
from .outcomes import ChangeOutcome, FetchOutcome, InboxStatus, Refusal, ResourceState
from .sink import FolderSink
from .state import ResourceRecord, SyncState

__all__ = ["ChangeOutcome", "FetchOutcome", "FolderSink", "InboxStatus", "Refusal", "ResourceRecord", "ResourceState",
           "SyncEngine", "SyncEvent", "SyncOptions", "SyncState"]
