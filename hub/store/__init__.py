"""Every Redis operation of the hub outside a delivery claim (worker/claims.py holds those):
intents, subscriptions, topic logs, dead letters, counters, what operators read, the
"job queued" flags and the workers' maintenance. Keys come from hub/keys.py.

Async functions take a `redis.asyncio.Redis` client created with decode_responses=False; the
maintenance and flag functions that run beside RQ take its synchronous client. Multi-key
updates are Lua scripts or MULTI pipelines. No HTTP here.

Callers use `store.<operation>`; the submodules group the operations by what they touch.
"""
from __future__ import annotations

from . import liveness, maintenance, queued
from .access import (
    diagnostics_token_digest,
    keep_diagnostics_token,
    key_check_token,
    mark_diagnostics_link_sent,
)
from .counters import (
    HealthCounts,
    Lane,
    count_verifications,
    delivery_stats,
    health_counts,
    lane_backlogs,
    live_workers,
    queue_depths,
)
from .intents import (
    VERIFY_QUEUED_TTL,
    clear_verify_queued,
    finish_challenge,
    pending_verifications,
    queue_intent,
    read_intent,
    return_challenge,
    return_taken_challenges,
    store_intent,
    take_challenges,
    take_intent,
    take_pending_challenges,
)
from .letters import (
    dead_letter_body,
    get_dead_letter,
    list_dead_letters,
    pop_due,
    pop_due_sync,
    recent_attempts,
    resend_all_dead_letters,
    resend_dead_letter,
)
from .logs import (
    append_notification,
    append_notification_once,
    count_topics,
    get_notification,
    topic_ids,
    wait_for_entries,
)
from .subscriptions import (
    activate_subscription,
    count_subscriptions,
    delete_delivery_state,
    expired_subscriptions,
    get_subscription,
    log_end,
    pause_subscription,
    remove_subscription,
    resume_subscription,
    retry_now,
    subscription_backlog,
    subscription_ids_by_lease,
    subscription_secret,
    topic_subscription_ids,
)
from .views import (
    CHUNK,
    activity_replies,
    recent_entries,
    subscription_cursor,
    subscription_rows,
    topic_row_replies,
    topic_sequences,
    totals,
)

__all__ = [
    "CHUNK",
    "VERIFY_QUEUED_TTL",
    "HealthCounts",
    "Lane",
    "activate_subscription",
    "activity_replies",
    "append_notification",
    "append_notification_once",
    "clear_verify_queued",
    "count_subscriptions",
    "count_topics",
    "count_verifications",
    "dead_letter_body",
    "delete_delivery_state",
    "delivery_stats",
    "diagnostics_token_digest",
    "expired_subscriptions",
    "finish_challenge",
    "get_dead_letter",
    "get_notification",
    "get_subscription",
    "health_counts",
    "keep_diagnostics_token",
    "key_check_token",
    "lane_backlogs",
    "list_dead_letters",
    "live_workers",
    "liveness",
    "log_end",
    "maintenance",
    "mark_diagnostics_link_sent",
    "pause_subscription",
    "pending_verifications",
    "pop_due",
    "pop_due_sync",
    "queue_depths",
    "queue_intent",
    "queued",
    "read_intent",
    "recent_attempts",
    "recent_entries",
    "remove_subscription",
    "resend_all_dead_letters",
    "resend_dead_letter",
    "resume_subscription",
    "retry_now",
    "return_challenge",
    "return_taken_challenges",
    "store_intent",
    "subscription_backlog",
    "subscription_cursor",
    "subscription_ids_by_lease",
    "subscription_rows",
    "subscription_secret",
    "take_challenges",
    "take_intent",
    "take_pending_challenges",
    "topic_ids",
    "topic_row_replies",
    "topic_sequences",
    "topic_subscription_ids",
    "totals",
    "wait_for_entries",
]
