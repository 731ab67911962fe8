"""The failover run the two test_ops_failover*.py files share (one file each, so the xdist workers
run them side by side): three data nodes (a primary and two replicas) under three Sentinels, one
`rsnotify hub --workers 0` web process and two `rsnotify worker`s on the redis+sentinel:// URL,
three subscribers. A publisher posts 300 notifications to one topic, sending each again with the
same Idempotency-Key while the hub answers 503; the primary gets SIGKILL after 100. Every
notification answered 200 reaches every subscriber, in order, none missing; deliveries resume soon
after Sentinel's down-after time; no process exits."""
from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.fernet import Fernet

from rsnotify.hub import keys
from tests.support import cli
from tests.support.http import get_json, post_form
from tests.support.hubproc import HubProcess, start_hub
from tests.support.sentinels import Node, SentinelGroup, start_sentinel_group
from tests.support.subscribers import Recorded, RecordingSubscriber
from tests.support.waiting import loaded, slowdown, wait_until

from .conftest import TOPIC, body

NOTIFICATIONS = 300
KILL_AFTER = 100
RETURN_AFTER = 200              # the old primary starts again here, amid the publishes
CALLBACKS = ("/s1", "/s2", "/s3")
PUBLIC_URL = "http://hub.rsnotify.test/"
# Sentinel's down-after: twice --redis-timeout, so that a publish cannot ride out the promotion
# (down-after + election) in one request: the hub retries an append for --redis-timeout, and on a
# busy machine its last attempt (Sentinel lookups and connects over TLS) may take a second more;
# at 1 s a publish was seen answered 200 after 3 s, with no 503 at all.
DOWN_AFTER_MS = 2000
# --redis-timeout, below the time a promotion takes, so publishes during it are answered 503 and
# sent again: the path under test. No answer may take much longer.
REDIS_TIMEOUT = 1.0
REPLICA_TIMEOUT = 0.5
DATA_PASSWORD = "data-nodes-secret"
SENTINEL_PASSWORD = "sentinels-secret"
PUBLISH_DEADLINE = 60.0         # s one notification may take to be answered 200, retries included


@dataclass
class Publishing:
    """What the publisher saw: the 200s (notification number -> sequence), the 503s, when it killed."""

    accepted: dict[int, int] = field(default_factory=dict)
    refusals: list[tuple[int, str | None]] = field(default_factory=list)   # (status, Retry-After)
    killed_at: float = 0.0          # time.time() of the SIGKILL
    killed: Node | None = None      # the node killed (and started again, when the old primary returns)
    slowest: float = 0.0            # s of the slowest single answer, over the machine's slowdown then


def publish(hub_url: str, n: int) -> tuple[int, str | None, bytes, float]:
    """POST notification `n` with Idempotency-Key n: (status, Retry-After, body, seconds taken).
    The socket waits up to PUBLISH_DEADLINE: how long an answer may take is checked on `took`
    (publish_all), against the machine's load; a socket timeout of its own (it was 4 s) failed
    two runs in five at load 19, where an answer takes several times as long as on a quiet machine."""
    link = f'<{TOPIC}>; rel="self", <{PUBLIC_URL}>; rel="hub"'
    request = urllib.request.Request(hub_url, data=body(n), method="POST", headers={
        "Content-Type": "application/xml", "Link": link, "Idempotency-Key": f"notification-{n}"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=PUBLISH_DEADLINE) as response:
            return response.status, None, response.read(), time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Retry-After"), error.read(), time.monotonic() - started
    except (TimeoutError, urllib.error.URLError) as error:
        raise AssertionError(f"notification {n}: no answer after {time.monotonic() - started:.1f} s ({error})") \
            from None


def publish_all(hub: HubProcess, group: SentinelGroup, seen: Publishing, old_primary_returns: bool) -> None:
    for n in range(1, NOTIFICATIONS + 1):
        if n == KILL_AFTER + 1:
            # the primary of this moment: on a busy machine the Sentinels may have failed over once
            # already (a spurious one, down-after being 1 s), and killing the replica it left behind
            # would test nothing
            seen.killed = group.primary()
            seen.killed.kill()
            seen.killed_at = time.time()
        if n == RETURN_AFTER + 1 and old_primary_returns:
            assert seen.killed is not None
            seen.killed.start()     # same port, same data: Sentinel turns it into a replica
        deadline = time.monotonic() + PUBLISH_DEADLINE
        while True:
            status, retry_after, answer, took = publish(hub.url, n)
            seen.slowest = max(seen.slowest, took / slowdown())
            if status == 200:
                seen.accepted[n] = json.loads(answer)["sequence"]
                break
            assert status == 503, f"notification {n}: {status} {answer[:300]!r}\n{hub.output()[-3000:]}"
            seen.refusals.append((status, retry_after))
            assert time.monotonic() < deadline, f"notification {n} was never accepted: {answer!r}"
            time.sleep(0.1)     # an impatient publisher; Retry-After says when it need not try before


def numbers(subscriber: RecordingSubscriber, path: str) -> list[int]:
    """The notification numbers `path` received, in arrival order (repeats kept)."""
    return [numbers_of(r) for r in subscriber.deliveries(path)]


def run_failover(tmp_path: Path, *, old_primary_returns: bool, group: SentinelGroup | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
    # the data nodes and the Sentinels have passwords of their own: the URL carries the first,
    # --sentinel-password (RSNOTIFY_SENTINEL_PASSWORD) the second
    group = group or start_sentinel_group(tmp_path / "redis", down_after_ms=DOWN_AFTER_MS, failover_timeout_ms=2000,
                                          password=DATA_PASSWORD, sentinel_password=SENTINEL_PASSWORD)
    subscriber = RecordingSubscriber(default_status=204)
    server = subscriber.serve_in_thread()
    hub: HubProcess | None = None
    workers = []
    try:
        env = {"RSNOTIFY_REDIS_URL": group.url(), "RSNOTIFY_SENTINEL_PASSWORD": SENTINEL_PASSWORD, "RSNOTIFY_SECRET_KEY": Fernet.generate_key().decode(),
               "RSNOTIFY_PUBLIC_URL": PUBLIC_URL, "RSNOTIFY_ALLOW_NETWORK": "127.0.0.0/8",
               "RSNOTIFY_REDIS_TIMEOUT": str(REDIS_TIMEOUT),
               "RSNOTIFY_REPLICA_TIMEOUT": str(REPLICA_TIMEOUT),
               # --lock-ttl stays at its 60 s: a worker hands its claims back once Redis answers
               "RSNOTIFY_RECONCILE_INTERVAL": "0.5", "RSNOTIFY_RETRY_BASE": "0.1", **(extra_env or {})}
        hub = start_hub(tmp_path, data_dir=tmp_path / "web", workers=0, env=env)
        for name in ("worker-a", "worker-b"):
            workers.append(cli.start("worker", "--name", name, log=tmp_path / f"{name}.log", env=env))
        for path in CALLBACKS:
            status, answer = post_form(hub.url, {"hub.mode": "subscribe", "hub.topic": TOPIC,
                                                 "hub.callback": subscriber.url(path)})
            assert status == 202, answer
        wait_until(lambda: get_json(hub.url + "admin/subscriptions")[1]["total"] == len(CALLBACKS), 60,
                   "the three subscriptions to be verified", logs=tmp_path)
        # both workers serving before the kill: one still starting then would find no primary and
        # exit (run_worker's first ping), which is not the failover under test
        wait_until(lambda: get_json(hub.url + "health")[1].get("workers") == 2, 60, "both workers to be seen",
                   logs=tmp_path)
        status, health = get_json(hub.url + "health")
        assert status == 200 and len(health["replication"]["replicas"]) == 2, health
        assert health["replication"]["min_replicas"] == 1       # the default on a Sentinel URL
        first_primary = group.primary()

        seen = Publishing()
        publish_all(hub, group, seen, old_primary_returns)
        if old_primary_returns:
            # as a replica; or the primary again, when a second (spurious) failover under load chose it
            killed = seen.killed
            wait_until(lambda: group.role(killed) == ("master" if group.primary() is killed else "slave"),
                       60, "the old primary to come back as a replica", logs=tmp_path / "redis")

        def everyone_has_everything() -> bool:
            return all(set(numbers(subscriber, p)) >= set(range(1, NOTIFICATIONS + 1)) for p in CALLBACKS)
        wait_until(everyone_has_everything, 120, "every notification at every subscriber", logs=tmp_path)

        # /health names the server that answers as the primary, which the Sentinels name too (a
        # moment apart, while a later failover settles, they may differ: hence the wait)
        def health_names_the_primary() -> bool:
            nonlocal status, health
            status, health = get_json(hub.url + "health")
            primary = group.primary()
            return status == 200 and health["replication"]["primary"] == primary.address and \
                group.role(primary) == "master"
        wait_until(health_names_the_primary, 60, "/health to name the primary the Sentinels name", logs=tmp_path)
        new_primary = group.primary()
        switches = group.switches()         # one here; a busy machine may add a spurious second
        assert switches and switches[0][0] == first_primary.address and switches[-1][1] == new_primary.address, \
            switches
        failover = health["replication"]["last_failover"]
        if len(switches) == 1:
            assert (failover["from"], failover["to"]) == (first_primary.address, new_primary.address), health
        else:       # the hub records the changes it saw: the last one ends at the primary, from an earlier one
            assert failover["to"] == new_primary.address, (health, switches)
            assert failover["from"] in {old for old, _ in switches} - {new_primary.address}, (health, switches)
        # the jobs queued before the failover ran after it: nothing waits in the queue
        wait_until(lambda: get_json(hub.url + "health")[1]["queues"]["rsnotify"]["queued"] == 0, 60,
                   "the queue to drain", logs=tmp_path)
        status, overview = get_json(hub.url + "admin/overview")       # the status page's Redis section
        assert status == 200 and overview["replication"]["last_failover"] == health["replication"]["last_failover"]
        # each notification is in the topic's log once (a repeat with the same key stored nothing),
        # on the new primary and on the old one (when it came back), now its replica
        log_key = keys.topic_log_key(keys.topic_id(TOPIC))
        # (one node when a second failover made the old primary the primary again)
        returned = [seen.killed] if old_primary_returns and seen.killed is not new_primary else []
        for node in [new_primary, *returned]:
            client = group.client(node)
            try:
                wait_until(lambda client=client: client.xlen(log_key) == NOTIFICATIONS, 60,
                           f"{NOTIFICATIONS} log entries on {node.address}")
                stored = [numbers_of_body(fields[b"body"]) for _, fields in client.xrange(log_key)]
            finally:
                client.close()
            assert stored == list(range(1, NOTIFICATIONS + 1)), node.address
        assert DATA_PASSWORD not in hub.output() and SENTINEL_PASSWORD not in hub.output()
        # no process exits
        exited = [f"{name} exited with {w.poll()}:\n{(tmp_path / f'{name}.log').read_text(errors='replace')[-3000:]}"
                  for name, w in zip(("worker-a", "worker-b"), workers, strict=True) if w.poll() is not None]
        assert hub.process.poll() is None and not exited, "\n".join(exited) or hub.output()[-3000:]
    finally:
        server.stop()
        for process in [*workers, *([hub.process] if hub else [])]:
            process.send_signal(signal.SIGTERM)     # all at once: each may take seconds to stop
        for process in [*workers, *([hub.process] if hub else [])]:
            cli.stop(process, signal.SIGTERM, timeout=5)    # asserted on above; a slow stop is not under test
        group.stop()

    # every publish was answered 200 in the end; the failover only ever got 503 + Retry-After
    assert sorted(seen.accepted) == list(range(1, NOTIFICATIONS + 1))
    assert seen.refusals, "the kill never showed: no publish was refused"
    assert all(status == 503 and retry_after for status, retry_after in seen.refusals), seen.refusals
    # never a hang: each answer within 2 x --redis-timeout + 1 s, stretched by the load at its time
    assert seen.slowest < REDIS_TIMEOUT * 2 + 1, \
        f"a publish took {seen.slowest:.1f} s (its time over the machine's slowdown then)"
    for path in CALLBACKS:
        received = numbers(subscriber, path)
        highest = 0
        for n in received:      # in order: never ahead of the next one due (a repeat may come again)
            assert n <= highest + 1, f"{path}: {n} arrived before {highest + 1}: {received}"
            highest = max(highest, n)
        assert list(dict.fromkeys(received)) == list(range(1, NOTIFICATIONS + 1)), path
        resumed = min(r.at for r in subscriber.deliveries(path) if r.at > seen.killed_at and
                      numbers_of(r) > KILL_AFTER)
        # Sentinel's down-after is wall-clock time; the election, the hub's and the workers'
        # reconnects and the delivery after it are work that a loaded machine stretches
        assert resumed - seen.killed_at < DOWN_AFTER_MS / 1000 + loaded(5), \
            f"{path}: deliveries resumed {resumed - seen.killed_at:.1f} s after the kill (load {os.getloadavg()[0]:.1f})"


def numbers_of(recorded: Recorded) -> int:
    return numbers_of_body(recorded.body)


def numbers_of_body(document: bytes) -> int:
    """The notification number in a body (body(n) names http://example.com/resN)."""
    return int(document.split(b"<loc>http://example.com/res")[1].split(b"<")[0])


def numbers_of(recorded: Recorded) -> int:
    return numbers_of_body(recorded.body)


def numbers_of_body(document: bytes) -> int:
    """The notification number in a body (body(n) names http://example.com/resN)."""
    return int(document.split(b"<loc>http://example.com/res")[1].split(b"<")[0])
