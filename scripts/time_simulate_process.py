"""Time whole ``splitroom simulate`` processes of the simulator benchmark's WAN room
(docs/benchmarks.md): wall seconds and CPU seconds (user + sys of the child and the
children it waited for, from ``os.wait4``), each run holding ``/tmp/splitroom-test.lock``
and then ``/tmp/splitroom-timing.lock`` (as ``flock`` does) so that no test run and no
other timing overlaps it; prints every run, then median and min-max, and the machine's
load. ``--before DIR`` (repeatable): also time the same command in other checkouts (the
code before a change, or before each step of it), run by run interleaved with this one.

    PYTHONPATH=. .venv/bin/python scripts/time_simulate_process.py [--runs 5] [--before DIR] [-- EXTRA ARGS]
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
LOCKS = ("/tmp/splitroom-test.lock", "/tmp/splitroom-timing.lock")  # in this order, as the brief's flocks


def one_run(extra: list[str], command: str | None = None, root: Path = ROOT) -> tuple[float, float]:
    """(wall s, user+sys CPU s) of one whole process in checkout ``root`` (the caller
    holds the locks): the benchmark's simulate with ``extra`` arguments, or ``splitroom COMMAND``."""
    args = shlex.split(command) if command else ["simulate", "scenarios/wan_glm.yaml", *_sets(BENCH_SETS),
                                                 "--json", *extra]
    argv = [sys.executable, "-c", ENTRY, *args]
    env = dict(os.environ, PYTHONPATH=str(root))
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"run failed: exit {os.waitstatus_to_exitcode(status)}")
    return wall, ru.ru_utime + ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--command", help="time `splitroom COMMAND` instead (e.g. 'plan tests/data/room12_80.yaml')")
    ap.add_argument("--before", type=Path, action="append", default=[],
                    help="another checkout to time too, interleaved (the code before); repeatable")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    trees = {str(b): b.resolve() for b in a.before}
    trees["this checkout"] = ROOT
    walls: dict[str, list[float]] = {k: [] for k in trees}
    cpus: dict[str, list[float]] = {k: [] for k in trees}
    tests, timing = open(LOCKS[0], "a"), open(LOCKS[1], "a")
    fcntl.flock(tests, fcntl.LOCK_EX)  # as flock(1) does; the runs start once both are held
    fcntl.flock(timing, fcntl.LOCK_EX)
    print("load before:", os.getloadavg(), time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    for i in range(a.runs):
        for name, root in trees.items():
            w, c = one_run(a.extra, a.command, root)
            walls[name].append(w)
            cpus[name].append(c)
            print(f"run {i + 1} {name}: wall {w:.3f} s, cpu {c:.3f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    print("load after:", os.getloadavg(), time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    timing.close()
    tests.close()
    for name in trees:
        mw, mc = statistics.median(walls[name]), statistics.median(cpus[name])
        ws, cs = walls[name], cpus[name]
        rate = "" if a.command else f" -> {TOKENS / mw:,.0f} answer tokens/s"
        print(f"{name}: wall median {mw:.3f} s [{min(ws):.3f}-{max(ws):.3f}]{rate}")
        rate = "" if a.command else f" -> {TOKENS / mc:,.0f} answer tokens/CPU s"
        print(f"{name}: cpu  median {mc:.3f} s [{min(cs):.3f}-{max(cs):.3f}]{rate}")


if __name__ == "__main__":
    main()
