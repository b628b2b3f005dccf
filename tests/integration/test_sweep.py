"""splitroom sweep: combinations, parallel runs equal serial ones, best first."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from splitroom.cli import app
from splitroom.sweep import SweepError, combinations, run_sweep


def test_combinations_are_the_cartesian_product_in_order():
    c = combinations(["network.rtt=0ms,20ms", "decoding.speculative={drafter: ngram, draft_tokens: 4},null"])
    assert c == [(("network.rtt", "0ms"), ("decoding.speculative", "{drafter: ngram, draft_tokens: 4}")),
                 (("network.rtt", "0ms"), ("decoding.speculative", "null")),
                 (("network.rtt", "20ms"), ("decoding.speculative", "{drafter: ngram, draft_tokens: 4}")),
                 (("network.rtt", "20ms"), ("decoding.speculative", "null"))]


@pytest.mark.parametrize("bad", ["rtt", "=1,2", "a=1,,2", "a=1,2 --vary"])
def test_bad_vary_specs(bad):
    if bad == "a=1,2 --vary":
        with pytest.raises(SweepError):
            combinations(["a=1", "a=2"])
        return
    with pytest.raises(SweepError):
        combinations([bad])


def test_parallel_sweep_equals_serial_sweep():
    combos = combinations(["network.rtt=1ms,40ms", "decoding.async_laps=1,2"])
    base = ["decoding.speculative={drafter: ngram, draft_tokens: 3, acceptance: 0.6}"]
    serial = run_sweep("scenarios/home.yaml", base, combos, jobs=1)
    parallel = run_sweep("scenarios/home.yaml", base, combos, jobs=2)
    assert serial == parallel
    assert all(r["error"] is None and r["answered"] == r["questions"] for r in serial)


def test_cli_sweep_sorts_best_first_and_marks_it(tmp_path):
    png = tmp_path / "s.png"
    args = ["sweep", "scenarios/home.yaml", "--vary", "network.rtt=0ms,20ms,80ms", "--vary",
            "decoding.speculative.draft_tokens=1,4", "--set",
            "decoding.speculative={drafter: ngram, acceptance: 0.7}", "--jobs", "1"]
    r = CliRunner().invoke(app, args + ["--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert len(rows) == 6
    tps = [x["tokens_per_s"] for x in rows]
    assert tps == sorted(tps, reverse=True)
    # the best of the six is at loopback: more RTT can only slow a lap down
    assert dict(map(tuple, rows[0]["values"]))["network.rtt"] == "0ms"
    r = CliRunner().invoke(app, args + ["--plot", str(png)])
    assert r.exit_code == 0 and "best" in r.output and png.stat().st_size > 1000


def test_cli_sweep_rejects_a_bad_value_before_running_anything():
    r = CliRunner().invoke(app, ["sweep", "scenarios/home.yaml", "--vary", "network.rtt=1ms,fast"])
    assert r.exit_code == 2 and "network.rtt" in r.output


def test_sort_cost_orders_by_dollars_per_million_useful_tokens_by_hand():
    """Two combinations differ only in the price of the host (rent, USD per hour): the
    room runs the same, so USD per million useful tokens = price / (tokens per hour) x
    1e6, and the cheaper host comes first; without prices --sort cost is refused."""
    from splitroom.sweep import sort_rows
    combos = combinations(["devices[0].price={per_hour: 3 USD},{per_hour: 1 USD}"])
    rows = run_sweep("scenarios/home.yaml", [], combos, jobs=1)
    assert rows[0]["tokens_per_s"] == rows[1]["tokens_per_s"]
    best = sort_rows(rows, "cost")
    assert [r["values"][0][1] for r in best] == ["{per_hour: 1 USD}", "{per_hour: 3 USD}"]
    from sim.driver import simulate
    from splitroom.scenario import load
    m = simulate(load("scenarios/home.yaml", ["devices[0].price={per_hour: 1 USD}"]), trace=False).metrics
    per_hour = m["tokens"] / m["duration_s"] * 3600  # useful tokens per hour, stalls and idle time included
    assert best[0]["usd_per_million_tokens"] == pytest.approx(1.0 / per_hour * 1e6, rel=1e-12)
    assert best[1]["usd_per_million_tokens"] == pytest.approx(3 * best[0]["usd_per_million_tokens"], rel=1e-12)
    out = CliRunner().invoke(app, ["sweep", "scenarios/home.yaml", "--vary", "network.rtt=1ms,2ms", "--sort",
                                   "cost", "--jobs", "1", "--json"])
    assert out.exit_code == 2 and "no device" in out.output and "price" in out.output


def test_sweep_deals_split_optimal_against_each_varied_rtt_as_plan_does():
    """``split: optimal`` searches against the network; a sweep row varying the RTT
    must carry the deal ``plan`` gives at that RTT. The two RTTs give different deals
    (checked here), so a sweep dealing against the default network cannot pass."""
    from splitroom.cli import deal_scenario
    from splitroom.scenario import load
    from splitroom.sweep import predict_one
    base = ("stages=null", "split=optimal", "workload.answer_tokens=8")
    planned = {}
    for rtt in ("1ms", "200ms"):
        scn = load("scenarios/wan_glm.yaml", list(base) + [f"network.rtt={rtt}"])
        d = deal_scenario(scn, "wan_glm.yaml")
        planned[rtt] = (d.host, [{"device": s.device, "start": s.start, "end": s.end} for s in d.stages])
        row = predict_one(("scenarios/wan_glm.yaml", base, (("network.rtt", rtt),), None, False))
        assert row["error"] is None
        assert (row["host"], row["stages"]) == planned[rtt], rtt
    assert planned["1ms"] != planned["200ms"]
