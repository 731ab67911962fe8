"""Worker liveness: each worker beats a heartbeat from a thread of its own, and every claim and
taken verification names the worker that holds it. A worker whose heartbeat ran out is dead:
others take its subscriptions over at once (claims.py takes a dead worker's lock) and put its
verifications back in line (store.liveness.bury_dead_workers), within heartbeat_ttl of its death.

The beat runs in a thread, not on the event loop: a worker whose loop is busy (hundreds of
slow subscribers, a large notification) is slow, not dead, and keeps its claims.
"""
from __future__ import annotations

import logging
import threading
import time

import redis as redis_sync
from redis.exceptions import RedisError

from .. import store

log = logging.getLogger(__name__)

BEATS_PER_TTL = 4          # beats within one heartbeat_ttl: three may be late before others take over


class Heartbeat:
    """Keeps this worker's heartbeat alive until `stop`, which removes it: a clean exit needs no
    waiting for the others to notice."""

    def __init__(self, connection: redis_sync.Redis, wid: str, ttl: float) -> None:
        self.connection, self.wid, self.ttl = connection, wid, ttl
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rsnotify-heartbeat", daemon=True)
        self._failing = False

    def start(self) -> None:
        """Beat once now (so the claims taken next are valid), then keep beating in the thread."""
        self.beat()
        self._thread.start()

    def beat(self) -> None:
        store.liveness.beat(self.connection, self.wid, int(self.ttl * 1000), int(time.time() * 1000))

    def _run(self) -> None:
        while not self._stop.wait(self.ttl / BEATS_PER_TTL):
            try:
                self.beat()
                if self._failing:
                    log.info("worker %s: heartbeat written again", self.wid)
                self._failing = False
            except (RedisError, OSError) as exc:
                if not self._failing:
                    log.warning("worker %s: cannot write its heartbeat (%s); other workers take its "
                                "subscriptions over if this lasts %g s", self.wid, exc, self.ttl)
                self._failing = True

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        try:
            store.liveness.forget_worker(self.connection, self.wid)
        except (RedisError, OSError):
            pass                      # Redis is gone: the heartbeat runs out by itself
        finally:
            self.connection.close()


def bury_dead_workers(connection: redis_sync.Redis, ttl: float, now: float | None = None) -> list[tuple[str, int]]:
    """The workers that stopped beating more than `ttl` ago, forgotten, and their taken
    verifications back in line: (worker id, verifications put back) for each."""
    now = time.time() if now is None else now
    return store.liveness.bury_dead_workers(connection, int((now - ttl) * 1000))
