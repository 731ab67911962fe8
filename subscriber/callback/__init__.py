"""The callback endpoint: the core that answers a hub, and its framework adapters."""
