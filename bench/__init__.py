"""rsnotify benchmarks: figures printed by `python -m bench`, never asserted by tests.

Scenarios: ceiling (a plain aiohttp client straight to the sinks), fanout, latency, ingest,
subscribe, scale, and an optional peer comparison with Flask-WebSub. See `python -m bench --help`.
"""
