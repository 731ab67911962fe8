"""The hub's web process: the aiohttp application, its endpoints and the operators' views.

It stores what arrives and queues jobs by name (hub/enqueue.py); it never imports the worker.
"""
