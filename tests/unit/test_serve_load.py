"""scripts/serve_load.py's pure parts: one round's figures from what each client saw (the
measurement and the prediction both go through it), a simulated trace read as clients,
and the markdown table. Expected values by hand (numpy's linear percentiles: p of n sorted
values is x[i] + f (x[i+1] - x[i]) at i + f = p (n - 1) / 100)."""

from __future__ import annotations

import json

import pytest

from planner.protocol import EmitToken, QuestionAsked
from scripts.serve_load import by_client, figures, table


def test_one_rounds_figures_by_hand():
    a = [{"sent": 0.0, "times": [1.0, 1.1, 1.3]}]  # gaps 0.1, 0.2: p50 0.15, p99 0.1 + 0.99 x 0.1
    b = [{"sent": 0.5, "times": [2.0, 2.4]}]  # one gap 0.4
    f = figures([a, b])
    assert f["inter_token_p50_s_worst_client"] == pytest.approx(0.4)
    assert f["inter_token_p50_s_median_client"] == pytest.approx((0.15 + 0.4) / 2)
    assert f["inter_token_p99_s_worst_client"] == pytest.approx(0.4)
    # first tokens 1.0 and 1.5 after sent: p50 1.25, p99 1.0 + 0.99 x 0.5
    assert f["ttft_p50_s"] == pytest.approx(1.25)
    assert f["ttft_p99_s"] == pytest.approx(1.495)
    # a client's gaps are pooled over its questions: a second question of b's with gap 0.1
    b2 = b + [{"sent": 3.0, "times": [3.5, 3.6]}]  # b: gaps 0.4, 0.1: p50 0.25, p99 0.1 + 0.99 x 0.3
    f2 = figures([a, b2])
    assert f2["inter_token_p50_s_worst_client"] == pytest.approx(0.25)
    assert f2["inter_token_p99_s_worst_client"] == pytest.approx(0.397)


def test_a_trace_read_as_its_askers():
    trace = [(0.0, QuestionAsked(0, "client-0", (1, 2), 3)), (0.0, QuestionAsked(1, "client-1", (1, 2), 3)),
             (0.5, EmitToken(0, "client-0", 0, 7)), (0.6, EmitToken(1, "client-1", 0, 7)),
             (0.7, EmitToken(0, "client-0", 1, 7)), (0.9, QuestionAsked(2, "client-0", (1,), 3)),
             (1.2, EmitToken(2, "client-0", 0, 7)), (1.3, EmitToken(99, "nobody", 0, 7))]
    assert by_client(trace) == {"client-0": [{"sent": 0.0, "times": [0.5, 0.7]}, {"sent": 0.9, "times": [1.2]}],
                                "client-1": [{"sent": 0.0, "times": [0.6]}]}


def test_a_simulated_room_of_two_clients_read_as_two_clients():
    from sim.driver import simulate
    from splitroom.scenario import load
    scn = load("scenarios/home.yaml", ["workload.clients=2", "workload.questions=4", "workload.answer_tokens=5",
                                       "workload.prompt_tokens=8", "decoding.questions_in_flight=2",
                                       "context=512"])
    got = by_client(simulate(scn).trace)
    assert sorted(got) == ["client-0", "client-1"]
    assert [len(qs) for qs in got.values()] == [2, 2]
    assert all(len(q["times"]) == 5 for qs in got.values() for q in qs)


def _row(rtt, n, c, agg, it50, it99, ttft, pred, per_client=True):
    m = {k: {"median": v, "min": v, "max": v} for k, v in
         (("aggregate_tokens_per_s", agg), ("inter_token_p50_s_worst_client", it50),
          ("inter_token_p99_s_worst_client", it99), ("ttft_p50_s", ttft))}
    p = {"aggregate_tokens_per_s": pred[0], "inter_token_p50_s": pred[1], "inter_token_p99_s": pred[2],
         "ttft_p50_s": pred[3]}
    if per_client:
        p["per_client"] = {"inter_token_p50_s_worst_client": pred[1], "inter_token_p99_s_worst_client": pred[2]}
    return {"rtt": rtt, "questions_in_flight": n, "clients": c, "predicted": p, "measured": m,
            "load_1min": [0.5, 1.0]}


def test_table_rows_by_hand(tmp_path):
    rows = [_row("40ms", 1, 1, 5.0, 0.200, 0.250, 0.40, (5.0, 0.200, 0.250, 0.50)),
            _row("40ms", 4, 1, 5.5, 0.220, 0.300, 0.45, (4.0, 0.200, 0.250, 0.50), per_client=False)]
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"rows": rows}))
    lines = table([str(f)]).splitlines()
    assert lines[2] == ("| 40ms | 1 | 1 | 5.0 | 5.0 (5.0-5.0) | +0% | 1.00x | 200 / 200 (1.00x, +0%) "
                        "| 250 / 250 (+0%) | 0.50 / 0.40 (-20%) | 0.5-1.0 |")
    # 5.5 / 4.0 = +38 %; 220 / 200 ms alone = 1.10x, +10 % over the pooled prediction (*); 300 / 250 = +20 %;
    # 0.45 / 0.50 = -10 %; x N=1 needs N = 1 at 1 client: 5.5 / 5.0 = 1.10x
    assert lines[3] == ("| 40ms | 4 | 1 | 4.0 | 5.5 (5.5-5.5) | +38% | 1.10x | 200* / 220 (1.10x, +10%) "
                        "| 250* / 300 (+20%) | 0.50 / 0.45 (-10%) | 0.5-1.0 |")


def test_a_second_prediction_beside_by_hand(tmp_path):
    m, p2 = tmp_path / "m.json", tmp_path / "p2.json"
    m.write_text(json.dumps({"rows": [_row("40ms", 1, 1, 5.0, 0.200, 0.250, 0.40, (5.0, 0.200, 0.250, 0.50))]}))
    p2.write_text(json.dumps({"made_utc": "x", "predicted": {"40ms/1/1": {"aggregate_tokens_per_s": 4.0}}}))
    lines = table([str(m), str(p2)]).splitlines()
    assert "| gap | second prediction tok/s (gap) |" in lines[0]
    assert len(lines[1].split("|")) == len(lines[0].split("|"))
    assert lines[2].startswith("| 40ms | 1 | 1 | 5.0 | 5.0 (5.0-5.0) | +0% | 4.0 (+25%) | 1.00x |")  # 5.0 / 4.0
