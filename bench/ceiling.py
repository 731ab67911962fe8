"""The ceiling: plain aiohttp clients POSTing the fan-out's payloads straight to the sinks, with
keep-alive, in as many processes as the hub has workers (the same parallelism the hub gets), so
the figure is what this machine can push through the sinks, not what one Python process can.

Each process warms its connection pool, waits for the start signal, then serves its share of the
subscribers `concurrency` at a time, each subscriber's notifications one after another (the
hub's per-subscription order), and reports the CPU it used.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import time
from multiprocessing.synchronize import Event

import aiohttp

from .payloads import bodies, delivery_headers

READY_TIMEOUT = 60.0


def _client(base: str, names: list[str], notifications: int, entries: int, concurrency: int, topic: str,
            tag: str, ready: Event, go: Event, out: multiprocessing.Queue) -> None:
    payloads = bodies(notifications, entries)
    headers = [delivery_headers(topic, "http://127.0.0.1:1/", f"{tag}-{seq}", seq)
               for seq in range(1, notifications + 1)]

    async def main() -> tuple[float, str]:
        connector = aiohttp.TCPConnector(limit=concurrency + 50)
        async with aiohttp.ClientSession(connector=connector) as client:
            await asyncio.gather(*(_warm(client, base) for _ in range(min(concurrency, len(names)))))
            ready.set()
            await asyncio.to_thread(go.wait, READY_TIMEOUT)
            cpu = time.process_time()
            queue = iter(names)
            failures: list[str] = []

            async def deliver_all() -> None:
                for name in queue:
                    url = f"{base}/cb/{name}"
                    for body, h in zip(payloads, headers):
                        async with client.post(url, data=body, headers=h) as response:
                            await response.read()
                            if response.status != 200:
                                failures.append(f"{url}: {response.status}")

            await asyncio.gather(*(deliver_all() for _ in range(min(concurrency, len(names)))))
            return time.process_time() - cpu, failures[0] if failures else ""

    try:
        out.put(asyncio.run(main()))
    except Exception as exc:  # reported to the parent, which raises it there
        out.put((0.0, f"{type(exc).__name__}: {exc}"))


async def _warm(client: aiohttp.ClientSession, base: str) -> None:
    async with client.get(f"{base}/_count") as response:
        await response.read()


async def run_clients(base: str, names: list[str], notifications: int, entries: int, concurrency: int,
                      processes: int, topic: str, tag: str) -> tuple[float, float]:
    """Deliver every notification to every name from `processes` client processes.
    Returns (epoch time the clients were released, CPU seconds they used)."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    go = context.Event()
    shares = [names[i::processes] for i in range(processes) if names[i::processes]]
    readies = [context.Event() for _ in shares]
    workers = [context.Process(target=_client, args=(base, share, notifications, entries, concurrency, topic, tag,
                                                     ready, go, out), daemon=True)
               for share, ready in zip(shares, readies)]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not all(r.is_set() for r in readies):
            if time.monotonic() > deadline or any(w.exitcode not in (None, 0) for w in workers):
                raise RuntimeError("the ceiling's client processes did not get ready")
            await asyncio.sleep(0.02)
        started = time.time()
        go.set()
        reports = [await asyncio.to_thread(out.get, True, 600) for _ in workers]
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
    errors = [error for _, error in reports if error]
    if errors:
        raise RuntimeError(f"the ceiling's clients failed: {errors[0]}")
    return started, sum(cpu for cpu, _ in reports)
