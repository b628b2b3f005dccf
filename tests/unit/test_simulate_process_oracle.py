"""Refactoring guard for the simulator's own speed: whole ``splitroom simulate`` and
``splitroom sweep`` processes print what they printed before the speed work.

tests/data/simulate_process_oracle.json was written by scripts/record_simulate_process.py
from main at 2724592, *before* any start-up or hot-path change was made for the
simulator's speed (lazy imports, cheaper replicas, driver fast paths). Each case runs
the console script in a fresh process (the benchmark room of docs/benchmarks.md:
10,000 answer tokens with and without its P10-P90 range; the three shipped scenarios;
the table output; a trace written to a file; a sweep) and must give the recorded exit
status, stdout (the whole JSON: plan, metrics, range, floats bit for bit), stderr and
the SHA-256 of the file it wrote. The expected values are recorded output of the
earlier code, not of the code under test: a change meant only to be faster that moves
any figure, line or trace record fails here. A change that is *meant* to change the
predictions re-records the file with the script and says so in its commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.record_simulate_process import CASES, run_case

ROOT = Path(__file__).resolve().parents[2]
ORACLE = json.loads((ROOT / "tests" / "data" / "simulate_process_oracle.json").read_text())


def test_the_guard_covers_every_case():
    assert sorted(ORACLE) == sorted(name for name, _, _ in CASES)


@pytest.mark.parametrize("name,argv", [
    pytest.param(name, argv, marks=[pytest.mark.slow] if slow else [], id=name) for name, argv, slow in CASES])
def test_the_process_prints_what_it_printed_before(name, argv):
    want = ORACLE[name]
    assert want["argv"] == argv
    got = run_case(argv)
    assert got["rc"] == want["rc"]
    assert got["stderr"] == want["stderr"]
    assert got["stdout"] == want["stdout"]
    assert got["file_sha256"] == want["file_sha256"]
