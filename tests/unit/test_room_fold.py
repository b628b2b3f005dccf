"""How a calibration room's excess is folded into a profile (splitroom.calibration.with_room_overheads):
a ratio on every pass (numpy), or the same seconds added to every pass (wgpu). Hand-computed values."""

from __future__ import annotations

import pytest

from planner.profile import Curve, DeviceProfile, PassCurve, Profile
from splitroom.calibration import with_room_overheads

# pass_s = fixed + layers * per_layer; tokens (1, 5) x one context
STAGE = PassCurve((1, 5), (128,), ((0.001, 0.002),), ((0.0002, 0.0010),))
HEAD = Curve((1.0, 5.0), (0.001, 0.003))


def _profile(slowdown: float = 1.0) -> Profile:
    return Profile({"a": DeviceProfile(STAGE.scaled(slowdown), HEAD.scaled(slowdown), slowdown)}, {}, None, {})


def _room(fold: str) -> dict:
    return {"stage_ratio": 1.25, "stage_extra_s": 0.0005, "stage_fold": fold, "hop_s": 0.0, "head_s": 0.0001,
            "laps": 10, "tokens_per_s": 1.0}


def test_ratio_scales_every_pass():
    st = with_room_overheads(_profile(), _room("ratio")).devices["a"].stage
    assert st.pass_s(10, 1, 128) == pytest.approx(1.25 * (0.001 + 10 * 0.0002))  # 3.75 ms
    assert st.pass_s(10, 5, 128) == pytest.approx(1.25 * (0.002 + 10 * 0.0010))  # 15 ms


def test_added_fold_adds_the_same_seconds_to_a_verify_pass():
    prof = with_room_overheads(_profile(), _room("added"))
    st = prof.devices["a"].stage
    assert st.pass_s(10, 1, 128) == pytest.approx(0.003 + 0.0005)
    assert st.pass_s(10, 5, 128) == pytest.approx(0.012 + 0.0005)
    assert "+0.500 ms each" in prof.notes["room"]


def test_added_fold_counts_in_units_of_slowdown():
    st = with_room_overheads(_profile(3.0), _room("added")).devices["a"].stage
    assert st.pass_s(10, 1, 128) == pytest.approx(3 * 0.003 + 3 * 0.0005)


def test_a_room_record_without_a_fold_is_a_ratio():
    room = _room("ratio")
    del room["stage_fold"], room["stage_extra_s"]
    st = with_room_overheads(_profile(), room).devices["a"].stage
    assert st.pass_s(10, 1, 128) == pytest.approx(1.25 * 0.003)


def test_room_overheads_excess_in_seconds_by_hand():
    from planner.profile import TransportProfile
    from splitroom.calibration import room_overheads

    cal = {"s_per_layer": {"a": 0.002, "b": 0.003}, "hop_p50_s": 0.004, "hop_s": 0.005, "hops": 10,
           "head_s_per_row": 0.007, "stage_s_each": {"a": [0.03, 0.03, 0.06], "b": [0.045, 0.045, 0.045]}}
    tr = TransportProfile(Curve((2336.0, 11552.0), (0.001, 0.002)), 11600.0)
    dev = DeviceProfile(STAGE, HEAD)
    # mean stage: a 40 ms against 20 ms alone, b 45 ms against 30 ms (b's process padded 3x: 5 ms a unit)
    out = room_overheads(cal, {"a": 0.02, "b": 0.03}, {"a": 15, "b": 15}, dev, tr, tr, {"a": 1.0, "b": 3.0})
    assert out["stage_extra_s"] == pytest.approx((0.020 + 0.015 / 3) / 2)
    assert room_overheads(cal, {"a": 0.02}, {"a": 15}, dev, tr, tr)["stage_extra_s"] == pytest.approx(0.020)
