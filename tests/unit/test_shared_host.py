"""What a room adds to a prefill chunk, and what device processes sharing one machine's
cores add (planner.profile DeviceProfile.prefill_ratio, SharedHost, Profile.on_one_host;
splitroom.calibration room_passes, room_overheads' prefill ratio, with_room_overheads,
with_shared_room; splitroom.real.on_this_host; sim.devices' prefill pass). Every value
below is worked out by hand."""

from __future__ import annotations

import pytest
import yaml

from planner.deal import Deal
from planner.profile import Curve, DeviceProfile, PassCurve, Profile, ProfileError, SharedHost, TransportProfile
from splitroom.calibration import CalibrationError, room_overheads, room_passes, with_room_overheads, with_shared_room

# pass_s = fixed + layers * per_layer; tokens (1, 5, 16) x one context (128)
STAGE = PassCurve((1, 5, 16), (128,), ((0.001, 0.002, 0.004),), ((0.0002, 0.0010, 0.0030),))
HEAD = Curve((1.0, 16.0), (0.001, 0.003))


def _profile(slowdowns=(1.0, 3.0), shared=None) -> Profile:
    devs = {name: DeviceProfile(STAGE.scaled(f), HEAD.scaled(f), f) for name, f in zip(("a", "b"), slowdowns)}
    return Profile(devs, {}, None, {}, shared_host=shared or {})


def test_room_passes_by_hand_decode_excess_per_unit_of_slowdown_and_prefill_ratio():
    cal = {"stage_s_each": {"a": [0.010, 0.014], "b": [0.036, 0.036]},
           "chunk_s_per_layer": {"a": (16, 0.002), "b": (16, 0.003)}}
    layers = {"a": 10, "b": 10}
    # decode: a 12 ms mean against 10 ms expected: +2 ms; b 36 ms against 30 ms, slowdown 3: +2 ms a unit
    # prefill of 16: a 20 ms against 16 ms: x1.25; b 30 ms against 20 ms: x1.5; mean x1.375
    extra, ratio = room_passes(cal, layers, {"a": 0.010, "b": 0.030}, {"a": (16, 0.016), "b": (16, 0.020)},
                               {"a": 1.0, "b": 3.0})
    assert extra == pytest.approx(0.002) and ratio == pytest.approx(1.375)
    # b's chunks are 14 tokens, not the 16 expected: left out; none left: no ratio
    mixed = dict(cal, chunk_s_per_layer={"a": (16, 0.002), "b": (14, 0.003)})
    assert room_passes(mixed, layers, {"a": 0.010}, {"a": (16, 0.016), "b": (16, 0.020)})[1] == pytest.approx(1.25)
    assert room_passes(mixed, layers, {"a": 0.010}, {"b": (16, 0.020)}) == (pytest.approx(0.002), None)
    with pytest.raises(CalibrationError, match="no decode stage"):
        room_passes({"stage_s_each": {}}, layers, {"a": 0.010}, {})


def test_room_overheads_prefill_ratio_is_beyond_the_decode_ratio():
    cal = {"s_per_layer": {"a": 0.002, "b": 0.002}, "hop_p50_s": 0.004, "hop_s": 0.004, "hops": 4,
           "head_s_per_row": 0.001, "stage_s_each": {"a": [0.024, 0.024], "b": [0.024, 0.024]},
           "chunk_s_per_layer": {"a": (16, 0.004), "b": (16, 0.004)}}
    tr = TransportProfile(Curve((2336.0, 11552.0), (0.001, 0.002)), 11600.0)
    dev = DeviceProfile(STAGE, HEAD)
    # decode 24 ms against 20 ms alone: ratio 1.2; a 12-layer chunk of 16 takes 48 ms against
    # 30 ms alone, 36 ms after the ratio: x4/3
    out = room_overheads(cal, {"a": 0.020, "b": 0.020}, {"a": 12, "b": 12}, dev, tr, tr, None,
                         {"a": (16, 0.030), "b": (16, 0.030)})
    assert out["stage_ratio"] == pytest.approx(1.2) and out["prefill_ratio"] == pytest.approx(4 / 3)
    assert "prefill_ratio" not in room_overheads(cal, {"a": 0.020}, {"a": 12}, dev, tr, tr)


def test_with_room_overheads_keeps_the_prefill_ratio_for_two_processes_on_one_machine():
    room = {"stage_ratio": 1.2, "stage_extra_s": 0.0, "stage_fold": "ratio", "hop_s": 0.0, "head_s": 0.0,
            "laps": 4, "tokens_per_s": 1.0, "prefill_ratio": 4 / 3}
    prof = with_room_overheads(_profile(), room)
    # separate machines (the devices as they are) keep no prefill factor: the chunks' overlap is the
    # two processes sharing this machine's cores
    assert [v.prefill_ratio for v in prof.devices.values()] == [1.0, 1.0]
    assert prof.shared_host[2].pass_s == 0.0 and prof.shared_host[2].prefill_ratio == pytest.approx(4 / 3)
    assert prof.devices["a"].stage.pass_s(10, 16, 128) == pytest.approx(1.2 * 0.034)  # the curve: ratio only
    assert "prefill chunks x1.3333" in prof.notes["room"]
    two, _ = prof.on_one_host(2)
    assert [v.prefill_ratio for v in two.devices.values()] == pytest.approx([4 / 3, 4 / 3])
    assert two.devices["a"].stage == prof.devices["a"].stage
    # the wgpu fold is left as it was (no prefill ratio)
    gpu = with_room_overheads(_profile(), dict(room, stage_fold="added", stage_extra_s=0.001))
    assert gpu.shared_host == {}
    back = Profile.from_mapping(yaml.safe_load(yaml.safe_dump(prof.to_mapping())))
    assert back.shared_host == prof.shared_host


def test_the_simulator_multiplies_only_prefill_passes_by_the_ratio():
    from sim.devices import DeviceModel
    from splitroom.scenario import load
    scn = load("scenarios/home.yaml")
    dp = DeviceProfile(STAGE, HEAD, 1.0, 1.5)
    dm = DeviceModel(scn.device("desktop"), scn.model, profile=dp)
    # 10 layers, 16 positions: 4 + 30 = 34 ms; a prefill chunk x1.5 = 51 ms; a verify pass of 5: 12 ms
    assert dm.run_s(10, 16, 0, 0.0, False) == pytest.approx(0.051)
    assert dm.run_s(10, 5, 200, 1.0, True) == pytest.approx(0.012)
    assert dm.pass_s(10, 16, 0) == pytest.approx(0.034)


def test_on_one_host_takes_the_largest_measured_count_not_above_the_rooms():
    prof = _profile(shared={2: SharedHost(0.0, 1.5), 3: SharedHost(0.004, 1.25)})
    same, line = prof.on_one_host(1)
    assert same is prof and line == ""  # one process: nothing shared
    two, line = prof.on_one_host(2)
    assert two.devices["a"].stage == prof.devices["a"].stage and two.devices["b"].prefill_ratio == 1.5
    three, line = prof.on_one_host(3)
    # a, 10 layers: decode 3 ms + 4 ms; b (slowdown 3): 3 x (3 + 4) ms; the prefill ratio replaced
    assert three.devices["a"].stage.pass_s(10, 1, 128) == pytest.approx(0.007)
    assert three.devices["b"].stage.pass_s(10, 1, 128) == pytest.approx(0.021)
    assert three.devices["a"].stage.pass_s(10, 16, 128) == pytest.approx(0.038)
    assert {v.prefill_ratio for v in three.devices.values()} == {1.25}
    assert three.devices["a"].head == prof.devices["a"].head and "3 device processes" in line and "+4.00 ms" in line
    five, line = prof.on_one_host(5)
    assert five.devices["a"].stage.pass_s(10, 1, 128) == pytest.approx(0.007)
    assert "measured with 3; 5 not measured" in line
    only_two, line = _profile(shared={2: SharedHost(0.0, 1.5)}).on_one_host(3)
    assert only_two.devices["a"].prefill_ratio == 1.5 and "measured with 2; 3 not measured" in line
    plain, line = _profile().on_one_host(3)  # nothing measured: unchanged, and said
    assert plain.devices == _profile().devices and "predicted as separate machines" in line


def test_on_this_host_counts_the_layer_holders_and_the_host():
    from splitroom.real_predict import on_this_host
    prof = _profile(shared={3: SharedHost(0.004)})  # 2 processes: none measured for 2, so the line says so
    three = Deal.pinned("a", [("a", 0, 10), ("b", 10, 20), ("c", 20, 30)])
    two_and_host = Deal.pinned("a", [("b", 0, 15), ("c", 15, 30)])  # the host holds no layers: 3 processes
    two = Deal.pinned("a", [("a", 0, 15), ("b", 15, 30)])
    assert on_this_host(prof, three)[1] and on_this_host(prof, two_and_host)[1]
    got, line = on_this_host(prof, two)
    assert got is prof and "2 device processes on one machine: no shared-core room" in line
    assert on_this_host(prof, Deal.pinned("a", [("a", 0, 30)])) == (prof, "")


def test_with_shared_room_keeps_it_and_round_trips_through_yaml():
    prof = with_shared_room(_profile(), {"processes": 3, "pass_s": 0.004, "prefill_ratio": 1.25, "laps": 60})
    assert prof.shared_host[3] == SharedHost(0.004, 1.25)
    assert "3-device room" in prof.notes["shared_host"] and "+4.000 ms" in prof.notes["shared_host"]
    back = Profile.from_mapping(yaml.safe_load(yaml.safe_dump(prof.to_mapping())))
    assert back.shared_host == prof.shared_host
    assert with_shared_room(prof, None) is prof
    assert "shared_host" not in _profile().to_mapping()
    no_chunk = with_shared_room(_profile(), {"processes": 3, "pass_s": -0.001, "prefill_ratio": None, "laps": 60})
    assert no_chunk.shared_host[3] == SharedHost(-0.001, 1.0) and "no chunk timed" in no_chunk.notes["shared_host"]


@pytest.mark.parametrize("bad, says", [
    ("[1, 2]", "shared_host: expected a mapping"),
    ("{1: {pass_s: 0.001}}", "shared_host: 1: expected a count of device processes >= 2"),
    ("{three: {pass_s: 0.001}}", "shared_host: 'three'"),
    ("{3: []}", "shared_host.3: expected a mapping with pass_s"),
    ("{3: {pass_s: abc}}", "shared_host.3.pass_s: expected a number of seconds"),
    ("{3: {pass_s: true}}", "shared_host.3.pass_s: expected a number of seconds"),
    ("{3: {pass_s: .nan}}", "shared_host.3.pass_s: expected a number of seconds"),
    ("{3: {pass_s: 0.001, prefill_ratio: 0}}", "shared_host.3.prefill_ratio: expected more than 0"),
    ("{3: {pass_s: 0.001, prefill_ratio: x}}", "shared_host.3.prefill_ratio: expected a number"),
])
def test_a_malformed_shared_host_key_is_one_line_naming_it(bad, says):
    m = _profile().to_mapping()
    m["shared_host"] = yaml.safe_load(bad)
    with pytest.raises(ProfileError) as e:
        Profile.from_mapping(m)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_malformed_prefill_ratio_is_one_line_naming_the_device():
    m = _profile().to_mapping()
    m["devices"]["a"]["prefill_ratio"] = -1
    with pytest.raises(ProfileError, match="devices.a.prefill_ratio: expected more than 0"):
        Profile.from_mapping(m)


def test_walks_stop_at_the_scenarios_answer_cap(monkeypatch):
    """measure_walks asks for answers no longer than the cap and cuts the layer drafters'
    walk at 32 or the cap, whichever is less (a fake model: what it is asked is recorded)."""
    import runtime.calibrate as rc
    from runtime.config import ModelConfig
    asked, walked = [], []

    def answers(model_dir, prompts, max_new, eos=2, backend="numpy", weights="f32"):
        asked.append(max_new)
        return [([1, 2, 3], list(range(10, 10 + max_new))) for _ in prompts]

    def drafters(model_dir, ans, kinds=("ngram",), ks=(1,), log=None):
        walked.append((tuple(kinds), [len(a) for _, a in ans]))
        return {}

    monkeypatch.setattr(rc, "greedy_answers", answers)
    monkeypatch.setattr(rc, "measure_drafters", drafters)
    monkeypatch.setattr(ModelConfig, "load", classmethod(lambda cls, d: type("C", (), {"eos_id": 2})()))
    rc.measure_walks("m", "numpy", {"chat": ["p", "q", "r"]},
                     answer_tokens=20)
    assert asked == [20] and walked == [(("ngram",), [20, 20, 20]), (("early_exit", "model"), [20, 20])]
    asked.clear(), walked.clear()
    rc.measure_walks("m", "numpy", {"chat": ["p", "q"]})
    assert asked == [rc.WALK_ANSWER_TOKENS] and walked[1] == (("early_exit", "model"), [32, 32])
    asked.clear(), walked.clear()
    rc.measure_walks("m", "numpy", {"chat": ["p"]}, answer_tokens=500)  # the cap never lengthens the walk
    assert asked == [rc.WALK_ANSWER_TOKENS]
    assert "up to 20 answer tokens (the scenario answer cap)" in next(iter(rc.sample_notes(["x"], 20).values()))
    # quick: prompt lookup on every answer of up to 16 tokens; the model drafter alone on the
    # first answer's first 8 (its call times), or fewer under the cap
    asked.clear(), walked.clear()
    rc.measure_walks("m", "numpy", {"chat": ["p", "q"]}, quick=True)
    assert asked == [16] and walked == [(("ngram",), [16, 16]), (("model",), [8])]
    asked.clear(), walked.clear()
    rc.measure_walks("m", "numpy", {"chat": ["p", "q"]}, quick=True, answer_tokens=5)
    assert asked == [5] and walked == [(("ngram",), [5, 5]), (("model",), [5])]


def test_a_quick_calibration_walks_a_samples_first_four_prompts_and_says_so(monkeypatch):
    """The acceptance step of ``calibrate --quick`` walks the first 4 of a sample's 12
    prompts, 16 tokens each, k = 1 and 4, no drafter that runs layers; the full one the
    first 24 (all 12 here), and the notes say which (a fake model records what it is asked)."""
    import runtime.calibrate as rc
    from runtime.config import ModelConfig
    asked, walked = [], []

    def answers(model_dir, prompts, max_new, eos=2, backend="numpy", weights="f32"):
        asked.append((tuple(prompts), max_new))
        return [([1, 2, 3], list(range(10, 10 + max_new))) for _ in prompts]

    def drafters(model_dir, ans, kinds=("ngram",), ks=(1,), log=None):
        walked.append((tuple(kinds), tuple(ks), len(ans)))
        return {"ngram": type("D", (), {"accepted": {}, "walks": {"chat": {}}})()}

    monkeypatch.setattr(rc, "greedy_answers", answers)
    monkeypatch.setattr(rc, "measure_drafters", drafters)
    monkeypatch.setattr(ModelConfig, "load", classmethod(lambda cls, d: type("C", (), {"eos_id": 2})()))
    sample = [f"prompt {i}" for i in range(12)]
    out = rc.measure_acceptance("m", "numpy", sample, quick=True, answer_tokens=32)
    assert asked == [(("prompt 0", "prompt 1", "prompt 2", "prompt 3"), 16)]
    # a quick walk also times the model drafter, on the first answer's first 8 tokens
    assert walked == [(("ngram",), (1, 4), 4), (("model",), (2, 4), 1)]
    assert list(out["notes"].values()) == [
        "12 workload.sample prompts, the first 4 walked (prompt lookup, up to 16 answer tokens (the scenario "
        "answer cap); the drafters that run layers: the model drafter alone, the first 1, 8 tokens (a quick "
        "calibration))"]
    asked.clear(), walked.clear()
    out = rc.measure_acceptance("m", "numpy", sample, answer_tokens=32)
    assert asked == [(tuple(sample), 32)]
    assert walked == [(("ngram",), (1, 2, 4, 8), 12), (("early_exit", "model"), (2, 4), 4)]
    assert list(out["notes"].values()) == [
        "12 workload.sample prompts, the first 12 walked (prompt lookup, up to 32 answer tokens (the scenario "
        "answer cap); the drafters that run layers: the first 4, 32 tokens)"]


def test_the_calibration_rooms_scenario_pins_the_cuts_on_loopback_with_two_prompts():
    from runtime.calibrate import CALIBRATION_PROMPTS
    from splitroom.calibration import _calibration_room
    from splitroom.scenario import load
    scn = load("scenarios/home.yaml", ["network.rtt=40ms"])
    devs = [d for d in scn.devices if d.id in ("desktop", "laptop", "phone")]
    room = _calibration_room(scn, devs, [0, 10, 20, 30], 12)
    # the cuts by hand: 1-10, 11-20, 21-30 on the devices in the order given, the first the host
    assert [(s.device, s.start, s.end) for s in room.options.stages] == [
        (devs[0].id, 0, 10), (devs[1].id, 10, 20), (devs[2].id, 20, 30)]
    assert room.options.host == devs[0].id and room.options.headroom == 0.0
    assert all(d.lends_bytes >= 1 << 40 for d in room.devices)
    assert room.network.rtt_s == 0.0 and room.network.links == () and room.network.episodes is None
    assert room.workload.prompts == tuple(CALIBRATION_PROMPTS[:2]) and room.workload.questions == 2
    assert room.workload.answer_tokens == 12 and room.decoding.speculative is None
    assert room.decoding.async_laps == 1


def test_on_one_host_gives_a_layer_drafter_the_per_pass_excess_once_a_drafted_token():
    from planner.profile import DrafterProfile
    call = Curve((2.0, 4.0), (0.150, 0.300))
    prof = Profile({"a": DeviceProfile(STAGE, HEAD)}, {"model": DrafterProfile(call), "ngram": DrafterProfile(call)},
                   None, {}, shared_host={2: SharedHost(0.0, 1.5), 3: SharedHost(0.004, 1.25)})
    three, line = prof.on_one_host(3)
    # model: 2 passes x 4 ms on 150 ms, 4 x 4 ms on 300 ms; a lookup (ngram) runs no pass
    assert three.drafters["model"].draft_s(2) == pytest.approx(0.158)
    assert three.drafters["model"].draft_s(4) == pytest.approx(0.316)
    assert three.drafters["model"].draft_s(0) == 0.0
    assert three.drafters["ngram"].call_s == call and "model drafter's too" in line
    two, line = prof.on_one_host(2)  # two processes: no per-pass excess measured (0 s)
    assert two.drafters["model"].draft_s(4) == pytest.approx(0.300) and prof.drafters["model"].call_s == call


def test_a_drafters_call_time_leaves_out_each_walks_first_call(monkeypatch):
    """The first call of a walk catches up on the prompt (a drafter that runs layers starts
    with an empty KV cache): by hand, walks timed [1.0, 0.2] and [0.5] give the median of
    [0.2, 0.5], 0.35 s, not of [1.0, 0.2, 0.5] (0.5 s); a walk of one call keeps it."""
    import runtime.calibrate as rc
    times = iter([([1, 1], [1.0, 0.2]), ([1], [0.5])])
    monkeypatch.setattr(rc, "speculative_walk", lambda drafter, prompt, answer, k: next(times))
    out = rc.measure_drafters("unused", [([1], [2, 3]), ([1], [2])], kinds=("ngram",), ks=(1,))
    assert out["ngram"].call_s.ys == pytest.approx((0.35,))


def test_a_walk_begins_after_the_first_answer_token_which_the_prefill_gives():
    """Prompt lookup on a hand-built answer that copies the prompt's tail. The room's
    first answer token (11) comes from the prefill, so the first lap drafts after
    prompt + [11]: the suffix [11] occurs at index 1 of the prompt, the drafts are
    12 13 14 15, all right against the rest of the answer, and the lap's own token
    (99) ends it: one lap, 4 accepted. Walking from the first token as well would add
    a lap drafted from the prompt alone (15 15 15 15 against 11: 0 accepted) that no
    room runs."""
    import runtime.calibrate as rc
    prompt, answer = [10, 11, 12, 13, 14, 15], [11, 12, 13, 14, 15, 99]
    out = rc.measure_drafters("unused", [(prompt, answer)], kinds=("ngram",), ks=(1, 4))
    assert out["ngram"].accepted[4] == (4,)
    # k=1: lap 1 drafts 12 (right; the lap's own token 13), lap 2 drafts 14 after the
    # suffix 11 12 13 (right; its token 15), lap 3 drafts 11 (what follows 13 14 15 in
    # the prompt) against 99 (wrong): 1, 1, 0
    assert out["ngram"].accepted[1] == (1, 1, 0)
    assert out["ngram"].walks["chat"][4] == ((4,),)
