"""Measure how long a live notification waits while the running sync audits a big folder.

Real processes, as the e2e suite runs them: `rsnotify hub`, `rsnotify source` over N files,
`rsnotify sync` live (--json). Once the copy is equal, `rsnotify audit --deep --repair` is handed
to the running sync; while it runs, one file of the Source changes every 0.25 s. Printed: the
audit's duration and each notification's `latency_ms` (inbox receipt to applied, as the sync
reports it) during the audit and after it:

    python -m bench.audit_delay --files 20000
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tests.e2e.test_e2e_sync import (
    RSNOTIFY,
    answers,
    spawn,
    tree,
    wait_until,
    write_files,
)
from tests.support.ports import free_port


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=2048)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        hub_port, source_port, sync_port = free_port(), free_port(), free_port()
        hub = spawn(["hub", "--port", str(hub_port), "--data-dir", str(tmp / "hubdata"), "--workers", "1"],
                    tmp / "hub.log", cwd=tmp)
        procs = [hub]
        try:
            hub_url = f"http://127.0.0.1:{hub_port}/"
            wait_until(lambda: answers(hub_url + "health"), "the hub", 60, hub)
            src = tmp / "src"
            write_files(src, range(args.files), size=args.size)
            base = f"http://127.0.0.1:{source_port}/dataset1/"
            source = spawn(["source", "--dir", str(src), "--base-url", base, "--hub", hub_url, "--db",
                            str(tmp / "source.db")], tmp / "source.log")
            procs.append(source)
            caplist = base + "capabilitylist.xml"
            wait_until(lambda: answers(caplist), "the Source", 300, source)
            dest = tmp / "dest"
            sync = spawn(["sync", "--capability-list", caplist, "--dir", str(dest), "--json", "--listen",
                          f"127.0.0.1:{sync_port}", "--poll-interval", "600"], tmp / "sync.log", tmp / "sync.jsonl")
            procs.append(sync)
            copy = dest / f"127.0.0.1_{source_port}" / "dataset1"
            wait_until(lambda: any(e["event"] == "live" for e in sync.events()), "live", 600, sync)
            wait_until(lambda: tree(src) == tree(copy), "the baseline", 600, sync)
            started = time.monotonic()
            audit = subprocess.Popen([RSNOTIFY, "audit", "--capability-list", caplist, "--dir", str(dest), "--deep",
                                      "--repair"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            during: list[str] = []
            n = 0
            while audit.poll() is None:
                name = f"d{n % 7}/r{n}.txt"
                (src / name).write_bytes(f"changed during the audit {n}".encode())
                during.append(name)
                n += 1
                time.sleep(0.25)
            audit_seconds = time.monotonic() - started
            stderr = audit.stderr.read() if audit.stderr else ""
            time.sleep(3)
            for k in range(8):            # after the audit: the quiet latency
                (src / f"d{k % 7}/after{k}.txt").write_bytes(b"after the audit")
                time.sleep(0.25)
            wait_until(lambda: tree(src) == tree(copy), "equal at the end", 120, sync)
            applied = [e for e in sync.events() if e["event"] == "notification.applied"]
            names = {e["notification_id"]: {c["loc"].rsplit("/dataset1/", 1)[1] for c in e["changes"]} for e in applied}
            lat_during = [e["latency_ms"] for e in applied if names[e["notification_id"]] & set(during)]
            lat_after = [e["latency_ms"] for e in applied if any("after" in n for n in names[e["notification_id"]])]
            print(json.dumps({
                "files": args.files, "audit_seconds": round(audit_seconds, 2), "audit_exit": audit.returncode,
                "audit_line": stderr.strip().splitlines()[-1] if stderr.strip() else "",
                "during": {"n": len(lat_during), "median_ms": statistics.median(lat_during) if lat_during else None,
                           "max_ms": max(lat_during, default=None)},
                "after": {"n": len(lat_after), "median_ms": statistics.median(lat_after) if lat_after else None,
                          "max_ms": max(lat_after, default=None)},
                "equal": tree(src) == tree(copy)}))
        finally:
            for proc in reversed(procs):
                proc.stop()


if __name__ == "__main__":
    main()
