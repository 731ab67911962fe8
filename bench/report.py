"""Output: one JSON line and one readable line per run; a table of medians against the targets."""
from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TextIO

from .checks import median_of


@dataclass(frozen=True)
class Target:
    scenario: str
    key: str                  # the figure compared (median over runs)
    label: str
    limit: float
    at_least: bool            # True: figure >= limit; False: figure <= limit
    unit: str = ""

    def met(self, value: float) -> bool | None:
        if value is None or math.isnan(value):
            return None
        return value >= self.limit if self.at_least else value <= self.limit

    def text(self) -> str:
        return f"{'≥' if self.at_least else '≤'} {self.limit:g}{self.unit}"


TARGETS = (
    Target("fanout", "ceiling_ratio", "fan-out / ceiling", 0.9, True, "×"),
    Target("latency", "p50_ratio", "latency p50 / relay ceiling p50", 2, False, "×"),
    Target("latency", "p99_ratio", "latency p99 / relay ceiling p99", 3, False, "×"),
    Target("latency", "p50_ms", "latency p50", 20, False, " ms"),
    Target("latency", "p99_ms", "latency p99", 50, False, " ms"),
    Target("ingest", "ceiling_ratio", "ingest / ingest ceiling", 0.5, True, "×"),
    Target("ingest", "rate", "ingest", 2000, True, "/s"),
    Target("subscribe", "ceiling_ratio", "verified subscriptions / verification ceiling", 0.5, True, "×"),
    Target("subscribe", "rate", "verified subscriptions", 500, True, "/s"),
    Target("scale", "used_memory_mb", "Redis memory, all subscriptions (verified, not yet delivered to)", 100, False,
           " MB"),
    Target("peer", "ratio", "fan-out / Flask-WebSub", 20, True, "×"),
    Target("isolation", "p50_ms", "unrelated topic's latency p50 beside black holes and hanging subscribers", 50,
           False, " ms"),
    Target("isolation", "p99_ms", "unrelated topic's latency p99 beside black holes and hanging subscribers", 250,
           False, " ms"),
    Target("failover", "stall_s", "subscribers' silence after SIGKILL of their worker", 5, False, " s"),
    Target("source", "memory_slowdown_pct", "publish rate lost to the change memory", 10, False, " %"),
    Target("source", "p50_ms", "rsnotify source: file edit → notification accepted, p50", 200, False, " ms"),
    Target("source", "rl_peak_rss_mb", "Resource List of the source_resources (100,000 in quick/full), peak RSS", 100,
           False, " MB"),
)

# Each scenario's figure against its ceiling measured in the same invocation: (scenario, figure,
# its ceiling's figure in the same result, what the figure is, the goal).
RATIOS = (
    ("fanout", "rate", None, "deliveries/s", "≥ 0.9×"),
    ("ingest", "rate", "ceiling_rate", "accepted publishes/s", "≥ 0.5×"),
    ("subscribe", "rate", "ceiling_rate", "verified subscriptions/s", "≥ 0.5×"),
    ("latency", "p50_ms", "relay_p50_ms", "p50 ms (ceiling: the relay)", "≤ 2×"),
    ("latency", "p99_ms", "relay_p99_ms", "p99 ms (ceiling: the relay)", "≤ 3×"),
)


def summary_line(result: Mapping) -> str:
    """One readable line for a run's result."""
    name = result["scenario"]
    if "skipped" in result:
        return f"{name:9} skipped: {result['skipped']}"
    check = result.get("check", {})
    verdict = "check ok" if check.get("ok") else f"CHECK FAILED {_problems(check)}"
    head = f"{name:9} run {result.get('run')}:"
    if name in ("ceiling", "fanout", "scale", "peer"):
        ratio = result.get("ceiling_ratio")
        extra = f" = {ratio:.2f}× ceiling" if ratio is not None else ""
        if name == "scale" and "used_memory_mb" in result:
            extra += (f"; {result['subscriptions']:,} subscriptions over {result['topics']:,} topics, Redis "
                      f"{result['used_memory_mb']:.1f} MB ({result['bytes_per_subscription']} B/subscription)")
            if "projected_all_active_mb" in result:
                extra += (f"; a subscription after {result['deliveries_per_subscription']} deliveries "
                          f"{result['active_subscription_bytes']:,} B (idle {result['idle_subscription_bytes']:,} B): "
                          f"all active ≈ {result['projected_all_active_mb']:,.0f} MB")
        if name == "peer":
            extra = (f"; rsnotify {result['ours_rate']:,.0f}/s = {result['ratio']:.1f}× Flask-WebSub"
                     if result.get("ratio") else "")
            extra += "" if result.get("order_kept") else " (order not kept: it promises none)"
        return (f"{head} {result['deliveries']:,} deliveries ({result['subscribers']:,} subscribers × "
                f"{result['notifications']}) in {result['seconds']:.2f} s = {result['rate']:,.0f}/s{extra}; "
                f"{verdict}; cpu {_cpu(result)}")
    if name in ("latency", "relay"):
        return _latency_line(head, result, verdict)
    if name == "ingest":
        return (f"{head} {result['accepted']:,} submissions accepted in {result['seconds']:.2f} s = "
                f"{result['rate']:,.0f}/s ({result['concurrency']} in flight) = {_times(result.get('ceiling_ratio'))} "
                f"the ingest ceiling's {result['ceiling_rate']:,.0f}/s; web process CPU "
                f"{result.get('cpu_ms_per_publish', 0):.2f} ms per publish; all delivered after "
                f"{result['delivered_seconds']:.2f} s; {verdict}; cpu {_cpu(result)}")
    if name in ("ingest-ceiling", "subscribe-ceiling"):
        what = "submissions" if name == "ingest-ceiling" else "subscriptions verified"
        return (f"{head} {result.get('submissions', result.get('subscriptions')):,} {what} by the plain aiohttp "
                f"program = {result['rate']:,.0f}/s ({result['concurrency']} in flight)"
                + (f"; its CPU {result['cpu_ms_per_publish']:.2f} ms per publish" if "cpu_ms_per_publish" in result
                   else ""))
    if name == "isolation":
        return (f"{head} {result['notifications']} notifications at {result['rate_per_s']:g}/s × "
                f"{result['subscribers']} subscribers beside {result['black_holes']:,} black holes and "
                f"{result['hanging']:,} hanging subscribers: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, "
                f"max {result['max_ms']:.1f} ms; a new subscription verified in {result['verify_ms']:,.0f} ms; "
                f"health {result.get('health_status')}; {verdict}; cpu {_cpu(result)}")
    if name == "failover":
        late = result.get("max_latency_after_kill_s")
        return (f"{head} {result['notifications']} notifications at {result['rate_per_s']:g}/s × "
                f"{result['subscribers']} subscribers, worker SIGKILLed mid-stream: silence {result['stall_s']:.2f} s, "
                f"slowest delivery published after the kill {late if late is not None else float('nan'):.2f} s, "
                f"{result['duplicates']} duplicate(s) (at least once); {verdict}")
    if name == "source":
        return (f"{head} {result['publishes']} publishes of {result['entries']} changes: "
                f"{result['publish_rate_memory']:,.0f}/s with the change memory, {result['publish_rate_plain']:,.0f}/s "
                f"without ({result['memory_slowdown_pct']:+.1f} % slower); edit → accepted p50 {result['p50_ms']:.0f} ms, "
                f"p99 {result['p99_ms']:.0f} ms over {result['edits']} edits; Resource List of "
                f"{result['rl_resources']:,} resources ({result['rl_parts']} parts) in {result['rl_seconds']:.1f} s, "
                f"peak RSS {result['rl_peak_rss_mb']:.0f} MB; {verdict}")
    if name == "subscribe":
        return (f"{head} {result['subscriptions']:,} subscriptions verified and active in {result['seconds']:.2f} s "
                f"= {result['rate']:,.0f}/s = {_times(result.get('ceiling_ratio'))} the verification ceiling's "
                f"{result['ceiling_rate']:,.0f}/s; {verdict}; cpu {_cpu(result)}")
    return f"{head} {json.dumps(result)}"


def _latency_line(head: str, result: Mapping, verdict: str) -> str:
    line = (f"{head} {result['notifications']} notifications at {result['rate_per_s']:g}/s × "
            f"{result['subscribers']} subscribers: p50 {result['p50_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms, "
            f"p99 {result['p99_ms']:.1f} ms, max {result['max_ms']:.1f} ms; {verdict}")
    if "cpu" in result:
        line += f"; cpu {_cpu(result)}"
    if "relay_p50_ms" in result:
        line += (f"; {_times(result.get('p50_ratio'))} the relay's p50 {result['relay_p50_ms']:.1f} ms, "
                 f"{_times(result.get('p99_ratio'))} its p99 {result['relay_p99_ms']:.1f} ms")
    return line + "\n#   stages p50/p99 ms: " + _stages(result.get("stages", {}))


def _times(ratio: float | None) -> str:
    return f"{ratio:.2f}×" if ratio is not None else "?×"


def _stages(stages: Mapping[str, Mapping[str, float]]) -> str:
    """publish → stored → answered; stored → first delivery; first → last delivery; publish → last."""
    text = ", ".join(f"{name} {figures['p50_ms']:.1f}/{figures['p99_ms']:.1f}" for name, figures in stages.items()
                     if "p50_ms" in figures)
    cold = stages.get("first_notification")
    if cold:
        text += (f"; the run's first notification: first delivery {cold['first_delivery_ms']:.1f} ms after it was "
                 f"stored (the relay: sent), last {cold['last_delivery_ms']:.1f} ms after its publish")
    return text


def _problems(check: Mapping) -> str:
    keys = ("missing", "duplicates", "out_of_order", "unexpected", "bad_requests")
    found = ", ".join(f"{k}={check[k]}" for k in keys if check.get(k))
    return f"({found}; e.g. {'; '.join(check.get('examples', [])[:2])})" if found else ""


def _cpu(result: Mapping) -> str:
    return " ".join(f"{role} {seconds:.1f}s" for role, seconds in result.get("cpu", {}).items())


def medians(results: Mapping[str, Sequence[Mapping]]) -> dict[str, dict[str, float]]:
    keys = ("rate", "ceiling_ratio", "p50_ms", "p95_ms", "p99_ms", "max_ms", "used_memory_mb", "stall_s", "verify_ms",
            "bytes_per_subscription", "ratio", "delivery_rate", "projected_all_active_mb", "subscriptions",
            "memory_slowdown_pct", "publish_rate_plain", "publish_rate_memory", "rl_peak_rss_mb", "rl_seconds",
            "publish_p50_ms", "publish_p99_ms", "refusing_s",
            "ceiling_rate", "relay_p50_ms", "relay_p99_ms", "p50_ratio", "p99_ratio")
    return {scenario: {k: median_of(runs, k) for k in keys if any(k in r for r in runs)}
            for scenario, runs in results.items() if runs}


def targets_table(results: Mapping[str, Sequence[Mapping]]) -> list[str]:
    """Markdown table: each target, its measured median, the ceiling ratio where there is one."""
    med = medians(results)
    ceiling = med.get("ceiling", {}).get("rate", math.nan)
    lines = ["| target | goal | measured (median) | met |", "| --- | --- | --- | --- |"]
    if not math.isnan(ceiling):
        lines.append(f"| ceiling (plain aiohttp clients → sinks) | — | {ceiling:,.0f} deliveries/s | — |")
    for target in TARGETS:
        figures = med.get(target.scenario)
        if not figures or target.key not in figures:
            continue
        value = figures[target.key]
        shown = _shown(target, figures, value, ceiling)
        met = target.met(value)
        lines.append(f"| {target.label} | {target.text()} | {shown} | {'yes' if met else '—' if met is None else 'NO'} |")
    if "scale" in med:
        scale = med["scale"]
        lines.append(f"| fan-out among all subscriptions (scale) | — | {scale['rate']:,.0f}/s"
                     f"{_ratio(scale.get('ceiling_ratio'))} | — |")
        if "projected_all_active_mb" in scale:
            lines.append(f"| Redis memory if every subscription had a full delivery history (projected) | — | "
                         f"{scale['projected_all_active_mb']:,.0f} MB | — |")
    for variant in ("plain", "sentinel"):
        if f"replication-{variant}" in med:
            figures = med[f"replication-{variant}"]
            lines.append(f"| fan-out / publish p50, p99 on {variant} Redis"
                         f"{' (--min-replicas 1)' if variant == 'sentinel' else ''} | — | {figures['rate']:,.0f}/s / "
                         f"{figures['publish_p50_ms']:,.1f} ms, {figures['publish_p99_ms']:,.1f} ms | — |")
    if "replication-stall" in med:
        stall = med["replication-stall"]
        lines.append(f"| delivery stall around a primary SIGKILL (Sentinel down-after 1 s) | — | "
                     f"{stall['stall_s']:,.1f} s (publishes refused for {stall['refusing_s']:,.1f} s) | — |")
    if "verify_ms" in med.get("isolation", {}):
        lines.append(f"| a new subscription verified beside the black holes (isolation) | — | "
                     f"{med['isolation']['verify_ms']:,.0f} ms | — |")
    return lines


def ratios_table(results: Mapping[str, Sequence[Mapping]]) -> list[str]:
    """Markdown table: each scenario's median against its ceiling's median, both from this run,
    and the median of the per-run ratios (each run is paired with a ceiling run beside it)."""
    med = medians(results)
    lines = ["| scenario | figure | rsnotify (median) | ceiling (median) | ratio (median of pairs) | goal |",
             "| --- | --- | --- | --- | --- | --- |"]
    for scenario, key, ceiling_key, what, goal in RATIOS:
        figures = med.get(scenario)
        if not figures or key not in figures:
            continue
        if ceiling_key is None:      # the fan-out's ceiling is a scenario of its own
            ceiling = med.get("ceiling", {}).get("rate", math.nan)
            ratio = figures.get("ceiling_ratio", math.nan)
        else:
            ceiling = figures.get(ceiling_key, math.nan)
            ratio = figures.get({"p50_ms": "p50_ratio", "p99_ms": "p99_ratio"}.get(key, "ceiling_ratio"), math.nan)
        lines.append(f"| {scenario} | {what} | {figures[key]:,.1f} | {ceiling:,.1f} | {ratio:.2f}× | {goal} |")
    return lines


def _shown(target: Target, figures: Mapping[str, float], value: float, ceiling: float) -> str:
    if target.key == "ceiling_ratio" and target.scenario == "fanout":
        return f"{figures['rate']:,.0f} deliveries/s = {value:.2f}× ceiling (median of paired runs)"
    if target.key == "rate":
        return f"{value:,.0f}/s"
    if target.unit == "×":
        return f"{value:.2f}×"
    if target.key == "ratio":
        return f"{value:.1f}× (Flask-WebSub {figures.get('rate', math.nan):,.0f} deliveries/s)"
    return f"{value:,.1f}{target.unit}"


def _ratio(value: float | None) -> str:
    return f" = {value:.2f}× ceiling" if value is not None and not math.isnan(value) else ""


class Output:
    """Writes each run's JSON line (stdout and the results file) and its readable line (stdout)."""

    def __init__(self, jsonl: IO[str] | None, stream: TextIO = sys.stdout,
                 also: Callable[[dict], None] | None = None) -> None:
        self.jsonl, self.stream, self.also = jsonl, stream, also

    def emit(self, result: dict) -> None:
        line = json.dumps(_clean(result), sort_keys=True, default=str)
        print(line, file=self.stream)
        print("# " + summary_line(result), file=self.stream, flush=True)
        if self.jsonl is not None:
            self.jsonl.write(line + "\n")
            self.jsonl.flush()
        if self.also is not None:
            self.also(result)

    def say(self, text: str) -> None:
        print("# " + text, file=self.stream, flush=True)


def _clean(value: object) -> object:
    """NaN (a figure that could not be measured) becomes null: the line stays valid JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value
