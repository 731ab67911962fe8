"""The hub's worker process: an RQ worker whose jobs verify subscriptions, fetch thin-pinged
topics and fan notifications out to subscribers, plus its periodic maintenance.

It never imports the web process; both share the core at hub/ (store, keys, records, enqueue).
"""
