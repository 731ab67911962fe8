"""Worker liveness in Redis: each worker's heartbeat key and its entry in the list of workers;
finding the dead ones and putting the verifications they had taken back in line. Synchronous:
the heartbeat beats from a thread of its own, and the maintenance looks from a thread too."""
from __future__ import annotations

import redis as redis_sync

from ..keys import verify_pending_key, verify_taken_key, worker_alive_key, workers_key
from ..lua import Script
from ..records import text

# KEYS: alive, workers ; ARGV: wid, ttl_ms, now_ms. One beat.
_BEAT = Script("""
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
""")

# KEYS: workers, line ; ARGV: before_ms, alive key prefix, alive key suffix, taken key prefix.
# Workers whose last beat is older than before_ms and whose heartbeat key is gone are dead: they
# leave the list, and the challenges they had taken go back to the head of the line.
# Returns {wid, challenges put back, ...}.
_BURY = Script("""
local out = {}
for _, wid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do
  if redis.call('EXISTS', ARGV[2] .. wid .. ARGV[3]) == 0 then
    redis.call('ZREM', KEYS[1], wid)
    local taken, moved = ARGV[4] .. wid, 0
    while redis.call('RPOPLPUSH', taken, KEYS[2]) do moved = moved + 1 end
    out[#out + 1] = wid
    out[#out + 1] = moved
  end
end
return out
""")


def beat(connection: redis_sync.Redis, wid: str, ttl_ms: int, now_ms: int) -> None:
    """Worker `wid` lives for `ttl_ms` more (its claims and taken verifications stay its own)."""
    _BEAT.run_sync(connection, [worker_alive_key(wid), workers_key()], [wid, ttl_ms, now_ms])


def forget_worker(connection: redis_sync.Redis, wid: str) -> None:
    """A worker that stops cleanly: its heartbeat goes at once (nobody waits for it to run out)."""
    with connection.pipeline(transaction=True) as pipe:
        pipe.delete(worker_alive_key(wid))
        pipe.zrem(workers_key(), wid)
        pipe.execute()


def bury_dead_workers(connection: redis_sync.Redis, before_ms: int) -> list[tuple[str, int]]:
    """The workers whose last beat is older than `before_ms` and whose heartbeat ran out: forgotten,
    their taken verifications back in line. Returns (worker id, verifications put back) each."""
    alive_prefix, alive_suffix = worker_alive_key("|").split("|")
    answer = _BURY.run_sync(connection, [workers_key(), verify_pending_key()],
                            [before_ms, alive_prefix, alive_suffix, verify_taken_key("")])
    return [(text(wid), int(moved)) for wid, moved in zip(answer[::2], answer[1::2])]
