"""Record what whole ``splitroom simulate`` / ``splitroom sweep`` processes print:
tests/data/simulate_process_oracle.json (a refactoring guard for the simulator's speed work).

For each case (the simulator benchmark's WAN room of 10,000 answer tokens with and
without its range, the three shipped scenarios, a sweep, a run that writes a trace) it
runs the console script's entry point in a fresh Python process, as a user does, and
stores the exit status, stdout (parsed when it is JSON), stderr, and the SHA-256 of any
file the command wrote. The committed file was recorded from main at 2724592, before
the start-up and hot-path changes of that work; re-run it only when a change is *meant*
to change what simulate or sweep print, and say so in that commit.

    PYTHONPATH=. .venv/bin/python scripts/record_simulate_process.py [OUT.json]
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the benchmark room's --set overrides (docs/benchmarks.md, tests/benchmark/test_bench_sim.py)
BENCH_SETS = (
    "decoding.speculative={drafter: model, draft_tokens: 4, acceptance: 0.8, draft_cost: 13 ms}",
    "decoding.async_laps=4", "decoding.return=direct", "workload.answer_tokens=10000", "context=10240")


def _sets(sets) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


#: (name, argv after ``splitroom``, slow); ``{out}`` in an argument is a file the command writes
CASES = (
    ("wan_bench_10k", ["simulate", "scenarios/wan_glm.yaml", *_sets(BENCH_SETS), "--json"], True),
    ("wan_bench_10k_no_range", ["simulate", "scenarios/wan_glm.yaml", *_sets(BENCH_SETS), "--json",
                                "--no-range"], False),
    ("gb10_m5", ["simulate", "scenarios/gb10_m5.yaml", "--json"], False),
    ("home", ["simulate", "scenarios/home.yaml", "--json"], False),
    ("wan_glm", ["simulate", "scenarios/wan_glm.yaml", "--json"], False),
    ("home_table", ["simulate", "scenarios/home.yaml", "--no-progress"], False),
    ("home_trace", ["simulate", "scenarios/home.yaml", "--json", "--trace", "{out}"], False),
    ("wan_sweep", ["sweep", "scenarios/wan_glm.yaml", "--vary", "network.rtt=20ms,45ms",
                   "--vary", "decoding.async_laps=1,4", "--set", "decoding.return=direct",
                   "--set", "workload.answer_tokens=300", "--jobs", "1", "--json"], False),
)

#: the console script (pyproject's splitroom = splitroom.cli:main), run by this interpreter
ENTRY = "import sys; from splitroom.cli import main; sys.argv[0] = 'splitroom'; sys.exit(main())"


def run_case(argv) -> dict:
    """Run ``splitroom ARGV`` in a new process at the repository root; returns
    ``{"rc", "stdout", "stderr", "file_sha256"}`` (stdout parsed when it is JSON)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        args = [a.replace("{out}", out) for a in argv]
        env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="120", TERM="dumb")
        env.pop("FORCE_COLOR", None)
        p = subprocess.run([sys.executable, "-c", ENTRY, *args], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
        digest = hashlib.sha256(Path(out).read_bytes()).hexdigest() if os.path.exists(out) else None
    try:
        stdout = json.loads(p.stdout)
    except ValueError:
        stdout = p.stdout
    return {"rc": p.returncode, "stdout": stdout, "stderr": p.stderr, "file_sha256": digest}


def main(argv: list[str]) -> None:
    out = Path(argv[0]) if argv else ROOT / "tests" / "data" / "simulate_process_oracle.json"
    cases = {name: {"argv": args} | run_case(args) for name, args, _ in CASES}
    out.write_text(json.dumps(cases, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
