"""The derived figures of the real room and the held-out study, checked with hand numbers.

The measured side of these figures is a timing, which a test may not bound; what a test
can check is that each figure is the stated formula of the numbers it is given. Here the
numbers are made up and the results worked out by hand beside each assertion; the
integration tests (test_real_room, test_real_privacy, test_heldout_small) run the same
functions on real rooms.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from splitroom.privacy_run import real_privacy_summary
from splitroom.real_predict import RealResult, _error_pct

ROOT = Path(__file__).resolve().parents[2]


def _heldout():
    spec = importlib.util.spec_from_file_location("validate_heldout", ROOT / "scripts" / "validate_heldout.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def figures(tps, ttft, per_lap, p50, p99):
    return {"tokens_per_s": tps, "ttft_s": ttft, "tokens_per_lap": per_lap, "inter_token_s": {"p50": p50, "p99": p99}}


def test_real_error_is_the_signed_percentage_of_the_measured_figure():
    # measured 10 tok/s, predicted 12: (12 - 10) / 10 = +20 %; first token 0.5 s
    # measured, 0.4 s predicted: -20 %; 2 tokens a lap vs 2.5: +25 %; inter-token p50
    # 100 ms vs 90 ms: -10 %; p99 200 ms vs 250 ms: +25 %
    e = _error_pct(figures(10.0, 0.5, 2.0, 0.100, 0.200), figures(12.0, 0.4, 2.5, 0.090, 0.250))
    assert e == pytest.approx({"tokens_per_s": 20.0, "ttft_s": -20.0, "tokens_per_lap": 25.0,
                               "inter_token_p50": -10.0, "inter_token_p99": 25.0})
    # nothing measured (no token came back): 0, not a division by zero
    assert _error_pct(figures(0.0, 0.0, 0.0, 0.0, 0.0), figures(12.0, 0.4, 2.5, 0.09, 0.25)) == {
        "tokens_per_s": 0.0, "ttft_s": 0.0, "tokens_per_lap": 0.0, "inter_token_p50": 0.0, "inter_token_p99": 0.0}


def result(measured_tps, predicted_tps, token_ids):
    return RealResult(measured={"tokens_per_s": measured_tps}, predicted={"tokens_per_s": predicted_tps},
                      error_pct={}, answers=[{"token_ids": token_ids}], calibration={}, network="", emulated=[])


def test_real_price_of_privacy_is_the_change_from_the_plain_room():
    scn = SimpleNamespace(ends_local=(2, 3))
    # ends-local measured 8 tok/s, the plain deal 10: (8 - 10) / 10 = -20 %; predicted
    # 9 and 12: (9 - 12) / 12 = -25 %
    p = real_privacy_summary(scn, result(8.0, 9.0, [5, 6, 7]), result(10.0, 12.0, [5, 6, 7]))
    assert p == {"ends_local": {"first": 2, "last": 3}, "tokens_per_s": 8.0, "plain_tokens_per_s": 10.0,
                 "change_pct": pytest.approx(-20.0), "predicted_tokens_per_s": 9.0,
                 "predicted_plain_tokens_per_s": 12.0, "predicted_change_pct": pytest.approx(-25.0),
                 "same_tokens": True}
    # one token differs: not the same answer; a plain room that measured nothing: no change
    assert real_privacy_summary(scn, result(8.0, 9.0, [5, 6, 7]), result(10.0, 12.0, [5, 6, 8]))["same_tokens"] is False
    assert real_privacy_summary(scn, result(8.0, 9.0, [1]), result(0.0, 0.0, [1]))["change_pct"] is None


def test_heldout_judges_the_median_of_the_runs():
    judge = _heldout().judge
    # three runs at 9, 12 and 10 tok/s: median 10, spread 9-12; predicted 11: +10 %.
    # first tokens 0.50, 0.40, 0.45 s: median 0.45; predicted 0.36: (0.36 - 0.45) / 0.45 = -20 %.
    # later questions' first tokens (each run's mean after its first): 0.3, 0.2, 0.4 s,
    # median 0.3; predicted (0.33 + 0.33) / 2 = 0.33: +10 %. First questions: median 0.55.
    runs = [{"tokens_per_s": 9.0, "ttft_s": 0.50, "ttft_each_s": [0.60, 0.2, 0.4]},
            {"tokens_per_s": 12.0, "ttft_s": 0.40, "ttft_each_s": [0.50, 0.1, 0.3]},
            {"tokens_per_s": 10.0, "ttft_s": 0.45, "ttft_each_s": [0.55, 0.4, 0.4]}]
    p = {"predicted": {"tokens_per_s": 11.0, "ttft_s": 0.36, "ttft_each_s": [0.4, 0.33, 0.33],
                       "range": {"tokens_per_s": {"p10": 9.5, "p90": 10.5}}}, "measured_runs": runs}
    judge(p)
    assert p["measured_tokens_per_s"] == 10.0 and p["spread_tokens_per_s"] == [9.0, 12.0]
    assert p["measured_ttft_s"] == pytest.approx(0.45)
    assert p["error_pct_tokens_per_s"] == pytest.approx(10.0)
    assert p["error_pct_ttft"] == pytest.approx(-20.0)
    assert p["measured_first_ttft_s"] == pytest.approx(0.55) and p["measured_warm_ttft_s"] == pytest.approx(0.3)
    assert p["error_pct_warm_ttft"] == pytest.approx(10.0)
    assert p["inside_range"] is True  # 10 within 9.5-10.5
    p["predicted"]["range"]["tokens_per_s"]["p90"] = 9.9
    judge(p)
    assert p["inside_range"] is False


def test_heldout_summary_is_the_rms_and_the_worst():
    summary = _heldout().summary
    # errors +10 % and -20 %: RMS sqrt((100 + 400) / 2) = 15.81 %, worst -20 %;
    # first tokens -20 % (outside 15 %) and +5 % (inside); later +10 % and none
    preds = [{"error_pct_tokens_per_s": 10.0, "error_pct_ttft": -20.0, "inside_range": True,
              "error_pct_warm_ttft": 10.0},
             {"error_pct_tokens_per_s": -20.0, "error_pct_ttft": 5.0, "inside_range": False,
              "error_pct_warm_ttft": None}]
    assert summary(preds) == {"rms_error_pct_tokens_per_s": pytest.approx(math.sqrt(250)),
                              "worst_error_pct_tokens_per_s": -20.0, "worst_error_pct_ttft": -20.0,
                              "inside_range": 1, "ttft_within_15pct": 1, "warm_ttft_within_15pct": 1}
