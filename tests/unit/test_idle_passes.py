"""A GPU's slower first work after idle, and the in-process delay's lateness, in a
prediction (planner.profile DeviceProfile.idle, TransportProfile.delay_late_s; sim.devices
idle_factor; the simulator's head; splitroom.calibration room_idle_s and the idle fold of
with_room_overheads; splitroom.real's late hops). Every value below is worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from planner.deal import Deal
from planner.profile import Curve, DeviceProfile, PassCurve, Profile, ProfileError, TransportProfile
from sim.driver import simulate
from splitroom.calibration import room_idle_s, with_room_overheads
from splitroom.scenario import from_mapping

# pass_s = fixed + layers * per_layer; tokens (1, 5, 16) x one context (128)
STAGE = PassCurve((1, 5, 16), (128,), ((0.001, 0.002, 0.004),), ((0.0002, 0.0010, 0.0030),))
HEAD = Curve((1.0, 16.0), (0.001, 0.003))
# 1 back to back, x1.2 after 10 ms idle, x1.8 after 40 ms, flat beyond
IDLE = Curve((0.0, 0.010, 0.040), (1.0, 1.2, 1.8))


def test_idle_factor_by_hand_and_the_mapping_round_trip():
    dp = DeviceProfile(STAGE, HEAD, idle=IDLE)
    assert dp.idle_factor(0.0) == 1.0 and dp.idle_factor(-1.0) == 1.0
    assert dp.idle_factor(0.005) == pytest.approx(1.1)   # half way to 10 ms
    assert dp.idle_factor(0.025) == pytest.approx(1.5)   # half way from 10 to 40 ms
    assert dp.idle_factor(0.5) == pytest.approx(1.8)     # beyond the last gap: its factor, not extrapolated
    assert DeviceProfile(STAGE, HEAD).idle_factor(0.04) == 1.0
    tr = TransportProfile(Curve((2336.0,), (0.001,)), delay_late_s=0.0007)
    prof = Profile({"a": dp}, {}, tr, {})
    back = Profile.from_mapping(yaml.safe_load(yaml.safe_dump(prof.to_mapping())))
    assert back.devices["a"].idle == IDLE and back.transport.delay_late_s == pytest.approx(0.0007)
    plain = Profile({"a": DeviceProfile(STAGE, HEAD)}, {}, TransportProfile(Curve((2336.0,), (0.001,))), {})
    m = plain.to_mapping()
    assert "idle" not in m["devices"]["a"] and "delay_late_s" not in m["transport"]


@pytest.mark.parametrize("key, value, says", [
    ("idle", {"0": 1.0, "0.01": 0.0}, "idle: factors must be > 0"),
    ("idle", {"0": -1.0}, "finite and >= 0"),
    ("delay_late_s", -0.001, "delay_late_s: expected a number of seconds >= 0"),
    ("delay_late_s", "soon", "delay_late_s: expected a number of seconds >= 0")])
def test_bad_idle_and_lateness_are_one_line_errors(key, value, says):
    m = Profile({"a": DeviceProfile(STAGE, HEAD)}, {}, TransportProfile(Curve((2336.0,), (0.001,))), {}).to_mapping()
    (m["devices"]["a"] if key == "idle" else m["transport"])[key] = value
    with pytest.raises(ProfileError, match=says):
        Profile.from_mapping(m)


def test_a_decode_pass_after_idle_is_slower_a_prefill_chunk_is_not():
    from sim.devices import DeviceModel
    from splitroom.scenario import load
    scn = load("scenarios/home.yaml")
    dm = DeviceModel(scn.device("desktop"), scn.model, profile=DeviceProfile(STAGE, HEAD, idle=IDLE))
    # 10 layers, one token: 1 + 2 = 3 ms; the first pass knows no earlier work: x1
    assert dm.run_s(10, 1, 128, 0.0, True) == pytest.approx(0.003)
    # it ended at 3 ms; the next starts at 28 ms, 25 ms idle: x1.5
    assert dm.run_s(10, 1, 128, 0.028, True) == pytest.approx(0.0045)
    # ended at 32.5 ms; straight after: x1
    assert dm.run_s(10, 1, 128, 0.0325, True) == pytest.approx(0.003)
    # a prefill chunk of 16 after 100 ms idle: 4 + 30 ms, no factor
    assert dm.run_s(10, 16, 0, 0.1355, False) == pytest.approx(0.034)
    assert dm.idle_factor(0.1695 + 0.040) == pytest.approx(1.8)  # pure: nothing marked
    dm.ran_until(0.2)
    assert dm.idle_factor(0.2) == 1.0


def _room(rtt_ms: float):
    scn = from_mapping({
        "name": "t", "seed": 2, "model": "smollm2-135m", "context": 2048,
        "devices": [{"id": "a", "lends": "2 GB"}, {"id": "b", "lends": "2 GB"}],
        "network": {"rtt": f"{rtt_ms} ms", "bandwidth": "10 Gbit/s"},
        "workload": {"questions": 1, "prompt_tokens": 16, "answer_tokens": 24}})
    return dataclasses.replace(scn, network=dataclasses.replace(scn.network, window_bytes=None))


def test_the_simulated_lap_pays_the_idle_factor_on_the_worker_and_the_host_head():
    """Host a (layers 1-15), worker b (16-30), 20 ms round trip. With every gap of 1 ms or
    more doubling the first work after it: the worker's pass (it waits a round trip) and the
    host's head (it waits for the worker) double, the host's own pass right after its head
    does not. So a lap grows by exactly b's pass (1 + 15 x 0.2 = 4 ms) and a head row (1 ms)."""
    deal = Deal.pinned("a", [("a", 0, 15), ("b", 15, 30)])
    double = Curve((0.0, 0.001), (1.0, 2.0))

    def lap(idle):
        devs = {d: DeviceProfile(STAGE, HEAD, idle=idle) for d in ("a", "b")}
        scn = _room(20).with_profile(Profile(devs, {}, None, {}))
        m = simulate(scn, deal, trace=False).metrics
        assert m["answered"] == 1
        return m["lap_s"]["p50"]
    assert lap(double) - lap(None) == pytest.approx(0.005, abs=1e-9)


def test_room_idle_s_and_the_fold_make_the_factors_relative_to_the_rooms_wait():
    # a lap of 12 ms; worker b's passes 4 and 6 ms: it waited 12 - 5 = 7 ms; the host is left out
    cal = {"stage_s_each": {"a": [0.003, 0.003], "b": [0.004, 0.006]}}
    assert room_idle_s(cal, {"lap_s": {"mean": 0.012}}, "a") == pytest.approx(0.007)
    assert room_idle_s(cal, {}, "a") is None and room_idle_s({"stage_s_each": {"a": [1.0]}}, {"lap_s": {"mean": 1}}, "a") is None
    prof = Profile({"a": DeviceProfile(STAGE, HEAD, idle=IDLE)}, {}, None, {})
    room = {"stage_ratio": 1.0, "stage_extra_s": 0.0, "stage_fold": "added", "hop_s": 0.0, "head_s": 0.0,
            "laps": 4, "tokens_per_s": 1.0, "idle_s": 0.010}
    got = with_room_overheads(prof, room).devices["a"].idle
    # over the factor at the room's 10 ms (1.2), at least 1: 1, 1, 1.5
    assert got.xs == IDLE.xs and got.ys == pytest.approx((1.0, 1.0, 1.5))
    assert "idle factors relative to the room's 10.00 ms" in with_room_overheads(prof, room).notes["room"]
    assert with_room_overheads(prof, dict(room, idle_s=None)).devices["a"].idle == IDLE


def test_a_room_with_its_round_trip_in_process_pays_the_lateness_on_every_hop():
    """predict_real_run with in_process_delay: the profile's transport sets each hop's fixed
    cost (Scenario.with_profile), and 0.7 ms of lateness comes on top of it, on both hops of a
    2-device lap: 1.4 ms more a lap. Without the flag, or at 0 ms, nothing changes."""
    from splitroom.real_predict import predict_real_run
    scn = _room(20)
    deal = Deal.pinned("a", [("a", 0, 15), ("b", 15, 30)])
    tr = TransportProfile(Curve((2336.0, 11552.0), (0.001, 0.002)), delay_late_s=0.0007)
    prof = Profile({d: DeviceProfile(STAGE, HEAD) for d in ("a", "b")}, {}, tr, {})
    late = predict_real_run(scn, deal, prof, 0.02, [16], in_process_delay=True)
    plain = predict_real_run(scn, deal, prof, 0.02, [16])
    assert late["delay_late_s"] == pytest.approx(0.0007) and "delay_late_s" not in plain
    assert late["lap_s"]["p50"] - plain["lap_s"]["p50"] == pytest.approx(0.0014, abs=1e-9)
    loop = predict_real_run(scn, deal, prof, 0.0, [16], in_process_delay=True)
    assert "delay_late_s" not in loop
