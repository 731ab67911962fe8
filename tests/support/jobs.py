"""The hub's queued RQ jobs, run in the test's own loop: each job function, named by the dotted
path RQ stores (hub/enqueue.py), maps to the async core its body (hub/worker/jobs.py) hands to
the worker's loop, with the same arguments and the same bookkeeping. A queued job whose
function has no core here fails the test, so a new kind of job is never skipped without anyone
noticing; a test that wants some kinds left queued names them."""
from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from rq import Queue
from rq.job import Job

from rsnotify.hub import enqueue, store
from rsnotify.hub.worker import fanout, fetch, verification

Core = Callable[..., Awaitable[Any]]


async def _verify_intent(ctx: Any, challenge: str) -> Any:
    outcome = await verification.verify_intent(ctx, challenge)
    await store.count_verifications(ctx.redis, {outcome.result: 1})
    return outcome


async def _verify_pending(ctx: Any) -> list[Any]:
    outcomes = await verification.verify_pending(ctx)
    counts = Counter(outcome.result for outcome in outcomes)
    if counts:
        await store.count_verifications(ctx.redis, counts)
    return outcomes


async def deliver_subscription(ctx: Any, sid: str) -> Any:
    """fanout.deliver_subscription, then the run it starts in the background, to its end: the
    worker's loop goes on with it, but a test looks at what the run did next (a retry scheduled,
    a dead letter counted) and must not look before it happened. A run that failed fails here."""
    before = set(ctx.deliveries.tasks)
    report = await fanout.deliver_subscription(ctx, sid)
    if started := set(ctx.deliveries.tasks) - before:
        await asyncio.gather(*started)
    return report


# the job function's dotted path (what RQ stores) -> the core its body runs on the worker's loop
HUB_JOBS: dict[str, Core] = {
    enqueue.VERIFY_INTENT: _verify_intent,
    enqueue.VERIFY_PENDING: _verify_pending,
    enqueue.FETCH_TOPIC: fetch.fetch_topic,
    enqueue.FAN_OUT: fanout.fan_out,
    enqueue.DELIVER_SUBSCRIPTION: deliver_subscription,
    enqueue.SWEEP_LEASES: verification.sweep_expired,
}


class JobRunner:
    """`await runner.run_queued()` runs the jobs queued now, in queue order, each taken off the
    queue first (as a worker takes it); returns the cores' results, lists flattened."""

    def __init__(self, queue: Queue, ctx: Any, cores: Mapping[str, Core] = HUB_JOBS, *,
                 leave: Iterable[str] = ()) -> None:
        self.queue = queue
        self.ctx = ctx
        self.cores = dict(cores)
        self.left = set(leave)

    async def run_queued(self) -> list[Any]:
        results: list[Any] = []
        for job in self.queue.get_jobs():
            if job.func_name in self.left:
                continue
            result = await self.run(job)
            if isinstance(result, list):
                results.extend(result)
            else:
                results.append(result)
        return results

    async def run(self, job: Job) -> Any:
        core = self.cores.get(job.func_name or "")
        if core is None:
            known = ", ".join(sorted([*self.cores, *self.left]))
            raise AssertionError(f"queued job {job.func_name}{tuple(job.args)} has no core in the test's job "
                                 f"runner (known: {known}); add it, or leave it queued on purpose")
        self.queue.remove(job)
        return await core(self.ctx, *job.args, **job.kwargs)
