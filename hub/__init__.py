"""The hub: an aiohttp WebSub hub with a Redis store and RQ delivery workers.

Three layers, arrows pointing down only:

- entry points: `cli` (`rsnotify hub`, `rsnotify worker`) and `embedded` (a whole hub from one
  command: embedded Redis, child workers, the web server);
- `web/` (the web process: app, endpoint, auth, admin API, diagnostics, metrics, status page)
  and `worker/` (the worker process: RQ job bodies, fan-out, claims, verification, fetch,
  maintenance), which never import each other;
- the core they share: settings, errors, keys (every Redis key), records (what Redis holds, as
  Python values), store (every Redis operation outside a delivery claim), lua, enqueue (jobs
  queued by their dotted paths, so only RQ imports the job bodies), crypto, netguard,
  callbacks, logs, redis_server (the embedded Redis-compatible server launcher).
"""
