"""scripts/replay_auto.py growth_s: the round trips a lap's result frames still pay before the
return hop's window holds them. Expected values from aiortc itself (docs/benchmarks.md, the
2026-12-03 probe at 80 ms: a 9-position SmolLM2 frame from a fresh link paid a whole round trip
on 4 frames, 132/127/130/138 ms one way, then 44 ms), not from the model under test."""

import pytest

import scripts.replay_auto as R


def test_a_nine_position_frame_pays_four_rounds_from_the_initial_window():
    assert R.growth_s(8, R.WINDOW_BYTES, 10) == pytest.approx(4 * 0.080)


def test_only_the_laps_asked_and_a_part_lap_in_proportion():
    assert R.growth_s(8, R.WINDOW_BYTES, 2) == pytest.approx(2 * 0.080)
    assert R.growth_s(8, R.WINDOW_BYTES, 1.5) == pytest.approx(1.5 * 0.080)


def test_a_frame_that_fits_the_first_flight_pays_nothing():
    # 5 positions (k = 4) fit the 11,600 B first flight; any frame fits a window that has grown
    assert R.growth_s(4, R.WINDOW_BYTES, 10) == 0.0
    assert R.growth_s(8, 1e9, 10) == 0.0
