"""Model host memory over many questions and clients: a served room (the
host and one worker as real Nodes, the real RoomServer over HTTP; in a child
process) answers WARMUP questions (its bounded trace and page fill up), then REQUESTS
requests, each from a client it has not seen before (``Authorization: Bearer`` a fresh
key): 11 clients at a time keep the queue full (one answered, 10 waiting) and 4 more
ask in between, getting 429 at once, until ANSWERED were answered. The child's resident
memory (VmRSS) is read every CHECK answered questions, with what the room keeps (the
scheduler's per-question set, the page's clients, the host's trace records and bytes,
both nodes' contexts and residuals, the worker's trace records, the server's tickets)
and Python's own counts (``sys.getallocatedblocks()``, ``len(gc.get_objects())``);
with ``--tracemalloc`` also the traced bytes and the source lines that grew most since
the first reading after the warm-up.

    .venv/bin/python scripts/host_soak.py [--requests 100000] [--answered 10000] [--warmup 3000]
        [--check 1000] [--out FILE] [--stop-file FILE] [--tracemalloc]

Writes what it has read to OUT after every reading (a run stopped early keeps it);
ends at the first reading after STOP_FILE appears.

Prints a summary. The room's stages compute nothing (tests/servedroom.py
StandIn: every answer is the end-of-sequence token; the model's own memory is fixed,
and what the host keeps per question and per client is the same), every client comes
from 127.0.0.1 (the per-address connection cap is raised), everything else is as
shipped: the real Nodes, scheduler, transport framing, RoomServer and room page.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

from planner.model import BUNDLED_MODEL_ID

HOST = """
import asyncio, gc, json, os, sys, tracemalloc
if os.environ.get("SOAK_TRACEMALLOC"):
    tracemalloc.start()
from runtime.room import Node
from tests.servedroom import served_room
async def main():
    base = None
    async with served_room(stand_in=True, max_connections_per_address=100000) as (server, url):
        print(url, flush=True)
        while True:
            line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            node, host = server.node, server._host()
            objs = gc.get_objects()
            w = next(o for o in objs if isinstance(o, Node) and o is not node)  # the worker's node
            print(json.dumps({"seen_questions": len(getattr(host, "seen_questions", ())),
                              "page_clients": len(server.page.clients), "trace_records": len(node.trace),
                              "trace_bytes": node.trace.bytes, "contexts": len(node.context),
                              "residuals": len(node.residual), "tickets": len(server.tickets),
                              "queue": len(host.queue), "allocated_blocks": sys.getallocatedblocks(),
                              "gc_objects": len(objs), "worker_residuals": len(w.residual),
                              "worker_trace_records": len(w.trace), "worker_contexts": len(w.context)}),
                  flush=True)
            del objs, w
            if tracemalloc.is_tracing():  # what grew since the first reading after the warm-up
                snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
                if base is None and line.strip() == "base":
                    base = snap
                top = [] if base is None else [
                    {"where": f"{d.traceback[0].filename}:{d.traceback[0].lineno}", "bytes": d.size_diff,
                     "blocks": d.count_diff} for d in snap.compare_to(base, "lineno")[:8]]
                print(json.dumps({"traced_bytes": tracemalloc.get_traced_memory()[0], "grew_most": top}),
                      flush=True)
                del snap
asyncio.run(main())
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def threads(pid: int) -> int:
    """The threads of process ``pid`` now."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


async def soak(url: str, requests: int, answered: int, warmup: int, check, every: int,
               progress: dict | None = None) -> dict:
    """ASKERS loops ask one question at a time each (they keep the queue full: one
    answered, 10 waiting); FLOODERS loops ask while the other requests number less than
    ``(requests - answered) / answered`` per answered one, and mostly get 429. Every
    request is from a client not seen before. ``warmup`` answered questions come first
    (the bounded trace and page fill up), then the counted run. ``progress["counts"]``,
    when given, is the live count of the run (requests, answered, 429, other)."""
    import aiohttp
    counts = {"requests": 0, "answered": 0, "429": 0, "other": 0}
    if progress is not None:
        progress["counts"] = counts
    checks: list = []
    body = {"model": BUNDLED_MODEL_ID, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    ratio = (requests - answered) / max(answered, 1)
    goal = {"answered": warmup, "requests": 0}
    next_check = [0]

    async def one(s) -> None:
        i = counts["requests"]
        counts["requests"] += 1
        async with s.post(url + "/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer soak-client-{i:07d}"}) as r:
            await r.read()
            key = "answered" if r.status == 200 else "429" if r.status == 429 else "other"
        counts[key] += 1
        if counts["answered"] >= next_check[0] and goal["requests"]:
            next_check[0] += every
            checks.append({"requests": counts["requests"], "answered": counts["answered"], **check()})

    def done() -> bool:
        return counts["answered"] >= goal["answered"] and counts["requests"] >= goal["requests"]

    async def asker(s) -> None:
        while not done():
            await one(s)

    async def flooder(s) -> None:
        while not done():
            if counts["requests"] - counts["answered"] < ratio * counts["answered"]:
                await one(s)
            else:
                await asyncio.sleep(0.01)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as s:
        t0 = time.perf_counter()
        await asyncio.gather(*(asker(s) for _ in range(ASKERS)))  # the warm-up
        warm = dict(counts, seconds=round(time.perf_counter() - t0, 1))
        if progress is not None:
            progress["warmup"] = warm
        for k in counts:
            counts[k] = 0
        goal.update(answered=answered, requests=requests)
        next_check[0] = 0
        t0 = time.perf_counter()
        await asyncio.gather(*(asker(s) for _ in range(ASKERS)), *(flooder(s) for _ in range(FLOODERS)))
    checks.append({"requests": counts["requests"], "answered": counts["answered"], **check()})
    return {"warmup": warm, "counts": counts, "seconds": round(time.perf_counter() - t0, 1), "checks": checks}


ASKERS = 11
FLOODERS = 4


class StopSoak(Exception):
    """The stop file appeared: end the run after this reading."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--answered", type=int, default=10_000)
    p.add_argument("--warmup", type=int, default=3_000, help="answered questions before the counted run")
    p.add_argument("--check", type=int, default=1_000, help="read the memory every this many answered questions")
    p.add_argument("--out", help="write the readings so far to this JSON file after each reading")
    p.add_argument("--stop-file", help="end the run at the first reading after this file appears")
    p.add_argument("--tracemalloc", action="store_true",
                   help="trace the host's allocations (slower): each reading adds the traced bytes and the 8 "
                        "source lines whose memory grew most since the first reading after the warm-up")
    a = p.parse_args()
    env = dict(os.environ, PYTHONPATH=os.getcwd(), **({"SOAK_TRACEMALLOC": "1"} if a.tracemalloc else {}))
    child = subprocess.Popen([sys.executable, "-c", HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    result: dict = {"requests": a.requests, "answered": a.answered, "warmup": a.warmup,
                    "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    readings: list = []
    progress: dict = {}
    t0 = time.monotonic()

    def save() -> None:
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)
    try:
        url = child.stdout.readline().strip()

        def read(line: str = "") -> dict:
            child.stdin.write(line + "\n")
            child.stdin.flush()
            got = {"rss_mb": round(rss_mb(child.pid), 1), "threads": threads(child.pid),
                   "seconds": round(time.monotonic() - t0, 1),
                   **json.loads(child.stdout.readline())}
            if a.tracemalloc:
                got.update(json.loads(child.stdout.readline()))
            return got

        def check() -> dict:
            r = read("" if readings else "base")
            readings.append({**progress.get("counts", {}), **r})
            result["readings_so_far"] = readings
            save()
            if a.stop_file and os.path.exists(a.stop_file):
                raise StopSoak
            return r
        result["before"] = read()
        try:
            out = asyncio.run(soak(url, a.requests, a.answered, a.warmup, check, a.check, progress))
        except StopSoak:
            out = {"stopped_early": True, "warmup": progress.get("warmup"), "counts": dict(progress["counts"]),
                   "checks": readings}
        result.update(out)
        result.pop("readings_so_far", None)
        result["before_mb"] = result["before"]["rss_mb"]
        rss = [c["rss_mb"] for c in out["checks"]]
        result["growth_mb"] = round(rss[-1] - rss[0], 1)
        result["spread_mb"] = round(max(rss) - min(rss), 1)
        result["ended_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    finally:
        save()
        child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
    print(json.dumps({k: result.get(k) for k in ("before_mb", "warmup", "counts", "growth_mb", "spread_mb")},
                     indent=1))

if __name__ == "__main__":
    main()
