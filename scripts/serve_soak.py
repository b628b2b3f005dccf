"""Memory of a served room's processes over many questions and clients:
``splitroom serve SCENARIO --loopback`` (the model host's process, one process per
worker and the relay, as shipped, the real model), then the load of
``scripts/host_soak.py`` over its HTTP API: WARMUP answered questions first (the
bounded traces, the scheduler's question ids and the room page's clients fill up),
then REQUESTS requests, each from a client not seen before (``Authorization: Bearer``
a fresh key), 11 keeping the queue full and 4 more asking in between (most of those get
429), until ANSWERED were answered (``max_tokens: 1``).

    .venv/bin/python scripts/serve_soak.py scenarios/home.yaml [--requests 100000]
        [--answered 10000] [--warmup 3000] [--check 1000] [--out serve-soak.json]

Reads every process's VmRSS (``/proc/PID/status``; a process is named by its device's
config file, ``relay`` for the relay) before the load, after the warm-up and every
CHECK answered questions, and writes what it has to OUT after each reading (so a run
stopped early keeps its figures). A run ends early at the first reading after the file
STOP_FILE appears (``--stop-file``), with its readings so far. Clients connect from 127.0.0.1 and stay within the
per-address connection cap (15 at once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_soak import StopSoak, rss_mb, soak  # noqa: E402
from serve_load import Served  # noqa: E402


def _children(pid: int) -> list[int]:
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                kids.append(int(d))
    return kids


def room_processes(root: int) -> dict[str, int]:
    """``{name: pid}`` of the room's processes under ``root`` (its descendants that run
    ``runtime.serve``, ``runtime.node`` or the relay), named by device config stem."""
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        for kid in _children(pid):
            todo.append(kid)
            try:
                with open(f"/proc/{kid}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "runtime.serve" in argv or "runtime.node" in argv:
                i = argv.index("runtime.serve" if "runtime.serve" in argv else "runtime.node")
                out[Path(argv[i + 1]).stem] = kid
            elif any("relay" in a for a in argv[:4]) and "python" in Path(argv[0]).name:
                out["relay"] = kid
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario")
    p.add_argument("--set", action="append", default=[], dest="sets")
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--answered", type=int, default=10_000)
    p.add_argument("--warmup", type=int, default=3_000, help="answered questions before the counted run")
    p.add_argument("--check", type=int, default=1_000, help="read the memory every this many answered questions")
    p.add_argument("--out", default="serve-soak.json")
    p.add_argument("--stop-file", help="end the run at the first reading after this file appears")
    a = p.parse_args()
    srv = Served(a.scenario, a.sets, loopback=True, calibration=None)
    result: dict = {"scenario": a.scenario, "sets": a.sets, "requests": a.requests, "answered": a.answered,
                    "warmup": a.warmup, "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    try:
        srv.wait_ready()
        procs = room_processes(srv.proc.pid)
        result["processes"] = procs
        t0 = time.monotonic()

        def check() -> dict:
            rss = {}
            for name, pid in procs.items():
                try:
                    rss[name] = round(rss_mb(pid), 1)
                except (OSError, RuntimeError):
                    rss[name] = None  # it ended
            return {"rss_mb": rss, "seconds": round(time.monotonic() - t0, 1)}

        result["before"] = check()
        readings: list = []
        progress: dict = {}

        def reading() -> dict:
            r = check()
            readings.append({**progress["counts"], **r})
            result["readings_so_far"] = readings
            Path(a.out).write_text(json.dumps(result, indent=1))
            if a.stop_file and os.path.exists(a.stop_file):
                raise StopSoak
            return r
        try:
            out = asyncio.run(soak(srv.url, a.requests, a.answered, a.warmup, reading, a.check, progress))
        except StopSoak:
            out = {"stopped_early": True, "warmup": progress.get("warmup"), "counts": dict(progress["counts"]),
                   "checks": readings}
        result.update(out)
        result.pop("readings_so_far", None)
        first, last = out["checks"][0]["rss_mb"], out["checks"][-1]["rss_mb"]
        result["growth_mb"] = {k: round(last[k] - first[k], 1) for k in first if first[k] and last.get(k)}
        result["ended_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    finally:
        srv.stop()
        Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result.get(k) for k in ("before", "warmup", "counts", "growth_mb")}, indent=1))


if __name__ == "__main__":
    main()
