"""The simulator models a scenario's faults (``faults:``): the device dies, the room
notices after the heartbeat timeout, re-deals with the planner's rules, copies the
re-dealt weights over the links and replays; the answers stay the reference tokens and
the recovery time is predicted part by part."""

from __future__ import annotations

import pytest

from sim.driver import simulate, truth
from splitroom.scenario import ScenarioError, load

BASE = ["workload.questions=3", "workload.answer_tokens=40", "devices[0].lends=600 MB"]


def emitted(trace):
    out = {}
    for _, x in trace:
        if type(x).__name__ == "EmitToken":
            out.setdefault(x.question_id, []).append(x.token)
    return out


def test_a_worker_lost_at_token_20_is_recovered_and_the_time_predicted():
    scn = load("scenarios/home.yaml", BASE + ["faults=[{device: laptop, at: token 20, detect: 1 s}]"])
    res = simulate(scn)
    before = [(s.device, s.start, s.end) for s in res.deal.stages]
    assert res.deal.host == "desktop" and "laptop" in {d for d, _, _ in before} and "phone" not in {d for d, _, _ in before}
    assert res.metrics["answered"] == 3
    p = scn.workload.prompt_tokens
    assert emitted(res.trace) == {q: [truth(p + i) for i in range(40)] for q in range(3)}
    (rec,) = res.metrics["recovery"]
    redeal = next(x for _, x in res.trace if type(x).__name__ == "Redeal")
    # planner rules over desktop (600 MB) + phone (120 MB): the host keeps the first layers, all 30 held
    assert redeal.stages[0][0] == "desktop" and {d for d, _, _ in redeal.stages} == {"desktop", "phone"}
    assert [(a, b) for _, a, b in redeal.stages] == [(0, redeal.stages[1][1]), (redeal.stages[1][1], 30)]
    _, pa, pb = redeal.stages[1]
    assert redeal.replay_tokens == p + 20  # prompt + the 20 tokens emitted before the loss
    assert rec["detected_at_s"] - rec["lost_at_s"] == pytest.approx(1.0)
    # by hand: the phone's new layers (it held none) at the room's bandwidth + rtt/2; the host reads its
    # own disk (no copy speed in the scenario: instant), so the phone's copy is the whole wait
    n = scn.network
    assert rec["copy_s"] == pytest.approx((pb - pa) * scn.model.layer_bytes / n.bandwidth_Bps + n.rtt_s / 2)
    assert rec["ready_at_s"] == pytest.approx(rec["detected_at_s"] + rec["copy_s"])
    assert rec["next_token_at_s"] > rec["ready_at_s"]
    assert res.metrics["recovery_s"] == pytest.approx(rec["next_token_at_s"] - rec["lost_at_s"])


def test_a_pinned_room_merges_the_lost_range_and_a_fault_by_time_works_too():
    pins = "stages=[{device: desktop, layers: '1-10'}, {device: laptop, layers: '11-20'}, " \
           "{device: phone, layers: '21-30'}]"
    scn = load("scenarios/home.yaml", BASE + [pins, "faults=[{device: laptop, at: 0.4 s}]"])
    res = simulate(scn)
    redeal = next(x for _, x in res.trace if type(x).__name__ == "Redeal")
    assert redeal.stages == (("desktop", 0, 20), ("phone", 20, 30))
    assert res.metrics["answered"] == 3 and res.metrics["recovery"][0]["lost_at_s"] == pytest.approx(0.4)
    p = scn.workload.prompt_tokens
    assert emitted(res.trace) == {q: [truth(p + i) for i in range(40)] for q in range(3)}


def test_when_the_rest_cannot_hold_the_model_the_questions_are_refused_with_the_reason():
    scn = load("scenarios/home.yaml", ["workload.questions=2", "workload.answer_tokens=20",
                                       "faults=[{device: phone, at: token 5}]"])
    res = simulate(scn)
    assert res.metrics["answered"] == 0 and res.metrics["recovery_s"] is None
    refusals = [x.reason for _, x in res.trace if type(x).__name__ == "Refuse"]
    assert len(refusals) == 2 and all("cannot hold the model" in r for r in refusals)


@pytest.mark.parametrize("bad,msg", [
    ("faults=[{device: nope, at: token 2}]", "faults[0].device"),
    ("faults=[{device: laptop, at: soon}]", "faults[0].at"),
    ("faults=[{device: laptop, at: token 0}]", "token 1"),
])
def test_bad_faults_are_one_line_errors(bad, msg):
    with pytest.raises(ScenarioError, match=msg.replace("[", r"\[").replace("]", r"\]")) as e:
        load("scenarios/home.yaml", [bad])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("weights_Bps", [2e6, 1e12])
def test_a_profiles_measured_copy_rate_caps_the_links_bandwidth(weights_Bps):
    # a calibration measures how fast a peer's copy moves stored weights on its machine
    # (runtime.calibrate.measure_weights_copy); the re-dealt layers come at the smaller
    # of that and the link's bandwidth, by hand
    from planner.profile import Curve, Profile, TransportProfile
    scn = load("scenarios/home.yaml", BASE + ["faults=[{device: laptop, at: token 20, detect: 1 s}]"])
    prof = Profile({}, {}, TransportProfile(Curve((2304.0, 36864.0), (1e-4, 2e-4)), None, weights_Bps))
    res = simulate(scn.with_profile(prof))
    (rec,) = res.metrics["recovery"]
    redeal = next(x for _, x in res.trace if type(x).__name__ == "Redeal")
    _, pa, pb = redeal.stages[1]
    n = scn.network
    rate = min(weights_Bps, n.bandwidth_Bps)
    assert rec["copy_s"] == pytest.approx((pb - pa) * scn.model.layer_bytes / rate + n.rtt_s / 2)
