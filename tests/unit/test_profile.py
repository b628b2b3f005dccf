"""planner/profile.py: interpolation, the file mapping, errors (values by hand)."""

from __future__ import annotations

import math

import pytest

from planner.profile import (PROFILE_VERSION, Curve, DeviceProfile, DrafterProfile, PassCurve, Profile, ProfileError,
                             TransportProfile, fit_line)


def _curve():
    # fixed_s[context][tokens], per_layer_s[context][tokens]
    return PassCurve(tokens=(1, 5), contexts=(100, 300),
                     fixed_s=((0.001, 0.002), (0.003, 0.004)),
                     per_layer_s=((0.010, 0.020), (0.030, 0.040)))


def test_pass_time_is_bilinear_between_grid_points():
    c = _curve()
    assert c.pass_s(2, 1, 100) == pytest.approx(0.001 + 2 * 0.010)
    # tokens 3 is halfway from 1 to 5; context 200 halfway from 100 to 300
    fixed = (0.0015 + 0.0035) / 2
    per_layer = (0.015 + 0.035) / 2
    assert c.pass_s(4, 3, 200) == pytest.approx(fixed + 4 * per_layer)


def test_pass_time_extrapolates_beyond_and_clamps_below_the_grid():
    c = _curve()
    # 9 tokens: the last segment's slope continues (per layer +0.0025 a token)
    assert c.pass_s(1, 9, 100) == pytest.approx(0.003 + 0.030)
    # context 0: clamped to the first context
    assert c.pass_s(1, 1, 0) == pytest.approx(0.011)
    # context 500: the context slope continues (+0.02 per 200 positions per layer)
    assert c.pass_s(1, 1, 500) == pytest.approx(0.005 + 0.050)
    assert c.pass_s(3, 0, 100) == 0.0
    with pytest.raises(ValueError):
        c.pass_s(-1, 1, 0)


def test_fit_line_by_hand_and_transport_fit_through_the_decode_frame():
    a, b = fit_line([0, 1, 2], [1, 3, 5])
    assert (a, b) == pytest.approx((1, 2))
    tr = TransportProfile(Curve((1000.0, 2000.0, 4000.0), (0.002, 0.004, 0.006)))
    # least-squares slope over the three points: 1.2857e-6 s/B; through (1000, 0.002)
    slope = fit_line([1000, 2000, 4000], [0.002, 0.004, 0.006])[1]
    assert tr.fit == pytest.approx((0.002 - slope * 1000, slope))


def test_accepted_lengths_come_from_the_next_larger_k_capped():
    d = DrafterProfile(Curve((2.0, 8.0), (0.001, 0.004)), {2: (0, 2, 1), 8: (8, 0, 5)})
    assert d.accepted_lengths(2) == (0, 2, 1)
    assert d.accepted_lengths(4) == (4, 0, 4)  # measured at k=8, capped at 4
    assert d.accepted_lengths(1) == (0, 1, 1)
    assert d.accepted_lengths(12) == (8, 0, 5)
    assert d.draft_s(5) == pytest.approx(0.0025)
    assert d.draft_s(0) == 0.0


def test_a_profile_round_trips_through_its_mapping():
    p = Profile({"a": DeviceProfile(_curve(), Curve((1.0, 4.0), (0.01, 0.02)), 3.0)},
                {"ngram": DrafterProfile(Curve((1.0,), (1e-5,)), {4: (0, 1, 4)})},
                TransportProfile(Curve((100.0, 200.0), (0.001, 0.002)), 11600.0, 3.5e6), {"machine": "test"})
    q = Profile.from_mapping(p.to_mapping())
    assert q == p
    assert q.devices["a"].stage.scaled(2).pass_s(1, 1, 100) == pytest.approx(2 * 0.011)


@pytest.mark.parametrize("mapping, words", [
    ({}, "not a splitroom calibration profile"),
    ({"splitroom_profile": PROFILE_VERSION + 1}, "not supported"),
    ({"splitroom_profile": PROFILE_VERSION, "devices": {"a": {"stage": {"tokens": [1]}}}}, "devices.a"),
    ({"splitroom_profile": PROFILE_VERSION, "devices": {"a": {
        "stage": {"tokens": [2, 1], "contexts": [1], "fixed_s": [[0, 0]], "per_layer_s": [[0, 0]]},
        "head_s": {1: 0.1}}}}, "increasing"),
    ({"splitroom_profile": PROFILE_VERSION, "drafters": {"ngram": {"call_s": {1: 1e-5}, "accepted": {2: [3]}}}},
     "drafters.ngram.accepted.2"),
    ({"splitroom_profile": PROFILE_VERSION, "transport": {"one_way_s": {"x": 1}}}, "transport.one_way_s"),
    ({"splitroom_profile": PROFILE_VERSION, "transport": {"one_way_s": {1: 1e-4}, "weights_Bps": -1}},
     "transport.weights_Bps"),
    ({"splitroom_profile": PROFILE_VERSION, "transport": {"one_way_s": {1: 1e-4}, "weights_Bps": "fast"}},
     "transport.weights_Bps"),
    ({"splitroom_profile": PROFILE_VERSION, "transport": {"one_way_s": {1: 1e-4}, "weights_Bps": 10 ** 400}},
     "transport.weights_Bps"),
    ({"splitroom_profile": PROFILE_VERSION, "transport": {"one_way_s": {1: 1e-4}, "weights_Bps": True}},
     "transport.weights_Bps"),
    ({"splitroom_profile": PROFILE_VERSION, "devices": {"a": {"stage": {}, "head_s": {1: -1.0}}}}, "devices.a"),
])
def test_malformed_profiles_name_the_key(mapping, words):
    with pytest.raises(ProfileError, match=words.replace(".", r"\.")):
        Profile.from_mapping(mapping)


def test_a_drafter_lends_the_acceptance_of_the_workload_kind_asked():
    d = DrafterProfile(Curve((4.0,), (1e-5,)), {4: (0, 1)}, {"grounded": {4: (4, 3)}})
    assert d.for_workload("chat") is d
    g = d.for_workload("grounded")
    assert g.accepted_lengths(4) == (4, 3) and g.accepted_lengths(2) == (2, 2) and g.draft_s(4) == d.draft_s(4)
    with pytest.raises(ProfileError, match="no drafter acceptance for workload.kind poetry"):
        d.for_workload("poetry")
    with pytest.raises(ProfileError, match=r"\(it has: chat\)"):
        DrafterProfile(Curve((4.0,), (1e-5,)), {4: (0,)}).for_workload("grounded")
    p = Profile({}, {"ngram": d})
    assert Profile.from_mapping(p.to_mapping()) == p


@pytest.mark.parametrize("workloads, words", [
    ({"grounded": {4: [5]}}, "drafters.ngram.workloads.grounded.4: lengths must lie in [0, 4]"),
    ({"poetry": {4: [1]}}, "drafters.ngram.workloads.poetry: not a workload kind"),
    ({"chat": {4: [1]}}, "drafters.ngram.workloads.chat: not a workload kind"),
    ([1, 2], "drafters.ngram.workloads: expected a mapping"),
    ({"grounded": {}}, "drafters.ngram.workloads.grounded: no accepted lengths"),
    ({"grounded": {4: []}}, "drafters.ngram.workloads.grounded.4: no accepted lengths"),
    ({"grounded": {4: [1.5, 2]}}, "drafters.ngram.workloads.grounded.4: expected a list of whole numbers"),
    ({"grounded": {4: [True, False]}}, "drafters.ngram.workloads.grounded.4: expected a list of whole numbers"),
    ({"grounded": {4: "123"}}, "drafters.ngram.workloads.grounded.4: expected a list of whole numbers"),
    ({"grounded": {0: [0]}}, "drafters.ngram.workloads.grounded.0: k must be a whole number of drafted tokens"),
])
def test_malformed_workload_acceptance_names_the_key(workloads, words):
    m = {"splitroom_profile": PROFILE_VERSION, "drafters": {"ngram": {"call_s": {1: 1e-5}, "workloads": workloads}}}
    with pytest.raises(ProfileError, match=words.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        Profile.from_mapping(m)


# --- the curve, the line fit and the walks by prompt, by hand ----------------------------

def test_a_line_fit_by_hand():
    # y = 1 + 2x through (0, 1), (1, 3), (3, 7): mean x 4/3, mean y 11/3, slope
    # (28/3) / (14/3) = 2, intercept 11/3 - 2 * 4/3 = 1
    a, b = fit_line([0.0, 1.0, 3.0], [1.0, 3.0, 7.0])
    assert (a, b) == (pytest.approx(1.0), pytest.approx(2.0))
    assert fit_line([3.0], [5.0]) == (5.0, 0.0)  # one point: flat through it
    assert fit_line([2.0, 2.0], [1.0, 3.0]) == (2.0, 0.0)  # no spread in x: the mean, flat
    for xs, ys in (([], []), ([1.0, 2.0], [1.0])):
        with pytest.raises(ProfileError) as e:
            fit_line(xs, ys)
        assert str(e.value) == "fit_line needs as many ys as xs, at least one"


def test_a_curve_is_piecewise_linear_clamped_below_and_extrapolated_above():
    c = Curve((1.0, 2.0, 4.0), (10.0, 20.0, 60.0))  # slopes 10 then 20 a unit
    assert [c(0.5), c(1.0), c(1.5), c(3.0), c(4.0), c(8.0)] == [10.0, 10.0, 15.0, 40.0, 60.0, 140.0]
    assert Curve((1.0,), (0.0,))(5.0) == 0.0  # a value of 0 is allowed


@pytest.mark.parametrize("xs,ys,message", [
    ((), (), "a curve needs as many values as points, at least one"),
    ((1.0, 2.0), (1.0,), "a curve needs as many values as points, at least one"),
    ((1.0, 1.0), (1.0, 2.0), "curve points must increase strictly, got [1.0, 1.0]"),
    ((1.0,), (-1.0,), "curve values must be finite and >= 0, got [-1.0]"),
    ((1.0,), (math.inf,), "curve values must be finite and >= 0, got [inf]"),
])
def test_a_curve_that_is_not_one_says_why(xs, ys, message):
    with pytest.raises(ProfileError) as e:
        Curve(xs, ys)
    assert str(e.value) == message


FLAT = {"chat": {1: (1,), 2: (1, 2, 0)}}


def test_walks_by_prompt_read_k_as_an_int_or_its_digits():
    from planner.profile import _walks_from_mapping
    assert _walks_from_mapping({"chat": {"2": [[1, 2], [0]], 1: [[1]]}}, "w", FLAT) == {
        "chat": {2: ((1, 2), (0,)), 1: ((1,),)}}
    assert _walks_from_mapping(None, "w", FLAT) == {}


@pytest.mark.parametrize("m,message", [
    (5, "w: expected a mapping of workload: {k: [[lengths of one prompt], ...]}"),
    ({"code": {}}, "w.code: no accepted lengths of that workload to split by prompt"),
    ({"chat": 5}, "w.chat: expected a mapping of k: [[lengths of one prompt], ...]"),
    ({"chat": {True: [[1]]}}, "w.chat.True: not a k with accepted lengths"),
    ({"chat": {"x": [[1]]}}, "w.chat.x: not a k with accepted lengths"),
    ({"chat": {5: [[1]]}}, "w.chat.5: not a k with accepted lengths"),
    ({"chat": {2: [1, 2, 0]}}, "w.chat.2: expected a list of lists (one per prompt)"),
    ({"chat": {2: [[1], [2]]}}, "w.chat.2: the walks by prompt do not add up to the accepted lengths"),
])
def test_walks_by_prompt_that_are_not_say_where_and_why(m, message):
    from planner.profile import _walks_from_mapping
    with pytest.raises(ProfileError) as e:
        _walks_from_mapping(m, "w", FLAT)
    assert str(e.value) == message


def test_prefill_ratio_round_trips_and_defaults_are_left_out():
    head = Curve((1.0,), (0.01,))
    m = DeviceProfile(_curve(), head, 1.0, prefill_ratio=2.0).to_mapping()
    assert m["prefill_ratio"] == 2.0
    back = DeviceProfile.from_mapping(m, "a")
    assert back.prefill_ratio == 2.0 and back.slowdown == 1.0
    plain = DeviceProfile(_curve(), head).to_mapping()
    assert "prefill_ratio" not in plain
    del plain["slowdown"]  # the default slowdown is 1
    assert DeviceProfile.from_mapping(plain, "a").slowdown == 1.0
    with pytest.raises(ProfileError) as e:
        DeviceProfile.from_mapping({"stage": m["stage"]}, "a")
    assert str(e.value) == "a: needs stage and head_s"


def test_curve_scaled_multiplies_every_value():
    assert Curve((1.0, 2.0), (3.0, 5.0)).scaled(2.0) == Curve((1.0, 2.0), (6.0, 10.0))


def test_block_mean_by_hand_and_its_messages():
    from planner.profile import block_mean
    assert block_mean([1.0, 2.0, 3.0], [2], 2) == 2.0  # wraps: (3 + 1) / 2
    for args, msg in ((([], [0], 1), "block_mean needs values, starts and a block of at least 1"),
                      (([1.0, 2.0, 3.0], [3], 1), "block_mean: a start outside 0..2")):
        with pytest.raises(ProfileError) as e:
            block_mean(*args)
        assert str(e.value) == msg
