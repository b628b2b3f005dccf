from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from planner.room import Speculative
from sim.acceptance import make_acceptance

N = 200_000


def draws(spec: Speculative, k: int, seed: int = 1, n: int = N) -> list[int]:
    m = make_acceptance(spec, np.random.default_rng(seed))
    return [m.accepted(k) for _ in range(n)]


@pytest.mark.parametrize("p,k", [(0.75, 4), (0.5, 1), (0.9, 8), (0.3, 3)])
def test_per_token_mean_matches_closed_form(p, k):
    x = draws(Speculative(acceptance=p), k)
    closed = p * (1 - p**k) / (1 - p)  # sum_{i=1..k} p^i
    assert np.mean(x) == pytest.approx(closed, abs=0.015)
    assert min(x) >= 0 and max(x) <= k


def test_per_token_distribution_is_truncated_geometric():
    p, k = 0.75, 4
    c = Counter(draws(Speculative(acceptance=p), k))
    # P(a = i) = p^i (1 - p) for i < k, P(a = k) = p^k
    for i in range(k):
        assert c[i] / N == pytest.approx(p**i * (1 - p), abs=0.005)
    assert c[k] / N == pytest.approx(p**k, abs=0.005)


def test_per_token_edges():
    assert set(draws(Speculative(acceptance=1.0), 5, n=100)) == {5}
    assert set(draws(Speculative(acceptance=0.0), 5, n=100)) == {0}
    assert draws(Speculative(acceptance=0.7), 0, n=100) == [0] * 100


def test_empirical_resamples_and_caps():
    lengths = (0, 2, 2, 4)
    x = draws(Speculative(accepted_lengths=lengths, acceptance=None), 3)
    c = Counter(x)
    assert set(c) == {0, 2, 3}
    assert c[0] / N == pytest.approx(0.25, abs=0.005)
    assert c[2] / N == pytest.approx(0.5, abs=0.005)
    assert c[3] / N == pytest.approx(0.25, abs=0.005)  # the 4s capped at k = 3


def test_recorded_sequence_replays_in_order_and_cycles():
    m = make_acceptance(Speculative(accepted_sequence=(3, 0, 1, 4)), np.random.default_rng(0))
    assert [m.accepted(4) for _ in range(9)] == [3, 0, 1, 4, 3, 0, 1, 4, 3]
    m = make_acceptance(Speculative(accepted_sequence=(3, 0, 5)), np.random.default_rng(0))
    assert [m.accepted(2) for _ in range(3)] == [2, 0, 2]


def test_sequence_wins_over_lengths_over_probability():
    s = Speculative(acceptance=0.1, accepted_lengths=(2,), accepted_sequence=(1,))
    assert draws(s, 4, n=5) == [1] * 5
    s = Speculative(acceptance=0.1, accepted_lengths=(2,))
    assert draws(s, 4, n=5) == [2] * 5


def test_deterministic_for_a_seed():
    s = Speculative(acceptance=0.6)
    assert draws(s, 4, seed=5, n=5000) == draws(s, 4, seed=5, n=5000)
    assert draws(s, 4, seed=5, n=5000) != draws(s, 4, seed=6, n=5000)
    e = Speculative(accepted_lengths=(0, 1, 2, 3), acceptance=None)
    assert draws(e, 4, seed=5, n=5000) == draws(e, 4, seed=5, n=5000)


@pytest.mark.parametrize("spec", [
    Speculative(acceptance=None),
    Speculative(acceptance=1.5),
    Speculative(acceptance=-0.1),
    Speculative(accepted_lengths=(1, -1)),
    Speculative(accepted_sequence=(-2,)),
])
def test_bad_specs_raise(spec):
    with pytest.raises(ValueError):
        make_acceptance(spec, np.random.default_rng(0))


def test_negative_k_raises():
    m = make_acceptance(Speculative(acceptance=0.5), np.random.default_rng(0))
    with pytest.raises(ValueError):
        m.accepted(-1)
