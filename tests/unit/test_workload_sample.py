"""workload.sample, acceptance by prompt, prediction ranges and the adaptive rule's
inputs: values by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest

from planner.deal import Deal, Stage
from planner.draft_policy import conditional_rates
from planner.profile import Curve, DeviceProfile, DrafterProfile, PassCurve, Profile, ProfileError, sample_workload
from splitroom.calibration import CalibrationError, add_acceptance, check_covers
from splitroom.scenario import ScenarioError, load


def _load(sets, tmp_path=None):
    return load("scenarios/home.yaml", sets)


def test_a_sample_is_a_list_or_a_file_of_prompts(tmp_path):
    assert _load(["workload.sample=[one, two]"]).workload.sample == ("one", "two")
    scn = tmp_path / "s.yaml"
    scn.write_text(open("scenarios/home.yaml", encoding="utf-8").read())
    (tmp_path / "p.txt").write_text("first prompt\n\n  \nsecond prompt\n", encoding="utf-8")
    (tmp_path / "p.json").write_text(json.dumps(["a", "b\nc"]), encoding="utf-8")
    assert load(scn, ["workload.sample=p.txt"]).workload.sample == ("first prompt", "second prompt")
    assert load(scn, ["workload.sample=p.json"]).workload.sample == ("a", "b\nc")
    (tmp_path / "bad.json").write_text('{"a": 1}', encoding="utf-8")
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
    for sets, words in [(["workload.sample=bad.json"], "expected a list of prompts"),
                        (["workload.sample=empty.txt"], "no prompts"),
                        (["workload.sample=latin.txt"], "not UTF-8"),
                        (["workload.sample=nowhere.txt"], "cannot read"),
                        (["workload.sample=[]"], "no prompts"),
                        (["workload.sample=[1, 2]"], "workload.sample"),
                        (["workload.sample=['', x]"], "workload.sample[0]: an empty prompt")]:
        with pytest.raises(ScenarioError, match=words.replace("[", r"\[").replace("]", r"\]")):
            load(scn, sets)


def test_a_sample_files_byte_order_mark_is_not_part_of_its_first_prompt(tmp_path):
    # Notepad's UTF-8 starts with EF BB BF; read as text it made the first prompt
    # "\ufeffwhat is ..." (2026-12-04, session 13), a character no user typed
    scn = tmp_path / "s.yaml"
    scn.write_text(open("scenarios/home.yaml", encoding="utf-8").read())
    (tmp_path / "p.txt").write_bytes(b"\xef\xbb\xbfwhat is a prime?\r\nwhy is the sky blue?\r\n")
    (tmp_path / "p.json").write_bytes(b'\xef\xbb\xbf["a", "b"]')
    assert load(scn, ["workload.sample=p.txt"]).workload.sample == ("what is a prime?", "why is the sky blue?")
    assert load(scn, ["workload.sample=p.json"]).workload.sample == ("a", "b")


def test_a_missing_sample_file_says_where_it_was_looked_for(tmp_path):
    # the README's samples/grounded.txt is beside scenarios/home.yaml; typed from the
    # repository as scenarios/samples/grounded.txt it was "No such file" with no hint of
    # where it was looked for (2026-12-04, session 13)
    (tmp_path / "room").mkdir()
    scn = tmp_path / "room" / "s.yaml"
    scn.write_text(open("scenarios/home.yaml", encoding="utf-8").read())
    with pytest.raises(ScenarioError) as e:
        load(scn, ["workload.sample=room/p.txt"])
    assert str(e.value) == (f"{scn}: workload.sample: 'room/p.txt': cannot read (No such file or directory); "
                            f"a sample file is relative to the scenario's folder, {tmp_path / 'room'}/")
    with pytest.raises(ScenarioError) as e:
        load(scn, ["workload.sample=''"])  # was "'': cannot read (Is a directory)": the scenario's folder
    assert str(e.value) == f"{scn}: workload.sample: an empty file name (give a file of prompts, or a list)"


def test_draft_tokens_auto_takes_max_draft_tokens():
    s = _load(["decoding.speculative={drafter: ngram, draft_tokens: auto, max_draft_tokens: 5}"]).decoding.speculative
    assert s.adaptive and s.draft_tokens == 5
    s = _load(["decoding.speculative={drafter: ngram, draft_tokens: auto}"]).decoding.speculative
    assert s.adaptive and s.draft_tokens == 8
    assert not _load(["decoding.speculative={drafter: ngram, draft_tokens: 3}"]).decoding.speculative.adaptive
    for v, words in [("{drafter: ngram, draft_tokens: 3, max_draft_tokens: 5}", "only with draft_tokens: auto"),
                     ("{drafter: ngram, draft_tokens: true}", "expected a whole number 1-64 or auto"),
                     ("{drafter: ngram, draft_tokens: 0}", "expected a whole number 1-64 or auto"),
                     ("{drafter: ngram, draft_tokens: auto, max_draft_tokens: 65}", "max_draft_tokens")]:
        with pytest.raises(ScenarioError, match=words):
            _load([f"decoding.speculative={v}"])


def _drafter():
    walks = {4: ((0, 0, 1), (4, 3))}
    flat = {4: (0, 0, 1, 4, 3)}
    return DrafterProfile(Curve((4.0,), (1e-5,)), flat, walks={"chat": walks})


def test_walks_by_prompt_round_trip_and_must_add_up():
    d = _drafter()
    assert d.prompt_lengths(2) == ((0, 0, 1), (2, 2)) and d.prompts() == 2
    assert DrafterProfile.from_mapping(d.to_mapping(), "d") == d
    m = d.to_mapping()
    m["walks"]["chat"][4] = [[0, 0], [4, 3]]
    with pytest.raises(ProfileError, match="do not add up"):
        DrafterProfile.from_mapping(m, "d")
    m["walks"] = {"grounded": {4: [[1]]}}
    with pytest.raises(ProfileError, match="d.walks.grounded: no accepted lengths of that workload"):
        DrafterProfile.from_mapping(m, "d")


def test_a_bootstrap_replica_takes_the_prompts_picked():
    d = _drafter()
    r = d.resampled([1, 1, 0])
    assert r.prompt_lengths(4) == ((4, 3), (4, 3), (0, 0, 1))
    assert r.accepted_lengths(4) == (4, 3, 4, 3, 0, 0, 1)


def _profile(drafter: DrafterProfile) -> Profile:
    stage = PassCurve((1, 16), (0, 2048), ((0.001, 0.002), (0.001, 0.002)), ((0.002, 0.004), (0.002, 0.004)))
    dp = DeviceProfile(stage, Curve((1.0, 16.0), (0.003, 0.006)))
    return Profile({"desktop": dp, "laptop": dp, "phone": dp}, {"ngram": drafter})


def test_a_scenario_with_a_sample_needs_that_samples_acceptance():
    scn = _load(["workload.sample=[alpha, beta]", "decoding.speculative={drafter: ngram, draft_tokens: 4}"])
    d = _drafter()
    with pytest.raises(CalibrationError, match="this workload.sample"):
        check_covers(scn, _profile(d))
    key = sample_workload(("alpha", "beta"))
    assert key == scn.workload.acceptance_workload and key.startswith("sample-") and len(key) == 23
    measured = {"drafters": {"ngram": {"workloads": {key: {4: [1, 2]}}, "walks": {key: {4: [[1], [2]]}}},
                             "model": {"workloads": {key: {4: [4]}}, "walks": {key: {4: [[4]]}}}},
                "notes": {key: "2 prompts"}}
    prof = add_acceptance(_profile(d), measured)
    check_covers(scn, prof)
    assert prof.drafters["ngram"].for_workload(key).prompt_lengths(4) == ((1,), (2,))
    assert "model" not in prof.drafters  # no call times measured for it: left out
    assert prof.notes[key] == "2 prompts"


def test_the_range_of_a_room_with_nothing_to_vary_is_one_point():
    from splitroom.ranges import predict_range, range_sources
    scn = _load(["network.jitter={distribution: none}", "network.episodes=null", "decoding.speculative=null"])
    assert range_sources(scn) == []
    point = {"tokens_per_s": 10.0, "ttft_s": 0.5}
    deal = Deal("desktop", "pinned", (Stage("desktop", 0, 30),), (), True, ())
    r = predict_range(scn, deal, point)
    assert r["replicas"] == 0 and r["tokens_per_s"] == {"p10": 10.0, "p50": 10.0, "p90": 10.0}


def test_the_range_bootstraps_prompts_and_is_reproducible():
    from planner.deal import deal as make_deal
    from sim.driver import simulate
    from splitroom.ranges import predict_range, range_sources
    scn = _load(["network.jitter={distribution: none}", "network.episodes=null",
                 "decoding.speculative={drafter: ngram, draft_tokens: 4}"]).with_profile(_profile(_drafter()))
    assert range_sources(scn) == ["acceptance: bootstrap over 2 measured prompts"]
    d = make_deal(scn.devices, scn.model, scn.options)
    point = simulate(scn, d, trace=False).metrics
    a, b = predict_range(scn, d, point, 8), predict_range(scn, d, point, 8)
    assert a == b and a["replicas"] == 8
    # a replica that asks the copying prompt twice is faster than one asking the open one twice
    fast = simulate(dataclasses.replace(scn, seed=3), d, trace=False, acceptance_picks=[1, 1]).metrics
    slow = simulate(dataclasses.replace(scn, seed=3), d, trace=False, acceptance_picks=[0, 0]).metrics
    assert fast["tokens_per_lap"] > 3 and slow["tokens_per_lap"] < 1.5
    # with no jitter a replica differs from another only by the prompts it drew (two of two):
    # every replica lies between the room asking the open prompt twice and the room asking
    # the copying one twice, so the range does too; and 8 replicas drawing 2 of 2 prompts
    # each do not all draw the same pair (the seeded draws), so it is not one point
    t = a["tokens_per_s"]
    assert slow["tokens_per_s"] - 1e-9 <= t["p10"] < t["p90"] <= fast["tokens_per_s"] + 1e-9


def test_the_rules_prior_comes_from_the_walk_and_stops_where_it_stops():
    from sim.draft_costs import prior_rates
    scn = _load(["decoding.speculative={drafter: ngram, draft_tokens: auto, max_draft_tokens: 6}"])
    assert prior_rates(scn, 6) == (0.75,) * 6  # the per-token acceptance without a profile
    scn = scn.with_profile(_profile(_drafter()))
    # lengths 0 0 1 4 3 at k=4: c1 = 3/5, c2 = 2/3, c3 = 2/2, c4 = 1/2; nothing measured beyond 4
    assert prior_rates(scn, 6) == pytest.approx((0.6, 2 / 3, 1.0, 0.5, 0.0, 0.0))
    assert conditional_rates([0, 0, 1, 4, 3], 4) == pytest.approx((0.6, 2 / 3, 1.0, 0.5))


def test_lap_costs_by_hand_from_a_profile():
    from sim.draft_costs import lap_costs
    prof = _profile(_drafter())
    scn = _load(["network.jitter={distribution: none}", "network.episodes=null", "network.rtt=20ms",
                 "network.hop_overhead=0s", "network.bandwidth=1000 Gbit/s", "host=desktop",
                 'stages=[{device: desktop, layers: "1-10"}, {device: laptop, layers: "11-30"}]',
                 "workload.prompt_tokens=100", "workload.answer_tokens=50",
                 "decoding.speculative={drafter: ngram, draft_tokens: auto, max_draft_tokens: 1}"])
    scn = dataclasses.replace(scn, profile=prof)
    deal = Deal("desktop", "pinned", (Stage("desktop", 0, 10), Stage("laptop", 10, 30)), (), True, ())
    lap = lap_costs(scn, deal, 1)
    # k=0: passes 0.001 + 10 x 0.002 and 0.001 + 20 x 0.002, head 0.003, two hops of 10 ms, the
    # embedding (microseconds) and frames over 1000 Gbit/s (nanoseconds) aside
    assert lap[0] == pytest.approx(0.021 + 0.041 + 0.003 + 0.020, abs=2e-5)
    # k=1: two positions: per layer 0.002 + (0.004 - 0.002) / 15, fixed 0.001 + 0.001 / 15; head
    # 0.003 + 0.003 / 15; the drafter's call 10 us
    per, fixed, head = 0.002 + 0.002 / 15, 0.001 + 0.001 / 15, 0.003 + 0.003 / 15
    assert lap[1] == pytest.approx(2 * fixed + 30 * per + head + 0.020 + 1e-5, abs=2e-5)


def test_lap_costs_charge_the_way_back_its_round_trips_from_the_initial_window():
    """sim/draft_costs.py: a result frame over the initial congestion window pays round
    trips of the hop back to the host; the forward hops (grown by the prefill chunks) pay
    nothing. With one-token answers a question is one lap, so the charge is the first
    frame's rounds from the initial window. By hand, SmolLM2 frames (576 float32 per
    position, 32 header bytes) in chunks of 1160 B from a window of 10 chunks (11,600 B):
    5 positions 11,552 B fit; 6 positions 13,856 B (12 chunks) send 10, the rest after the
    first acknowledgement: one round; 16 positions 36,896 B (32 chunks) send 10, then 20
    (each of the 10 acknowledgements grows the window by a chunk and sends two), then the
    last 2: two rounds."""
    from planner.room import LinkSpec
    from sim.draft_costs import lap_costs
    prof = _profile(_drafter())
    three = ['stages=[{device: desktop, layers: "1-10"}, {device: laptop, layers: "11-20"}, '
             '{device: phone, layers: "21-30"}]']
    scn = _load(["network.jitter={distribution: none}", "network.episodes=null", "network.rtt=20ms",
                 "host=desktop", "workload.prompt_tokens=100", "workload.answer_tokens=1",
                 "decoding.speculative={drafter: ngram, draft_tokens: auto, max_draft_tokens: 15}"] + three)
    scn = dataclasses.replace(scn, profile=prof)
    deal = Deal("desktop", "pinned", (Stage("desktop", 0, 10), Stage("laptop", 10, 20), Stage("phone", 20, 30)),
                (), True, ())
    plain = lap_costs(scn, deal, 15)  # no window: no charge
    win = dataclasses.replace(scn, network=dataclasses.replace(scn.network, window_bytes=11600))
    extra = [b - a for a, b in zip(plain, lap_costs(win, deal, 15))]
    # k = 0..4 fit; k = 5..14 (6-15 positions) one round; k = 15 (16 positions) two; only the
    # phone -> desktop hop pays (three hops each paying would be 0.060 a round)
    assert extra == pytest.approx([0.0] * 5 + [0.020] * 10 + [0.040], abs=1e-12)
    # the round is that hop's own round trip: phone <-> desktop at 60 ms, the others at 20 ms
    far = dataclasses.replace(win.network, links=(LinkSpec(between=("phone", "desktop"), rtt_s=0.060),))
    base = dataclasses.replace(scn.network, links=far.links)
    extra = [b - a for a, b in zip(lap_costs(dataclasses.replace(scn, network=base), deal, 6),
                                   lap_costs(dataclasses.replace(scn, network=far), deal, 6))]
    assert extra == pytest.approx([0.0] * 5 + [0.060] * 2, abs=1e-12)
    # a burst cap of 5,800 B: the first flight is 5 chunks, so from 3 positions (6,944 B) a
    # frame needs a round (the window, not the cap, limits the flights after the first)
    capped = dataclasses.replace(win.network, burst_bytes=5800)
    extra = [b - a for a, b in zip(plain[:7], lap_costs(dataclasses.replace(scn, network=capped), deal, 6))]
    assert extra == pytest.approx([0.0] * 2 + [0.020] * 5, abs=1e-12)
    # return_path via_stages: the way back is phone -> laptop -> desktop, both hops pay
    via = dataclasses.replace(win, decoding=dataclasses.replace(win.decoding, return_path="via_stages"))
    nowin = dataclasses.replace(via, network=scn.network)
    extra = [b - a for a, b in zip(lap_costs(nowin, deal, 6), lap_costs(via, deal, 6))]
    assert extra == pytest.approx([0.0] * 5 + [0.040] * 2, abs=1e-12)


def test_lap_costs_charge_every_lap_the_first_frames_rounds_however_long_the_question():
    """A question of 50 tokens with every draft accepted (prior rate 1 at every position)
    still pays, on every lap, the rounds of a frame from the initial window of 10 chunks
    (the rule does not count on the window growing in laps it has not run). By hand:
    k=5 (13,856 B, 12 chunks): 10 sent, then 2 on the first acknowledgement: 1 round;
    k=8 (20,768 B, 18 chunks): 10, then 8 on the first 4 acknowledgements: 1 round;
    k=15 (36,896 B, 32 chunks): 10, then 20, then 2: 2 rounds."""
    from sim.draft_costs import lap_costs
    three = ['stages=[{device: desktop, layers: "1-10"}, {device: laptop, layers: "11-20"}, '
             '{device: phone, layers: "21-30"}]']
    scn = _load(["network.jitter={distribution: none}", "network.episodes=null", "network.rtt=20ms",
                 "host=desktop", "workload.prompt_tokens=100", "workload.answer_tokens=50",
                 "decoding.speculative={drafter: ngram, draft_tokens: auto, max_draft_tokens: 15, "
                 "accepted_lengths: [15]}"] + three)
    scn = dataclasses.replace(scn, profile=_profile(_drafter()))
    deal = Deal("desktop", "pinned", (Stage("desktop", 0, 10), Stage("laptop", 10, 20), Stage("phone", 20, 30)),
                (), True, ())
    win = dataclasses.replace(scn, network=dataclasses.replace(scn.network, window_bytes=11600))
    extra = [b - a for a, b in zip(lap_costs(scn, deal, 15), lap_costs(win, deal, 15))]
    assert [extra[k] for k in (4, 5, 8, 15)] == pytest.approx([0.0, 0.020, 0.020, 0.040], abs=1e-12)


def test_the_rule_gets_one_prior_per_draft_length_from_the_walk_at_that_k():
    from sim.draft_costs import prior_by_k
    d = DrafterProfile(Curve((1.0, 4.0), (1e-5, 1e-5)), {1: (1, 1, 0), 4: (0, 0, 1, 4, 3)})
    scn = _load(["decoding.speculative={drafter: ngram, draft_tokens: auto, max_draft_tokens: 2}"])
    scn = scn.with_profile(_profile(d))
    # k=1 from the k=1 walk (2 of 3 right); k=2 from the k=4 walk capped at 2: 0 0 1 2 2
    one, two = prior_by_k(scn, 2)
    assert one == pytest.approx((2 / 3,)) and two == pytest.approx((0.6, 2 / 3))
