"""planner/profile.py: interpolation, the file mapping, errors (values by hand)."""

from __future__ import annotations

import math
from dataclasses import replace

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


# --- messages, defaults and edges that mutmut's 2026-12-03 run left untested ------------
# (docs/testing.md: planner.profile's survivors, checked 2026-12-04). Each message below is
# the one the code's docstring promises: the key path, then what was expected.

def _message(fn, *args, error=ProfileError):
    with pytest.raises(error) as e:
        fn(*args)
    return str(e.value)


def _device_mapping(**over):
    m = {"stage": _curve().to_mapping(), "head_s": {1: 0.01}}
    m.update(over)
    return m


@pytest.mark.parametrize("mapping, message", [
    ([1, 2], "devices.a: expected a mapping"),
    (_device_mapping(slowdown="fast"), "devices.a.slowdown: expected a number"),
    (_device_mapping(prefill_ratio="x"), "devices.a.prefill_ratio: expected a number of times"),
    (_device_mapping(idle={"x": 1}), "devices.a.idle: points and values must be numbers"),
    (_device_mapping(head_s={}), "devices.a.head_s: expected a mapping of point: seconds"),
])
def test_a_malformed_device_profile_names_its_key(mapping, message):
    assert _message(DeviceProfile.from_mapping, mapping, "devices.a") == message


def test_a_prefill_ratio_below_one_is_read_and_only_zero_or_less_refused():
    assert DeviceProfile.from_mapping(_device_mapping(prefill_ratio=0.5), "a").prefill_ratio == 0.5
    assert (_message(DeviceProfile.from_mapping, _device_mapping(prefill_ratio=0), "a")
            == "a.prefill_ratio: expected more than 0 times (or null), got 0")


def test_a_curve_from_what_is_not_a_mapping_says_so():
    assert _message(Curve.from_mapping, [1, 2], "c") == "c: expected a mapping of point: seconds"
    assert _message(Curve.from_mapping, {}, "c") == "c: expected a mapping of point: seconds"


def test_no_idle_gap_gives_factor_one_whatever_the_curve_says_at_zero():
    # the idle curve's factor at 0 s is 2; work that starts with no gap is back to back: 1
    d = DeviceProfile(_curve(), Curve((1.0,), (0.01,)), idle=Curve((0.0, 1.0), (2.0, 3.0)))
    assert d.idle_factor(0.0) == 1.0
    assert d.idle_factor(0.5) == 2.5
    assert d.idle_factor(9.0) == 3.0  # beyond the last point: its factor


def test_a_pass_of_no_layers_is_its_fixed_part_and_negative_arguments_are_named():
    c = _curve()
    assert c.pass_s(0, 1, 100) == 0.001  # fixed_s at 1 token, context 100; no layer
    assert (_message(c.pass_s, 1, 1, -1, error=ValueError)
            == "layers, tokens, context must be >= 0, got 1, 1, -1")
    assert (_message(c.pass_s, -1, 1, 0, error=ValueError)
            == "layers, tokens, context must be >= 0, got -1, 1, 0")


@pytest.mark.parametrize("over, message", [
    ({"fixed_s": ((0.001, 0.002),)}, "fixed_s: expected 2 rows of 2 values"),
    ({"per_layer_s": ((0.01,), (0.03,))}, "per_layer_s: expected 2 rows of 2 values"),
    ({"fixed_s": ((0.001, math.inf), (0.003, 0.004))}, "fixed_s: values must be finite"),
    ({"tokens": (1, 1)}, "tokens: expected increasing non-negative values, got [1, 1]"),
    ({"contexts": (300, 100)}, "contexts: expected increasing non-negative values, got [300, 100]"),
])
def test_a_pass_curve_grid_that_is_not_one_says_why(over, message):
    c = _curve()
    args = {"tokens": c.tokens, "contexts": c.contexts, "fixed_s": c.fixed_s, "per_layer_s": c.per_layer_s}
    args.update(over)
    assert _message(lambda: PassCurve(**args)) == message


@pytest.mark.parametrize("accepted, message", [
    ([1, 2], "d.accepted: expected a mapping of k: [lengths]"),
    ({"two": [1]}, "d.accepted.two: k must be a whole number of drafted tokens, at least 1"),
    ({2.5: [1]}, "d.accepted.2.5: k must be a whole number of drafted tokens, at least 1"),
    ({True: [1]}, "d.accepted.True: k must be a whole number of drafted tokens, at least 1"),
])
def test_malformed_accepted_lengths_name_the_key(accepted, message):
    assert _message(DrafterProfile.from_mapping, {"call_s": {1: 1e-5}, "accepted": accepted}, "d") == message


def test_a_one_token_draft_is_measured_and_costs_its_call():
    d = DrafterProfile.from_mapping({"call_s": {1: 0.001, 4: 0.004}, "accepted": {1: [0, 1, 1]}}, "d")
    assert d.accepted == {1: (0, 1, 1)}
    assert d.draft_s(1) == 0.001


@pytest.mark.parametrize("m, message", [
    ({"accepted": {2: [1]}}, "d: needs call_s"),
    ({"call_s": {}}, "d.call_s: expected a mapping of point: seconds"),
    ({"call_s": {1: 1e-5}, "workloads": {"poetry": {2: [1]}}},
     "d.workloads.poetry: not a workload kind with its own acceptance (one of: grounded, sample-<16 hex digits>)"),
    # 16 characters after the prefix, but not hex digits; and hex digits without the prefix
    ({"call_s": {1: 1e-5}, "workloads": {"sample-XXXXXXXXXXXXXXXX": {2: [1]}}},
     "d.workloads.sample-XXXXXXXXXXXXXXXX: not a workload kind with its own acceptance "
     "(one of: grounded, sample-<16 hex digits>)"),
    ({"call_s": {1: 1e-5}, "workloads": {"grouped0123456789abcdef": {2: [1]}}},
     "d.workloads.grouped0123456789abcdef: not a workload kind with its own acceptance "
     "(one of: grounded, sample-<16 hex digits>)"),
])
def test_a_malformed_drafter_profile_names_its_key(m, message):
    assert _message(DrafterProfile.from_mapping, m, "d") == message


def test_a_sample_key_is_the_sha256_of_the_prompts_each_utf8_and_a_nul():
    import hashlib
    from planner.profile import sample_workload
    # "ab" then "c": the bytes a b NUL c NUL
    assert sample_workload(["ab", "c"]) == "sample-" + hashlib.sha256(b"ab\0c\0").hexdigest()[:16]
    # a lone surrogate (what a file read with surrogateescape can hold) is its 3 UTF-8 bytes ED A0 80
    assert sample_workload(["\ud800"]) == "sample-" + hashlib.sha256(b"\xed\xa0\x80\0").hexdigest()[:16]


def test_a_workload_the_profile_lacks_is_refused_with_what_it_has_and_how_to_measure_it():
    d = DrafterProfile(Curve((4.0,), (1e-5,)), {4: (0, 1)},
                       {"grounded": {4: (4, 3)}, "sample-0123456789abcdef": {4: (1,)}})
    assert _message(d.for_workload, "poetry") == (
        "the profile has no drafter acceptance for workload.kind poetry "
        "(it has: chat, grounded, sample-0123456789abcdef); "
        "calibrate again (splitroom calibrate measures every kind)")
    assert _message(d.for_workload, "sample-fedcba9876543210") == (
        "the profile has no drafter acceptance for this workload.sample (measured on another sample, or none) "
        "(it has: chat, grounded, sample-0123456789abcdef); "
        "calibrate with this scenario (splitroom calibrate measures its workload.sample; "
        "--acceptance-only adds it to a profile)")


def test_a_drafter_without_walks_by_prompt_has_no_prompts_and_one_walk_of_its_lengths():
    d = DrafterProfile(Curve((2.0,), (1e-5,)), {2: (0, 2, 1)})
    assert d.prompts() == 0
    assert d.prompt_lengths(2) == ((0, 2, 1),)
    assert d.prompt_lengths(1) == ((0, 1, 1),)  # capped at 1
    assert d.resampled([0, 0]) is d  # nothing to resample


def test_resampling_by_prompt_by_hand():
    call = Curve((2.0,), (0.003,))
    # two prompts: the first drafted nothing (its answer ended first), the second drafted twice
    d = DrafterProfile(call, {2: (1, 2)}, walks={"chat": {2: ((), (1, 2))}})
    assert d.prompts() == 2
    assert d.resampled([]) is d  # no picks: itself, its 2 prompts kept
    r = d.resampled([1, 1])
    assert r.accepted == {2: (1, 2, 1, 2)} and r.prompts() == 2 and r.draft_s(2) == 0.003
    # picking only the prompt that drafted nothing leaves no lengths: the view keeps its own
    e = d.resampled([0])
    assert e.accepted == {2: (1, 2)} and e.call_s == call


def test_shared_host_values_by_hand_and_what_it_refuses():
    from planner.profile import SharedHost, _shared_host
    assert SharedHost.from_mapping({"pass_s": 0.001}, "s") == SharedHost(0.001, 1.0)  # no ratio: 1
    assert SharedHost(-0.001, 0.5).prefill_ratio == 0.5  # pass_s may be negative
    for pass_s, ratio in ((math.inf, 1.0), (math.nan, 1.0), (0.001, math.inf), (0.001, 0.0)):
        assert _message(SharedHost, pass_s, ratio) == (
            f"expected a finite pass_s and a prefill_ratio > 0, got {pass_s!r}, {ratio!r}")
    assert (_message(SharedHost.from_mapping, {"prefill_ratio": 1.2}, "shared_host.2")
            == "shared_host.2: expected a mapping with pass_s (and prefill_ratio)")
    assert (_message(SharedHost.from_mapping, {"pass_s": 0.001, "prefill_ratio": "x"}, "shared_host.2")
            == "shared_host.2.prefill_ratio: expected a number of times")
    assert (_message(_shared_host, [1, 2])
            == "shared_host: expected a mapping of device processes: {pass_s, prefill_ratio}")


@pytest.mark.parametrize("m, message", [
    ({"window_bytes": 1000}, "transport: needs one_way_s"),
    ({"one_way_s": {1: 1e-4}, "window_bytes": "big"}, "transport.window_bytes: expected a number of bytes"),
    ({"one_way_s": {1: 1e-4}, "weights_Bps": "fast"}, "transport.weights_Bps: expected a number of bytes per second"),
])
def test_a_malformed_transport_names_its_key(m, message):
    assert _message(TransportProfile.from_mapping, m, "transport") == message


def test_a_transport_late_by_zero_seconds_is_read_and_its_fit_is_written_by_name():
    t = TransportProfile.from_mapping({"one_way_s": {1000: 0.002, 3000: 0.004}, "delay_late_s": 0}, "transport")
    assert t.delay_late_s == 0.0
    # two points: slope 0.002 s / 2000 B = 1e-6 s/B, and the line through (1000, 0.002) meets 0 B at 0.001 s
    fit = t.to_mapping()["fit"]
    assert set(fit) == {"fixed_s", "s_per_byte"}
    assert fit["fixed_s"] == pytest.approx(0.001) and fit["s_per_byte"] == pytest.approx(1e-6)


@pytest.mark.parametrize("m, message", [
    ({}, "not a splitroom calibration profile (no splitroom_profile: VERSION key; splitroom calibrate writes one)"),
    ({"splitroom_profile": PROFILE_VERSION, "devices": [1]}, "devices: expected a mapping of device id: profile"),
    ({"splitroom_profile": PROFILE_VERSION, "drafters": [1]},
     "drafters: expected a mapping of drafter name: profile"),
])
def test_a_malformed_profile_says_exactly_what(m, message):
    assert _message(Profile.from_mapping, m) == message


def test_notes_that_are_not_a_mapping_are_left_out():
    assert Profile.from_mapping({"splitroom_profile": PROFILE_VERSION, "notes": "measured here"}).notes == {}


def test_the_line_on_one_host_says_what_was_applied():
    from planner.profile import SharedHost
    dev = DeviceProfile(_curve(), Curve((1.0,), (0.01,)))
    call = Curve((1.0,), (1e-3,))
    p = Profile({"a": dev}, shared_host={2: SharedHost(0.25, 1.5)})
    assert p.on_one_host(2)[1] == ("2 device processes on one machine: every pass +250.00 ms a unit of "
                                   "slowdown, prefill chunks x1.500")
    assert p.on_one_host(3)[1] == ("3 device processes on one machine: every pass +250.00 ms a unit of "
                                   "slowdown, prefill chunks x1.500 (measured with 2; 3 not measured)")
    both = replace(p, drafters={"early_exit": DrafterProfile(call), "model": DrafterProfile(call),
                                "ngram": DrafterProfile(call)})
    assert both.on_one_host(2)[1] == ("2 device processes on one machine: every pass +250.00 ms a unit of "
                                      "slowdown (the early_exit/model drafter's too, one pass a drafted token), "
                                      "prefill chunks x1.500")
    assert Profile({"a": dev}).on_one_host(2)[1] == (
        "2 device processes on one machine: no shared-core room measured in the profile, "
        "predicted as separate machines")
