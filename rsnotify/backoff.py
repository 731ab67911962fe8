"""The one retry schedule of every role: exponential backoff with jitter, capped.

The hub's deliveries and the publisher's outbox keep the next attempt's time in their store
(durable retries); the publish client and the Destination's fetcher sleep in a loop; the
Destination's held-back changes wait by it without the jitter. All ask this function how long
to wait, so a retry storm spreads out the same way everywhere. A small function rather than
tenacity: several callers never sleep (they write the time down), and tenacity's value is the
loop, which those do not have.
"""
from __future__ import annotations

import math
import random


def backoff_delay(failures: int, base: float, cap: float = math.inf, *, retry_after: float | None = None,
                  rand: float | None = None) -> float:
    """Seconds before the next attempt after `failures` failed ones.

    base * 2^(failures-1), capped at `cap`; half of it fixed and half random ("equal jitter"),
    so many clients retrying at once spread out. A server's Retry-After is honoured as the
    least wait, within the cap. `rand` in [0, 1] replaces the random draw (tests).
    """
    ceiling = min(cap, base * 2.0 ** min(failures - 1, 60))
    delay = ceiling / 2 + (random.random() if rand is None else rand) * ceiling / 2
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(delay, cap)
