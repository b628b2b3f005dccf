"""Regression oracle for the simulator: identical predictions before and after a change.

tests/data/sim_oracle.json was written by scripts/record_sim_oracle.py from the SimPy-based
driver *before* the simulator was sped up (f9ca79e; the fault cases again at 7a767fc,
which added the weights-copy records; issue 14: "identical
metrics before and after for a fixed seed (a test compares the whole metrics dict on the
three shipped scenarios)"). For each case -- scenarios/gb10_m5.yaml, home.yaml,
wan_glm.yaml at their own seeds, the simulator benchmark's WAN room
(tests/benchmark/test_bench_sim.py), and variants that take other paths through the
driver (return via the stages, phones with async laps, two kinds of fault) -- this test
simulates again and compares:

* the whole metrics dict, exactly (floats included: JSON round-trips them bit for bit);
* the number of trace records of each kind;
* a SHA-256 of the trace as a multiset (records sorted), so every record keeps its time
  and fields; only the order of records at the same simulated instant may differ.

The expected values are recorded output of the earlier code, not of the code under test:
a change that moves any prediction fails here. One that is meant to (a better model)
re-records the file with the script and says so in its commit.

A regression pin, not validation: it pins a wrong model as firmly as a right one. The
figures it pins are checked independently elsewhere (docs/testing.md): lap arithmetic by
hand (tests/unit/test_sim_*.py, test_lapcost*.py), the published rows
(tests/integration/test_published.py) and held-out measurement (docs/validation.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.record_sim_oracle import CASES, record_case

ROOT = Path(__file__).resolve().parents[2]
ORACLE = json.loads((ROOT / "tests" / "data" / "sim_oracle.json").read_text())


def test_the_oracle_covers_every_case_and_the_three_shipped_scenarios():
    assert sorted(ORACLE) == sorted(name for name, _, _ in CASES)
    shipped = sorted(p.name for p in (ROOT / "scenarios").glob("*.yaml"))
    assert sorted({Path(v["scenario"]).name for v in ORACLE.values() if not v["set"]}) == shipped


@pytest.mark.parametrize("name,path,overrides", CASES, ids=[c[0] for c in CASES])
def test_simulation_matches_the_recorded_oracle(name, path, overrides):
    want = ORACLE[name]
    assert want["scenario"] == path and want["set"] == list(overrides)
    got = record_case(path, overrides)
    assert got["records"] == want["records"]
    assert got["metrics"] == want["metrics"]
    assert got["trace_sha256"] == want["trace_sha256"]


@pytest.mark.parametrize("name,path,overrides", CASES, ids=[c[0] for c in CASES])
def test_event_by_event_and_without_a_trace_the_same(name, path, overrides):
    """The driver's two ways (workers run ahead of the clock where allowed, or every
    event through the queue: sim/driver.py) and a run that keeps no trace give the
    recorded metrics too."""
    want = ORACLE[name]
    slow = record_case(path, overrides, ahead=False)
    assert (slow["metrics"], slow["records"], slow["trace_sha256"]) == (
        want["metrics"], want["records"], want["trace_sha256"])
    assert record_case(path, overrides, trace=False)["metrics"] == want["metrics"]


@pytest.mark.parametrize("path,overrides", [
    ("scenarios/gb10_m5.yaml", ("seed=11", "decoding.async_laps=3", "workload.questions=2")),
    ("scenarios/gb10_m5.yaml", ("seed=12", "network.jitter={distribution: pareto, scale: 2 ms}",
                                "decoding.speculative={drafter: ngram, draft_tokens: 6, acceptance: 0.5}")),
    ("scenarios/wan_glm.yaml", ("seed=13", "decoding.return=direct", "decoding.async_laps=2",
                                "decoding.speculative={drafter: model, draft_tokens: 3, acceptance: 0.9}",
                                "workload.answer_tokens=300")),
    ("scenarios/wan_glm.yaml", ("seed=14", "decoding.return=direct", "network.jitter={distribution: none}",
                                "workload.questions=2", "workload.answer_tokens=40")),
    ("scenarios/home.yaml", ("seed=15", "devices[2].kind=computer", "workload.questions=3")),
])
def test_running_ahead_equals_event_by_event_on_more_rooms(path, overrides):
    """Beyond the recorded cases: rooms where workers run ahead of the clock (direct
    return, no phone worker) give the same metrics, records and trace digest as the
    same room run event by event, the reference way (no recorded values needed)."""
    from sim.driver import Simulation
    from splitroom.scenario import load
    assert Simulation(load(path, list(overrides))).ahead  # the room does run ahead
    fast, slow = record_case(path, overrides), record_case(path, overrides, ahead=False)
    assert fast == slow
    assert fast["metrics"]["answered"] == fast["metrics"]["questions"] > 0


def test_frames_out_of_order_ahead_start_the_run_again_event_by_event(monkeypatch):
    """When running ahead meets two frames of one link firing out of send order (the
    driver raises _Reordered), the run starts again event by event: same result as the
    reference way, and the simulation says so."""
    import sim.driver as drv
    from splitroom.scenario import load
    scn = load("scenarios/gb10_m5.yaml", ["workload.questions=1", "workload.answer_tokens=40"])
    calls = []

    def reorder(self, c):
        calls.append(c)
        raise drv._Reordered

    want = drv.simulate(scn, ahead=False).metrics
    monkeypatch.setattr(drv.Simulation, "_run_ahead", reorder)
    sim = drv.Simulation(scn)
    assert sim.ahead
    got = sim.run()
    assert calls and sim.reordered and got.metrics == want
