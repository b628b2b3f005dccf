"""The P10-P90 cell beside a predicted figure says why when the point lies outside its
own range (the point pools every prompt's acceptance; each replica is a run of the
workload's questions: docs/calibration.md). Figures are those a newcomer saw from
``simulate scenarios/gb10_m5.yaml`` on 2026-12-03: 154.36 tok/s against P10-P90
143.86-154.16, and 492.2 ms first token against 491.8-492.0 ms."""

from __future__ import annotations

from splitroom.cli import _ms, _range_cell


def metrics(tok_s: float, ttft_s: float) -> dict:
    return {"tokens_per_s": tok_s, "ttft_s": ttft_s,
            "range": {"replicas": 10, "sources": ["prompts"],
                      "tokens_per_s": {"p10": 143.86, "p50": 150.0, "p90": 154.16},
                      "ttft_s": {"p10": 0.4918, "p50": 0.4919, "p90": 0.4920}}}


def test_a_point_above_its_range_says_why():
    m = metrics(154.36, 0.4922)
    cell = _range_cell(m, "tokens_per_s", lambda x: f"{x:.2f}")
    assert cell == " (P10-P90 143.86-154.16; the point pools all prompts)"
    assert _range_cell(m, "ttft_s", _ms) == " (P10-P90 491.8 ms-492.0 ms; the point pools all prompts)"


def test_a_point_inside_its_range_is_the_plain_cell():
    m = metrics(150.0, 0.4919)
    assert _range_cell(m, "tokens_per_s", lambda x: f"{x:.2f}") == " (P10-P90 143.86-154.16)"
    assert _range_cell(m, "ttft_s", _ms) == " (P10-P90 491.8 ms-492.0 ms)"
    assert _range_cell({"tokens_per_s": 1.0, "range": {"replicas": 0}}, "tokens_per_s", str) == ""
