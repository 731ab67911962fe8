"""The hub: an aiohttp WebSub hub with a Redis store and RQ delivery workers."""
