"""Flask-WebSub's hub for the peer comparison. Runs under bench/.peer's own Python (never imported
by rsnotify or the benchmark): `python peer_app.py PORT` serves the hub at /hub, and
`python -m celery -A peer_app worker` runs its Celery tasks. PEER_BROKER (Redis URL) and
PEER_DB (its SQLite subscription store) come from the environment the benchmark sets.
"""
import os
import sys

from celery import Celery
from flask import Flask
from flask_websub.hub import Hub, SQLite3HubStorage

celery = Celery("peer_app", broker=os.environ["PEER_BROKER"])
celery.conf.update(task_ignore_result=True, worker_hijack_root_logger=False)
app = Flask(__name__)
app.config["PUBLISH_SUPPORTED"] = True  # thin pings (hub.mode=publish): the only way to publish to it
hub = Hub(SQLite3HubStorage(os.environ["PEER_DB"]), celery, **app.config)
app.register_blueprint(hub.build_blueprint(url_prefix="/hub"))

if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(sys.argv[1]), threaded=True)
