"""`free_port`: the one the embedded Redis launcher uses, so tests and the product pick ports alike."""
from __future__ import annotations

from rsnotify.hub.redis_server import free_port

__all__ = ["free_port"]
