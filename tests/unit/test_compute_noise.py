"""The calibration room's ping-pong beside it and its compute noise, and the range's
compute-noise source (splitroom/calibration.py room_overheads, planner.profile
block_mean, splitroom/ranges.py): values by hand."""

from __future__ import annotations

import dataclasses

import pytest

from planner.deal import deal as make_deal
from planner.profile import Curve, DeviceProfile, PassCurve, Profile, ProfileError, TransportProfile, block_mean
from splitroom.calibration import CalibrationError, room_overheads, stage_noise, with_room_overheads
from splitroom.scenario import load


def _dev() -> DeviceProfile:
    stage = PassCurve((1, 16), (0, 2048), ((0.001, 0.002), (0.001, 0.002)), ((0.002, 0.004), (0.002, 0.004)))
    return DeviceProfile(stage, Curve((1.0, 16.0), (0.003, 0.006)))


def _transport(a: float, b: float) -> TransportProfile:
    return TransportProfile(Curve((2336.0, 11552.0), (a, b)), 11600.0)


def test_block_mean_by_hand_wraps_past_the_end():
    xs = [0.9, 1.0, 1.1, 1.4]
    assert block_mean(xs, [0, 2], 2) == pytest.approx((0.9 + 1.0 + 1.1 + 1.4) / 4)
    assert block_mean(xs, [3], 2) == pytest.approx((1.4 + 0.9) / 2)
    assert block_mean(xs, [1, 1], 3) == pytest.approx((1.0 + 1.1 + 1.4) / 3)
    for bad in [([], [0], 1), (xs, [], 1), (xs, [0], 0), (xs, [4], 1), (xs, [-1], 1)]:
        with pytest.raises(ProfileError):
            block_mean(*bad)


def test_stage_noise_is_each_laps_time_over_its_stages_mean_averaged_over_stages():
    # a: mean 2 -> 0.5, 1, 0.5, 2; b: mean 2 -> all 1 (its fifth lap cut)
    got = stage_noise({"a": [1.0, 2.0, 1.0, 4.0], "b": [2.0, 2.0, 2.0, 2.0, 2.0], "c": []})
    assert got == pytest.approx((0.75, 1.0, 0.75, 1.5))
    assert stage_noise({}) == () and stage_noise({"a": [0.0, 0.0]}) == ()


def _cal():
    return {"s_per_layer": {"desktop": 0.002, "laptop": 0.003}, "hop_p50_s": 0.004, "hop_s": 0.005, "hops": 10,
            "head_s_per_row": 0.007, "stage_s_each": {"desktop": [0.03, 0.03, 0.06], "laptop": [0.045, 0.045, 0.045]}}


def test_room_overheads_by_hand_against_the_ping_pong_beside_the_room():
    out = room_overheads(_cal(), {"desktop": 0.02, "laptop": 0.03}, {"desktop": 15, "laptop": 15}, _dev(),
                         _transport(0.001, 0.002), _transport(0.003, 0.004))
    # means: desktop 0.04 s over 0.02 alone, laptop 0.045 over 0.03; medians 0.002 * 15 / 0.02, 0.003 * 15 / 0.03
    assert out["stage_ratio"] == pytest.approx((2.0 + 1.5) / 2) and out["stage_ratio_p50"] == pytest.approx(1.5)
    # the two ping-pongs' mean at the decode frame is 2 ms; the room's hop 5 ms on average, 4 ms the median
    assert out["hop_s"] == pytest.approx(0.003) and out["hop_p50_s"] == pytest.approx(0.002)
    assert out["one_way_s"] == pytest.approx({"2336": 0.002, "11552": 0.003})
    assert out["head_s"] == pytest.approx(0.004)  # 7 ms per row against the 3 ms head of one row
    assert out["stage_noise"] == pytest.approx([0.875, 0.875, 1.25])  # desktop 0.75, 0.75, 1.5; laptop 1, 1, 1
    with pytest.raises(CalibrationError, match="no decode stage"):
        room_overheads(dict(_cal(), s_per_layer={}), {"desktop": 0.02}, {"desktop": 15}, _dev(),
                       _transport(0.001, 0.002), _transport(0.001, 0.002))
    other = TransportProfile(Curve((2336.0, 36896.0), (0.001, 0.002)), 11600.0)
    with pytest.raises(CalibrationError, match="different frame sizes"):
        room_overheads(_cal(), {"desktop": 0.02}, {"desktop": 15}, _dev(), _transport(0.001, 0.002), other)


def test_folding_in_takes_the_ping_pong_beside_the_room_and_keeps_the_noise():
    prof = Profile({"desktop": _dev()}, transport=_transport(0.010, 0.020))  # the parts step, another load
    room = room_overheads(_cal(), {"desktop": 0.02}, {"desktop": 15}, _dev(),
                          _transport(0.001, 0.002), _transport(0.003, 0.004))
    room.update(laps=3, tokens_per_s=1.0)
    got = with_room_overheads(prof, room)
    # the beside curve (2 ms, 3 ms) plus the 3 ms hop: the decode frame's one-way is the room's mean 5 ms hop
    assert got.transport.one_way_s.ys == pytest.approx((0.005, 0.006))
    assert got.transport.window_bytes == 11600.0
    assert got.stage_noise == pytest.approx((0.875, 0.875, 1.25))
    # the desktop alone was compared: its mean 0.04 s over 0.02 s alone; 0.001 + 10 * 0.002 = 0.021 s times 2
    assert got.devices["desktop"].stage.pass_s(10, 1, 0) == pytest.approx(2.0 * 0.021)
    assert "beside it" in got.notes["room"] and "from medians instead: stage x1.5000, hop +2.000 ms" in got.notes["room"]
    assert "3 decode laps" in got.notes["stage_noise"]
    # a room mapping without the ping-pong beside it shifts the profile's own curve
    old = with_room_overheads(prof, {k: v for k, v in room.items() if k not in ("one_way_s", "stage_noise")})
    assert old.transport.one_way_s.ys == pytest.approx((0.013, 0.023)) and old.stage_noise == ()


def test_stage_noise_round_trips_and_malformed_names_the_key():
    prof = Profile({"desktop": _dev()}, stage_noise=(0.9, 1.25))
    m = prof.to_mapping()
    assert m["stage_noise"] == [0.9, 1.25]
    assert Profile.from_mapping(m).stage_noise == (0.9, 1.25)
    assert "stage_noise" not in Profile({"desktop": _dev()}).to_mapping()
    for bad, words in [("x", "expected a list"), ([1.0, 0], r"stage_noise\[1\]"), ([True], r"stage_noise\[0\]"),
                       ([float("nan")], r"stage_noise\[0\]")]:
        with pytest.raises(ProfileError, match=words):
            Profile.from_mapping(dict(m, stage_noise=bad))


def _plain_room(noise):
    dp = _dev()
    prof = Profile({"desktop": dp, "laptop": dp, "phone": dp}, stage_noise=noise)
    return load("scenarios/home.yaml", ["network.jitter={distribution: none}", "network.episodes=null",
                                        "decoding.speculative=null"]).with_profile(prof)


def test_a_compute_factor_scales_every_profiled_stage_pass_by_hand():
    from splitroom.ranges import compute_factors, with_compute_factor
    import numpy as np
    scn = _plain_room(())
    slow = with_compute_factor(scn, 1.2)
    # 10 layers, 1 token at context 0: 0.001 + 10 * 0.002 = 0.021 s, times 1.2
    assert slow.profile.devices["laptop"].stage.pass_s(10, 1, 0) == pytest.approx(0.0252)
    assert slow.profile.devices["laptop"].head(1) == pytest.approx(0.003)  # the head is not scaled
    assert with_compute_factor(scn, 1.0) is scn
    rng = np.random.default_rng(5)
    assert compute_factors([1.0] * 20, 6, rng) == [1.0] * 6
    # block 1 over [1, 3]: two draws per replica, so each factor is 1, 2 or 3
    fs = compute_factors([1.0, 3.0], 40, np.random.default_rng(7), block=1)
    assert set(fs) <= {1.0, 2.0, 3.0} and len(set(fs)) > 1


def test_a_plain_room_with_compute_noise_gets_a_range_not_a_point():
    from sim.driver import simulate
    from splitroom.ranges import predict_range, range_sources
    assert range_sources(_plain_room(())) == []
    scn = _plain_room((0.8,) * 16 + (1.4,) * 16)  # a quiet stretch, then a loaded one
    assert range_sources(scn) == ["compute: block bootstrap over 32 calibration-room laps"]
    d = make_deal(scn.devices, scn.model, scn.options)
    point = simulate(scn, d, trace=False).metrics
    a, b = predict_range(scn, d, point, 6), predict_range(scn, d, point, 6)
    assert a == b and a["replicas"] == 6
    # the arithmetic, not a speed: each replica is the room simulated with its compute
    # factor (a block-bootstrap mean drawn from the noise's own stream), and the range is
    # the percentiles of those replicas
    import numpy as np
    from splitroom.ranges import compute_factors, with_compute_factor
    factors = compute_factors(scn.profile.stage_noise, 6,
                              np.random.default_rng(np.random.SeedSequence([scn.seed, 0xC0FFEE])))
    assert len(set(factors)) > 1 and all(0.8 <= f <= 1.4 for f in factors)
    each = [simulate(with_compute_factor(scn, f), d, trace=False).metrics["tokens_per_s"] for f in factors]
    for q in (10, 50, 90):
        assert a["tokens_per_s"][f"p{q}"] == pytest.approx(float(np.percentile(each, q)))
    # the same room at another seed draws other factors
    c = predict_range(dataclasses.replace(scn, seed=scn.seed + 1), d, point, 6)
    assert c["tokens_per_s"] != a["tokens_per_s"]
