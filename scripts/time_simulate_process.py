"""Time whole ``splitroom simulate`` processes of the simulator benchmark's WAN room
(docs/benchmarks.md): wall seconds and CPU seconds (user + sys of the child, from
``os.wait4``), each run holding ``/tmp/splitroom-timing.lock`` (as ``flock`` does) so two timings never
overlap; prints every run, then median and min-max, and the machine's load.

    PYTHONPATH=. .venv/bin/python scripts/time_simulate_process.py [--runs 5] [-- EXTRA SIMULATE ARGS]
    PYTHONPATH=. .venv/bin/python scripts/time_simulate_process.py --command "plan tests/data/room12_80.yaml"
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.record_simulate_process import BENCH_SETS, ENTRY, _sets  # noqa: E402

TOKENS = 10_000
LOCK = "/tmp/splitroom-timing.lock"


def one_run(extra: list[str], command: str | None = None) -> tuple[float, float]:
    """(wall s, user+sys CPU s) of one whole process, under the timing lock: the
    benchmark's simulate with ``extra`` arguments, or ``splitroom COMMAND``."""
    args = shlex.split(command) if command else ["simulate", "scenarios/wan_glm.yaml", *_sets(BENCH_SETS),
                                                 "--json", *extra]
    argv = [sys.executable, "-c", ENTRY, *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as flock(1) does; the clock starts once it is held
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"run failed: exit {os.waitstatus_to_exitcode(status)}")
    return wall, ru.ru_utime + ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--command", help="time `splitroom COMMAND` instead (e.g. 'plan tests/data/room12_80.yaml')")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    walls, cpus = [], []
    print("load before:", os.getloadavg())
    for i in range(a.runs):
        w, c = one_run(a.extra, a.command)
        walls.append(w)
        cpus.append(c)
        print(f"run {i + 1}: wall {w:.3f} s, cpu {c:.3f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    mw, mc = statistics.median(walls), statistics.median(cpus)
    rate = "" if a.command else f" -> {TOKENS / mw:,.0f} answer tokens/s"
    print(f"wall median {mw:.3f} s [{min(walls):.3f}-{max(walls):.3f}]{rate}")
    rate = "" if a.command else f" -> {TOKENS / mc:,.0f} answer tokens/CPU s"
    print(f"cpu  median {mc:.3f} s [{min(cpus):.3f}-{max(cpus):.3f}]{rate}")
    print("load after:", os.getloadavg(), time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))


if __name__ == "__main__":
    main()
