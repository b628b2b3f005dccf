"""sim.jitter against closed forms computed here independently (statistics.NormalDist,
math), not through the module's own helpers."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from planner.room import Jitter
from sim.jitter import BLOCK, make_jitter

N = 400_000
SIGMA = 0.002  # 2 ms
BIG_BASE = 10.0  # so the clamp at -base_s never bites
CAP = 32767 / 8192  # netem int16 table limit, in sigmas
PHI = NormalDist()


def draws(dist: str, *, shape=None, seed=7, base_s=BIG_BASE, n=N, sigma=SIGMA) -> np.ndarray:
    s = make_jitter(Jitter(distribution=dist, scale_s=sigma, shape=shape), np.random.default_rng(seed), base_s=base_s)
    return s.sample_many(n)


def netem_pareto(tail: float, a: float = 3.0) -> float:
    return min((4 / 3) * (tail ** (-1 / a) - a / (a - 1)), CAP)


def paretonormal_quantile(u: float) -> float:
    z = max(min(PHI.inv_cdf(u), 4.0), -4.0)
    return max(min((z + 3 * netem_pareto(1 - u)) / 4, CAP), -4.0)


def test_none_and_zero_scale_are_zero():
    rng = np.random.default_rng(0)
    assert make_jitter(None, rng).sample() == 0.0
    assert make_jitter(Jitter(), rng).sample() == 0.0
    assert not np.any(make_jitter(Jitter("normal", 0.0), rng).sample_many(10))


def test_normal_moments_and_quantiles():
    x = draws("normal") / SIGMA
    assert abs(x.mean()) < 0.01
    assert x.std() == pytest.approx(1.0, abs=0.01)
    for q in (0.01, 0.1, 0.5, 0.9, 0.99):
        assert np.quantile(x, q) == pytest.approx(PHI.inv_cdf(q), abs=0.02)
    assert x.max() <= CAP + 1e-12 and x.min() >= -4.0 - 1e-12


def test_pareto_matches_netem_table_closed_form():
    x = draws("pareto") / SIGMA
    # V = (4/3)(U^(-1/3) - 1.5), capped at c: E[min(V, c)] in closed form
    c = CAP
    u_c = (0.75 * c + 1.5) ** -3
    mean = c * u_c + (4 / 3) * (1.5 * (1 - u_c ** (2 / 3)) - 1.5 * (1 - u_c))
    assert x.mean() == pytest.approx(mean, abs=0.01)
    # the cap at ~4 sigma cuts the right tail: netem's pareto mean is -0.033 sigma
    assert mean == pytest.approx(-0.0329, abs=0.001)
    assert x.min() >= (4 / 3) * (1 - 1.5) - 1e-12  # pareto's floor: -2/3 sigma
    # compare in probability, where the sampling error is sqrt(q(1-q)/n) < 0.001
    for q in (0.05, 0.5, 0.9, 0.98):
        assert np.mean(x <= netem_pareto(1 - q)) == pytest.approx(q, abs=0.003)
    # about u_c of draws sit on the cap
    assert np.mean(x >= CAP - 1e-9) == pytest.approx(u_c, rel=0.05)


def test_pareto_shape_changes_centring():
    x = draws("pareto", shape=5.0) / SIGMA
    # E[U^(-1/5)] = 5/4: uncapped table has mean 0 and P(V > c) is tiny for a = 5
    assert abs(x.mean()) < 0.01


def test_paretonormal_is_netem_blend_of_quantiles():
    x = draws("paretonormal") / SIGMA
    for q in (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98):
        assert np.mean(x <= paretonormal_quantile(q)) == pytest.approx(q, abs=0.003)
    # mean by midpoint integration of the quantile function
    m = 20_000
    mean = sum(paretonormal_quantile((i + 0.5) / m) for i in range(m)) / m
    assert x.mean() == pytest.approx(mean, abs=0.01)
    assert x.max() <= CAP + 1e-12


def test_lognormal_is_centred_with_sigma_spread():
    s = 0.5
    x = draws("lognormal", shape=s) / SIGMA
    assert abs(x.mean()) < 0.01
    assert x.std() == pytest.approx(1.0, rel=0.02)
    m = math.exp(s * s / 2)
    sd = math.sqrt(math.exp(s * s) - 1) * m
    for q in (0.1, 0.5, 0.9):
        assert np.quantile(x, q) == pytest.approx((math.exp(s * PHI.inv_cdf(q)) - m) / sd, abs=0.02)


def test_gamma_is_centred_with_sigma_spread_and_skew():
    k = 2.0
    x = draws("gamma", shape=k) / SIGMA
    assert abs(x.mean()) < 0.01
    assert x.std() == pytest.approx(1.0, rel=0.02)
    skew = np.mean(x**3) / x.std() ** 3
    assert skew == pytest.approx(2 / math.sqrt(k), rel=0.05)


def test_empirical_resamples_given_values():
    samples = (0.001, 0.002, 0.005)
    s = make_jitter(Jitter("empirical", samples_s=samples), np.random.default_rng(3), base_s=0.01)
    x = s.sample_many(90_000)
    assert set(np.unique(x).tolist()) == set(samples)
    for v in samples:
        assert np.mean(x == v) == pytest.approx(1 / 3, abs=0.01)


def test_clamp_keeps_delay_non_negative():
    base = 0.001
    x = draws("normal", base_s=base, sigma=0.001)
    assert x.min() >= -base
    # P(jitter < -base) = Phi(-1) of draws land exactly on the floor
    assert np.mean(x == -base) == pytest.approx(PHI.cdf(-1.0), abs=0.005)
    for dist in ("normal", "pareto", "paretonormal", "lognormal", "gamma"):
        assert draws(dist, base_s=0.0, n=20_000).min() >= 0.0


def test_deterministic_for_a_seed_and_streams_agree():
    a = draws("paretonormal", seed=11, n=10_000)
    b = draws("paretonormal", seed=11, n=10_000)
    c = draws("paretonormal", seed=12, n=10_000)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    j = Jitter("gamma", SIGMA)
    one = make_jitter(j, np.random.default_rng(5))
    singles = [one.sample() for _ in range(BLOCK + 17)]
    many = make_jitter(j, np.random.default_rng(5))
    mixed = [many.sample() for _ in range(5)] + many.sample_many(BLOCK + 12).tolist()
    assert singles == mixed
    assert all(isinstance(v, float) for v in singles[:3])


@pytest.mark.parametrize(
    "j",
    [
        Jitter("weird", 0.001),
        Jitter("normal", -0.001),
        Jitter("pareto", 0.001, shape=1.0),
        Jitter("gamma", 0.001, shape=0.0),
        Jitter("lognormal", 0.001, shape=-1.0),
        Jitter("empirical"),
    ],
)
def test_bad_specs_raise(j):
    with pytest.raises(ValueError):
        make_jitter(j, np.random.default_rng(0))


def test_negative_base_raises():
    with pytest.raises(ValueError):
        make_jitter(Jitter("normal", 0.001), np.random.default_rng(0), base_s=-1.0)
