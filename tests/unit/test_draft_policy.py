"""planner/draft_policy.py: the expected-rate rule, values by hand and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.draft_policy import DraftPolicy, best_k, conditional_rates, expected_accepted


def test_expected_accepted_is_leviathans_sum_for_one_rate():
    # Leviathan et al. 2023, eq. 1: E[generated] = (1 - a**(k+1)) / (1 - a) = 1 + E[accepted]
    a, k = 0.6, 5
    assert 1 + expected_accepted([a] * k, k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))
    # per position, by hand: 0.5 + 0.5*0.8 + 0.5*0.8*0.25
    assert expected_accepted([0.5, 0.8, 0.25], 3) == pytest.approx(0.5 + 0.4 + 0.1)
    assert expected_accepted([0.5], 0) == 0.0
    with pytest.raises(ValueError):
        expected_accepted([0.5], 2)


def test_conditional_rates_by_hand():
    # lengths of 4-token drafts: 0, 1, 4, 4 -> c1 = 3/4, c2 = 2/3, c3 = 2/2, c4 = 2/2
    assert conditional_rates([0, 1, 4, 4], 4) == pytest.approx((0.75, 2 / 3, 1.0, 1.0))
    # nothing reached position 2: it takes the rate before it
    assert conditional_rates([0, 0, 1], 3) == pytest.approx((1 / 3, 0.0, 0.0))
    assert conditional_rates([], 2) == (0.5, 0.5)
    with pytest.raises(ValueError):
        conditional_rates([5], 4)


def test_best_k_by_hand():
    # plain 100 ms; k=1 150 ms; k=2 160 ms; k=3 400 ms; rates 0.9 each
    lap = [0.100, 0.150, 0.160, 0.400]
    rates = [0.9, 0.9, 0.9]
    # tokens per second: 10, 1.9/0.15 = 12.67, 2.71/0.16 = 16.94, 3.439/0.4 = 8.6
    assert best_k(rates, lap) == 2
    # low acceptance: plain wins (k=1: 1.1/0.15 = 7.3 < 10)
    assert best_k([0.1, 0.1, 0.1], lap) == 0
    # ties go to the smaller k
    assert best_k([0.0], [0.1, 0.1]) == 0
    with pytest.raises(ValueError):
        best_k([0.5], [0.1, -1.0])


def test_a_question_that_keeps_rejecting_goes_plain_then_probes():
    pol = DraftPolicy(lap_s=(0.1, 0.11, 0.12, 0.13), prior=(0.8, 0.8, 0.8), prior_weight=2.0, probe_every=3)
    s = pol.start()
    assert s.choose() == 3  # 1 + 0.8 + 0.64 + 0.512 = 2.95 tokens in 0.13 s beats 10/s
    for _ in range(6):  # every draft wrong at its first position
        s.observe(3, 0)
    # position 1 posterior: (2 * 0.8 + 0) / (2 + 6) = 0.2; k=1 gives 1.2/0.11 = 10.9 > 10
    assert s.rates()[0] == pytest.approx(0.2)
    for _ in range(10):
        s.observe(1, 0)
    assert s.choose() == 0
    for _ in range(3):
        s.plain_lap()
    assert s.choose() == 1  # the probe
    s.observe(1, 1)
    assert s.plain_run == 0


def test_observe_counts_positions_tried_and_right():
    pol = DraftPolicy(lap_s=(1.0,) * 5, prior=(0.5,) * 4)
    s = pol.start()
    s.observe(4, 2)  # positions 1, 2 right, 3 wrong, 4 never tried
    assert s.tried == [1, 1, 1, 0] and s.right == [1, 1, 0, 0]
    s.observe(4, 4)
    assert s.tried == [2, 2, 2, 1] and s.right == [2, 2, 1, 1]
    s.observe(2, 9)  # clamped to what was drafted
    assert s.tried == [3, 3, 2, 1] and s.right == [3, 3, 1, 1]


def test_policy_json_round_trip_and_bad_settings():
    pol = DraftPolicy(lap_s=(0.1, 0.2), prior=(0.3,), prior_weight=1.5, probe_every=2)
    assert DraftPolicy.from_json(pol.to_json()) == pol
    for bad in [dict(lap_s=(0.1,), prior=()), dict(lap_s=(0.1, math.nan), prior=(0.3,)),
                dict(lap_s=(0.1, 0.2), prior=(0.3, 0.3)), dict(lap_s=(0.1, 0.2), prior=(1.3,)),
                dict(lap_s=(0.1, 0.2), prior=(0.3,), prior_weight=0.0),
                dict(lap_s=(0.1, 0.2), prior=(0.3,), probe_tokens=2)]:
        with pytest.raises(ValueError):
            DraftPolicy(**bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.001, 10.0), min_size=2, max_size=10), st.data())
def test_the_choice_is_never_negative_nor_over_long_and_is_the_best(lap, data):
    n = len(lap) - 1
    prior = data.draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    pol = DraftPolicy(tuple(lap), tuple(prior), probe_every=data.draw(st.integers(1, 4)))
    s = pol.start()
    for _ in range(data.draw(st.integers(0, 20))):
        k = s.choose(limit=data.draw(st.one_of(st.none(), st.integers(-3, 12))))
        assert 0 <= k <= n
        if k == 0:
            s.plain_lap()
        else:
            s.observe(k, data.draw(st.integers(0, k)))
    limit = data.draw(st.integers(0, n))
    k = s.choose(limit=limit)
    assert 0 <= k <= limit
    # brute force over the allowed k: nothing beats the choice (a probe aside)
    rates = s.rates()
    rate = [(1 + expected_accepted(rates, j)) / lap[j] for j in range(limit + 1)]
    if not (k == pol.probe_tokens and s.plain_run >= pol.probe_every and max(rate) == rate[0]):
        assert rate[k] >= max(rate) * (1 - 1e-9)


def test_a_prior_per_draft_length_decides_each_k_by_its_own_walk():
    # one rate vector would say c1 = 0.2 for every k; the walk at k=1 says 0.6
    lap = (0.10, 0.12, 0.20)
    pol = DraftPolicy(lap, prior=(0.2, 0.9), by_k=((0.6,), (0.2, 0.9)))
    s = pol.start()
    # k=1: 1.6 / 0.12 = 13.3; k=2: (1 + 0.2 + 0.18) / 0.2 = 6.9; plain 10
    assert s.expected_rate(1) == pytest.approx(1.6 / 0.12)
    assert s.expected_rate(2) == pytest.approx(1.38 / 0.2)
    assert s.choose() == 1
    assert DraftPolicy(lap, prior=(0.2, 0.9)).start().choose() == 0  # 1.2 / 0.12 = 10 ties plain: the smaller k
    assert DraftPolicy.from_json(pol.to_json()) == pol
    with pytest.raises(ValueError):
        DraftPolicy(lap, prior=(0.2, 0.9), by_k=((0.6,),))
