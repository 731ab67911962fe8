"""The one retry schedule (rsnotify.backoff) the hub, the outbox, the publish client and the fetcher share."""
from __future__ import annotations

from rsnotify.backoff import backoff_delay


def test_retry_delay_grows_exponentially_with_jitter_up_to_the_cap() -> None:
    assert backoff_delay(1, 2.0, 3600.0, rand=0.0) == 1.0
    assert backoff_delay(1, 2.0, 3600.0, rand=1.0) == 2.0
    assert backoff_delay(5, 2.0, 3600.0, rand=1.0) == 32.0
    assert backoff_delay(40, 2.0, 3600.0, rand=1.0) == 3600.0
    total = sum(backoff_delay(n, 2.0, 3600.0, rand=0.5) for n in range(1, 40))
    assert 0.7 * 86400 < total < 1.5 * 86400        # the hub's defaults give up after about a day


def test_retry_after_is_the_least_wait_but_never_past_the_cap() -> None:
    assert backoff_delay(1, 1.0, 60.0, retry_after=10.0, rand=0.0) == 10.0
    assert backoff_delay(1, 1.0, 60.0, retry_after=0.1, rand=1.0) == 1.0
    assert backoff_delay(1, 1.0, 60.0, retry_after=3600.0) == 60.0


def test_random_draws_stay_between_half_and_the_whole_ceiling() -> None:
    delays = {backoff_delay(3, 1.0) for _ in range(200)}
    assert all(2.0 <= d <= 4.0 for d in delays) and len(delays) > 100
