"""Words a newcomer read that were not what happened (README's first steps tried on a
fresh tree): a worker waiting 3 s for its host said "waiting up to 2.99999 s", and
``run --real`` without a profile titled its table "measured vs predicted" though
nothing was predicted before the run (the figure beside the measured one is the
simulator fitted to that very run)."""

from __future__ import annotations

import asyncio

from rich.console import Console

from runtime.node import await_host, shown_seconds
from splitroom.cli import compare_table
from splitroom.real_predict import RealResult


def test_the_seconds_a_worker_waits_for_its_host_read_as_a_person_would():
    assert [shown_seconds(s) for s in (2.99999, 3.0, 0.5, 59.96, 86400.0, 0.04)] == \
        ["3", "3", "0.5", "60", "86400", "0"]
    lines: list[str] = []
    # a transport that cannot reconnect: the wait ends at once, both lines said
    assert asyncio.run(await_host(object(), "h", 2.99999, say=lines.append)) is False
    assert lines == ["Host reconnecting: lost the model host h; keeping the weights, waiting up to 3 s",
                     "Room over: the model host h did not come back within 3 s"]


def _table_text(res: RealResult) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(compare_table(res))
    return " ".join(console.export_text().split())  # the caption wraps at the table's width


def _result(profile: dict | None) -> RealResult:
    m = {"tokens_per_s": 3.72, "ttft_s": 1.1726, "inter_token_s": {"p50": 0.228, "p99": 0.8215}, "tokens_per_lap": 1.0}
    fit = {"tokens_per_s": 4.42, "ttft_s": 1.0632, "inter_token_s": {"p50": 0.2263, "p99": 0.2265},
           "tokens_per_lap": 1.0}
    err = {"tokens_per_s": 18.8, "ttft_s": -9.3, "inter_token_p50": -0.7, "inter_token_p99": -72.4,
           "tokens_per_lap": 0.0}
    return RealResult(measured=m, predicted=fit, error_pct=err, answers=[], calibration={}, network="loopback",
                      emulated=[], profile_predicted=profile, profile_error_pct=err if profile else None)


def test_run_real_without_a_profile_does_not_call_the_fit_a_prediction():
    text = _table_text(_result(None))
    assert "measured vs predicted" not in text
    assert "measured vs the simulator fitted to this run (loopback)" in text
    assert "no prediction made before the run: give --calibration PROFILE" in text
    assert "same-run fit" in text and "4.42" in text and "+18.8%" in text
    with_profile = _table_text(_result({**_result(None).predicted, "tokens_per_s": 3.9}))
    assert "measured vs predicted (loopback)" in with_profile and "predicted from profile" in with_profile
    assert "no prediction made before the run" not in with_profile
