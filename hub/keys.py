"""Every Redis key of the hub, under one prefix, so the whole key space reads in one screen; and
the ids that name topics and subscriptions in those keys.

Keys come only from these functions (store, claims and the reports read through them). RQ's own
keys are named here too, because the hub reads them for /health and /metrics.
"""
from __future__ import annotations

import hashlib

PREFIX = "rsnotify:"

# --- keys ---------------------------------------------------------------------------------


def topics_key() -> str:                    # set of topic ids
    return f"{PREFIX}topics"


def topic_key(tid: str) -> str:             # hash: url, created (epoch s)
    return f"{PREFIX}topic:{tid}"


def topic_log_key(tid: str) -> str:         # stream: body, ctype, rs, seq, at (ms); entry id = notification id
    return f"{PREFIX}topic:{tid}:log"


def topic_seq_key(tid: str) -> str:         # INCR counter: the entries' seq 1, 2, 3...
    return f"{PREFIX}topic:{tid}:seq"


def topic_subs_key(tid: str) -> str:        # set of active subscription ids of the topic
    return f"{PREFIX}topic:{tid}:subs"


def topic_subs_changes_key(tid: str) -> str:  # INCR counter: bumped whenever topic_subs_key gains or loses a member
    return f"{PREFIX}topic:{tid}:subs-changes"


def sub_key(sid: str) -> str:               # hash: see records.Subscription
    return f"{PREFIX}sub:{sid}"


def leases_key() -> str:                    # zset: subscription id -> expires (epoch s)
    return f"{PREFIX}leases"


def intent_key(challenge: str) -> str:      # hash: pending intent (records.Intent); TTL; single use
    return f"{intents_prefix()}{challenge}"


def intents_prefix() -> str:                # intent_key without its challenge (a script that takes challenges builds it)
    return f"{PREFIX}intent:"


def renewals_key() -> str:                  # INCR counter: bumped by each renewal that sets or drops a secret
    return f"{PREFIX}renewals"


def sub_lock_key(sid: str) -> str:          # owner lock of a subscription's deliveries (SET NX PX)
    return f"{PREFIX}sub:{sid}:lock"


def sub_dead_key(sid: str) -> str:          # hash: notification id -> dead letter (JSON)
    return f"{PREFIX}sub:{sid}:dead"


def fanout_queued_key(tid: str) -> str:     # "a fan-out job for this topic is queued" flag
    return f"{PREFIX}fanout:{tid}:queued"


def fanout_followers_key(tid: str) -> str:  # zset: workers following the topic's log -> until (ms)
    return f"{PREFIX}fanout:{tid}:followers"


def verify_pending_key() -> str:            # list: challenges waiting for a verify_pending job, oldest first
    return f"{PREFIX}verify:pending"


def verify_queued_key() -> str:             # flag: "a verify_pending job is queued" (TTL)
    return f"{PREFIX}verify:queued"


def verify_taken_key(wid: str) -> str:      # list: challenges a worker took from the line and works on
    return f"{PREFIX}verify:taken:{wid}"


def topic_publish_key(tid: str, key_hash: str) -> str:  # "id seq" of the publish with that Idempotency-Key (TTL)
    return f"{PREFIX}topic:{tid}:idem:{key_hash}"


def workers_key() -> str:                   # zset: worker id -> its last heartbeat (epoch ms)
    return f"{PREFIX}workers"


def worker_alive_key(wid: str) -> str:      # a worker's heartbeat: exists while it lives (PX heartbeat_ttl)
    return f"{PREFIX}worker:{wid}:alive"


def key_check_key() -> str:                 # a Fernet token proving which secret key this Redis uses
    return f"{PREFIX}keycheck"


# operators' views (status page, /metrics, subscriber diagnostics); counters live in stats_key() below


def activity_key(minute: int) -> str:       # zset per minute (epoch s // 60): tid -> publishes, "*" -> all; 1 h TTL
    return f"{PREFIX}activity:{minute}"


def history_key(minute: int) -> str:        # hash per minute (epoch s // 60): deliveries, failures, latency; TTL
    return f"{PREFIX}history:{minute}"


def worker_status_key(name: str) -> str:    # hash: one worker's host, pid, claims, lanes, seen (epoch s); TTL
    return f"{PREFIX}worker:{name}"


def diagnostics_token_key(sid: str) -> str:  # sha256 hex of a subscriber's diagnostics token, with TTL
    return f"{PREFIX}sub:{sid}:diag"


def diagnostics_sent_key(sid: str) -> str:  # "a diagnostics link went to the callback lately" (rate limit)
    return f"{PREFIX}sub:{sid}:diag:sent"


def sub_attempts_key(sid: str) -> str:      # list: recent failed delivery attempts, newest first (JSON each)
    return f"{PREFIX}sub:{sid}:attempts"


def sub_dead_body_key(sid: str) -> str:     # hash: notification id -> a dead letter's exact body
    return f"{PREFIX}sub:{sid}:dead:body"


def sub_resend_key(sid: str) -> str:        # list: dead letters queued for re-sending, oldest first
    return f"{PREFIX}sub:{sid}:resend"


def sub_queued_key(sid: str) -> str:        # flag: "a deliver_subscription job is queued"
    return f"{PREFIX}sub:{sid}:queued"


def due_key() -> str:                       # zset: sid -> epoch s its next attempt is due (retry, re-send, resume)
    return f"{PREFIX}due"


def stats_key() -> str:                     # hash: delivery counters and latency histograms (store.delivery_stats)
    return f"{PREFIX}stats"


def replication_probe_key() -> str:         # INCR after a publish: WAIT counts the replicas that have it (store.replication)
    return f"{PREFIX}replication:probe"


def primary_key() -> str:                   # hash: address of the primary last seen, and the last failover
    return f"{PREFIX}replication:primary"


def maintenance_key(task: str) -> str:      # one worker's claim on a periodic task (reconcile, retention, sweep)
    return f"{PREFIX}maintenance:{task}"


def delivery_keys(sid: str) -> list[str]:
    """Every per-subscription key of the delivery part (remove_subscription deletes them)."""
    return [sub_lock_key(sid), sub_dead_key(sid), sub_dead_body_key(sid), sub_attempts_key(sid),
            sub_resend_key(sid), sub_queued_key(sid)]


def verification_field(result: str) -> str:  # stats_key() field counting one verification outcome
    return f"verification:{result}"


def rq_workers_key() -> str:                # RQ's set of registered workers (it names it; we only read it)
    return "rq:workers"


def rq_job_key(job_id: str) -> str:       # RQ's hash of one job (it names it; we only read enqueued_at)
    return f"rq:job:{job_id}"


def rq_keys(queue: str) -> dict[str, str]:
    """RQ's own keys for a queue's depth (it names them; we only read them)."""
    return {"queued": f"rq:queue:{queue}", "started": f"rq:wip:{queue}",
            "scheduled": f"rq:scheduled:{queue}", "failed": f"rq:failed:{queue}"}


# --- ids ----------------------------------------------------------------------------------


def topic_id(topic: str) -> str:
    """Id of a topic: sha256 of the exact topic URL (topics are compared exactly), 32 hex."""
    return hashlib.sha256(topic.encode("utf-8")).hexdigest()[:32]


def subscription_id(topic: str, callback: str) -> str:
    """Id of the subscription (topic, callback): its identity, so a renewal never duplicates it."""
    return hashlib.sha256(f"{topic}\n{callback}".encode()).hexdigest()[:32]

