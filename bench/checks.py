"""Checks on what the sinks recorded (count, duplicates, per-subscriber order) and the statistics
the reports use (medians, percentiles). No I/O here."""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field


@dataclass
class DeliveryCheck:
    """What the sinks got compared with what each subscriber should have got."""

    expected: int = 0
    received: int = 0
    missing: int = 0
    duplicates: int = 0
    out_of_order: int = 0      # deliveries whose sequence is not above the subscriber's previous one
    unexpected: int = 0        # deliveries to a path, or with a sequence, nobody asked for
    bad_requests: int = 0      # POSTs without the sequence / notification id headers
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicates or self.out_of_order or self.unexpected or self.bad_requests)

    def note(self, text: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(text)

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def check_deliveries(snapshot: Mapping, expected: Mapping[str, Sequence[int]]) -> DeliveryCheck:
    """Every path must have received exactly its expected sequences, each once, in increasing order.

    `snapshot` is the sink's /_records answer; `expected` maps a callback path name to the
    sequences (in publish order) it should have received.
    """
    check = DeliveryCheck(bad_requests=snapshot.get("bad_requests", 0))
    paths = snapshot["paths"]
    for name, seqs in expected.items():
        wanted = set(seqs)
        check.expected += len(wanted)
        got = paths.get(name, {"seq": [], "id": []})
        received, ids = got["seq"], got["id"]
        check.received += len(received)
        seen_ids: set[str] = set()
        seen_seqs: set[int] = set()
        previous = -math.inf
        for seq, nid in zip(received, ids):
            if nid in seen_ids or seq in seen_seqs:
                check.duplicates += 1
                check.note(f"{name}: sequence {seq} ({nid}) received again")
            elif seq <= previous:
                check.out_of_order += 1
                check.note(f"{name}: sequence {seq} after {previous}")
            if seq not in wanted:
                check.unexpected += 1
                check.note(f"{name}: sequence {seq} was not published to it")
            seen_ids.add(nid)
            seen_seqs.add(seq)
            previous = max(previous, seq)
        missed = wanted - seen_seqs
        if missed:
            check.missing += len(missed)
            check.note(f"{name}: {len(missed)} missing, first {min(missed)}")
    for name, got in paths.items():
        if name not in expected:
            check.unexpected += len(got["seq"])
            check.received += len(got["seq"])
            check.note(f"{name}: {len(got['seq'])} deliveries to a path nobody subscribed")
    return check


def last_receive_time(snapshot: Mapping) -> float:
    return max((t[-1] for t in (p["t"] for p in snapshot["paths"].values()) if t), default=0.0)


def latencies(snapshot: Mapping, sent_at: Mapping[int, float]) -> list[float]:
    """Publish→delivery latencies (seconds) of every delivery whose sequence is in `sent_at`."""
    out: list[float] = []
    for got in snapshot["paths"].values():
        for seq, t in zip(got["seq"], got["t"]):
            start = sent_at.get(seq)
            if start is not None:
                out.append(t - start)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank on sorted values; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_summary(values: Sequence[float]) -> dict[str, float]:
    """p50 / p95 / p99 / max in milliseconds."""
    ordered = sorted(values)
    return {"p50_ms": _ms(percentile(ordered, 50)), "p95_ms": _ms(percentile(ordered, 95)),
            "p99_ms": _ms(percentile(ordered, 99)), "max_ms": _ms(ordered[-1] if ordered else math.nan)}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def median_of(runs: Iterable[Mapping], key: str) -> float:
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]
    return statistics.median(values) if values else math.nan


def stage_breakdown(snapshot: Mapping, sent_at: Mapping[int, float], answered_at: Mapping[int, float],
                    stored_at: Mapping[int, float]) -> dict[str, dict[str, float]]:
    """Where each notification's time went, from outside the hub, per stage (p50 / p99 in ms
    over the notifications): publish → stored in Redis (the stream id's clock), → answered,
    stored → first subscriber got it (wake-up, claim, first send), first → last subscriber
    (the sends), publish → last subscriber. A sequence missing from `stored_at` (a relay
    stores nothing) has no store or wake stage; its first delivery is counted from the publish."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for got in snapshot["paths"].values():
        for seq, t in zip(got["seq"], got["t"]):
            if seq in sent_at:
                first[seq] = min(first.get(seq, t), t)
                last[seq] = max(last.get(seq, t), t)
    stages: dict[str, list[float]] = {"stored": [], "answered": [], "first_delivery": [], "sends": [],
                                      "last_delivery": []}
    for seq, t0 in sent_at.items():
        if seq not in first:
            continue
        stored = stored_at.get(seq)
        if stored is not None:
            stages["stored"].append(stored - t0)
        stages["answered"].append(answered_at[seq] - t0)
        stages["first_delivery"].append(first[seq] - (stored if stored is not None else t0))
        stages["sends"].append(last[seq] - first[seq])
        stages["last_delivery"].append(last[seq] - t0)
    out = {name: {"p50_ms": _ms(percentile(values, 50)), "p99_ms": _ms(percentile(values, 99))}
           for name, values in stages.items() if values}
    if first:   # the run's first notification: the cold path (a queued job, not a follower)
        seq = min(first)
        out["first_notification"] = {"first_delivery_ms": _ms(first[seq] - stored_at.get(seq, sent_at[seq])),
                                     "last_delivery_ms": _ms(last[seq] - sent_at[seq])}
    return out
