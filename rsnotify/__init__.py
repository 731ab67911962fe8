"""rsnotify: the shared vocabulary of ResourceSync change notifications over WebSub.

The hub, publisher and subscriber packages all stand on this one; it imports none of them.
"""
from __future__ import annotations

__version__ = "0.1.0"
