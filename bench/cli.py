"""`python -m bench [SCENARIO...]`: start sinks (and a hub per scenario), run, print the figures."""
from __future__ import annotations

import asyncio
import datetime
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import click

from .hubproc import HubProcess
from .report import Output, ratios_table, targets_table
from .scenarios import (
    Bench,
    Sizes,
    scenario_ceiling,
    scenario_fanout,
    scenario_ingest,
    scenario_latency,
    scenario_subscribe,
)
from .sinks import SinkProcess

SCENARIOS = ("ceiling", "fanout", "latency", "ingest", "subscribe", "scale", "isolation", "failover", "source",
             "sync")
# named only: not part of "all" (it starts six more servers; the suite's smoke run stays short)
EXTRA_SCENARIOS = ("replication",)
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("scenarios", nargs=-1, type=click.Choice(SCENARIOS + EXTRA_SCENARIOS + ("peer", "all")))
@click.option("--full", is_flag=True, help="The issue's sizes (100,000 subscriptions, 10 s latency, 100,000 sync resources, 5 runs) "
                                           "instead of the quick default.")
@click.option("--smoke", is_flag=True, hidden=True, help="The smallest size of each scenario (the tests').")
@click.option("--runs", type=click.IntRange(1, 50), default=None, help="Runs per scenario [default: 3; 5 with --full].")
@click.option("--sync-resources", type=click.IntRange(1, 1_000_000), default=None, metavar="N",
              help="2 KB resources in the sync scenario's baseline [default: 10,000; 100,000 with --full]; "
                   "e.g. `sync --sync-resources 100000 --runs 1`.")
@click.option("--workers", type=click.IntRange(0, 64), default=2, show_default=True,
              help="Worker processes the hub starts (rsnotify hub --workers).")
@click.option("--redis-url", default=None, help="Run the hub on this Redis instead of its embedded one.")
@click.option("--hub-url", default=None, help="Benchmark a hub already running here (its workers and Redis "
                                              "are yours; scale then needs --redis-url for the memory figure).")
@click.option("--hub-log-level", default="WARNING", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="The hub's --log-level (INFO writes one line per delivery).")
@click.option("--hub-arg", "hub_args", multiple=True, metavar="ARG",
              help="Extra argument for `rsnotify hub` (repeatable), e.g. --hub-arg=--delivery-concurrency=400.")
@click.option("--peer", is_flag=True, help="Also run the fan-out against Flask-WebSub's hub (installed from PyPI "
                                           "into bench/.peer on first use).")
@click.option("--peer-concurrency", type=click.IntRange(1, 64), default=16, show_default=True,
              help="Celery worker processes of the Flask-WebSub hub.")
@click.option("--profile", "profile_dir", type=click.Path(file_okay=False), default=None,
              help="Record py-spy profiles of the hub's processes during fan-out runs into this folder.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="JSON lines file [default: bench/results/<time>.jsonl].")
@click.option("--timeout", type=click.FloatRange(1), default=300.0, show_default=True,
              help="Seconds a run may wait for its deliveries or subscriptions.")
def main(scenarios: Sequence[str], full: bool, smoke: bool, runs: int | None, sync_resources: int | None,
         workers: int, redis_url: str | None,
         hub_url: str | None, hub_log_level: str, hub_args: Sequence[str], peer: bool, peer_concurrency: int, profile_dir: str | None,
         out_path: str | None, timeout: float) -> None:
    """Benchmark an rsnotify hub on this machine: SCENARIOS from ceiling, fanout, latency, ingest,
    subscribe, scale, isolation, failover, source, sync [default: all of them], plus peer with --peer, and
    replication (plain Redis beside Sentinel with --min-replicas 1, and a primary kill) when named.

    Each scenario runs several times; every run prints one JSON line and a readable line
    (starting with '#'), and the end prints the medians against the targets."""
    chosen = list(dict.fromkeys(s for name in (scenarios or ("all",))
                                for s in (SCENARIOS if name == "all" else (name,))))
    if peer and "peer" not in chosen:
        chosen.append("peer")
    if "peer" in chosen and "fanout" not in chosen:
        chosen.insert(0, "fanout")  # the peer's figure is a ratio to ours
    sizes = Sizes.smoke() if smoke else Sizes.full() if full else Sizes.quick()
    if runs is not None:
        sizes = _with(sizes, runs=runs)
    if sync_resources is not None:
        sizes = _with(sizes, sync_resources=sync_resources)
    if out_path is None:
        RESULTS_DIR.mkdir(exist_ok=True)
        out_path = str(RESULTS_DIR / f"{datetime.datetime.now():%Y%m%d-%H%M%S}.jsonl")
    with open(out_path, "w") as jsonl:
        output = Output(jsonl)
        output.say(f"rsnotify bench: {' '.join(chosen)}; {'full' if full else 'smoke' if smoke else 'quick'} sizes, "
                   f"{sizes.runs} runs; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}; hub workers {workers}; results in {out_path}")
        results = asyncio.run(_run(chosen, sizes, output, workers=workers, redis_url=redis_url, hub_url=hub_url,
                                   log_level=hub_log_level, hub_args=tuple(hub_args), peer_concurrency=peer_concurrency,
                                   profile_dir=profile_dir,
                                   timeout=timeout))
        table = targets_table(results)
        ratios = ratios_table(results)
        jsonl.write(json.dumps({"summary": table, "ratios": ratios}) + "\n")
    print("\n".join(["", "Medians (" + " ".join(["python -m bench", *sys.argv[1:]]) + "):", *table, "",
                      "Each scenario against its ceiling, measured in this run:", *ratios]))
    failed = [r for runs_ in results.values() for r in runs_ if not r.get("check", {}).get("ok", True)]
    if failed:
        raise click.ClickException(f"{len(failed)} run(s) failed the delivery check; see the lines marked CHECK FAILED")


def _with(sizes: Sizes, **changes: object) -> Sizes:
    from dataclasses import replace

    return replace(sizes, **changes)


async def _run(chosen: list[str], sizes: Sizes, output: Output, *, workers: int, redis_url: str | None,
               hub_url: str | None, log_level: str, hub_args: tuple[str, ...], peer_concurrency: int,
               profile_dir: str | None,
               timeout: float) -> dict[str, list[dict]]:
    from .failover import scenario_failover
    from .isolation import scenario_isolation
    from .replication import scenario_replication
    from .profiling import Profiler
    from .scale import scenario_scale
    from .source import scenario_source
    from .sync import scenario_sync

    sink = SinkProcess()
    results: dict[str, list[dict]] = {}
    try:
        connector = aiohttp.TCPConnector(limit=256)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
            def start_hub() -> HubProcess:
                return HubProcess(workers=workers, redis_url=redis_url, hub_url=hub_url, log_level=log_level,
                                  extra_args=hub_args)

            bench = Bench(sizes, sink, session, start_hub, output.emit, timeout=timeout,
                          profiler=Profiler(Path(profile_dir)) if profile_dir else None,
                          ceiling_processes=max(1, workers))
            needs_ceiling = any(s in chosen for s in ("ceiling", "scale", "ingest")) and "fanout" not in chosen
            for name in chosen:
                if name == "ceiling":
                    if "fanout" in chosen:
                        continue  # measured between the fan-out runs instead
                    results["ceiling"] = await scenario_ceiling(bench)
                elif name == "fanout":
                    results["fanout"] = await scenario_fanout(bench)
                    results["ceiling"] = bench.ceiling_runs
                elif name == "scale":
                    if needs_ceiling and not bench.ceiling_runs:
                        results["ceiling"] = await scenario_ceiling(bench)
                    results["scale"] = await scenario_scale(bench)
                elif name == "replication":
                    for run in await scenario_replication(bench):    # plain, sentinel and stall apart
                        results.setdefault(run["scenario"], []).append(run)
                elif name == "peer":
                    from .peer import scenario_peer
                    results["peer"] = await scenario_peer(bench, results.get("fanout", []), peer_concurrency)
                else:
                    runner = {"latency": scenario_latency, "ingest": scenario_ingest,
                              "subscribe": scenario_subscribe, "isolation": scenario_isolation,
                              "failover": scenario_failover, "source": scenario_source,
                              "sync": scenario_sync}[name]
                    for result in await runner(bench):   # a scenario's ceiling runs go under their own name
                        results.setdefault(result["scenario"], []).append(result)
    finally:
        sink.stop()
    return results
