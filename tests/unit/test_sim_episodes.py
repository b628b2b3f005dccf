from __future__ import annotations

import math

import numpy as np
import pytest

from planner.room import Episodes
from sim.episodes import EpisodeClock

SPEC = Episodes(every_s=60.0, lasting_s=5.0, extra_rtt_s=0.150)


def stalled_fraction(clock: EpisodeClock, horizon_s: float, step_s: float) -> float:
    ts = np.arange(0.0, horizon_s, step_s)
    return float(np.mean([clock.stalled(float(t)) for t in ts]))


@pytest.mark.parametrize("start_jitter", [0.0, 1.0])
def test_fraction_of_time_stalled(start_jitter):
    clock = EpisodeClock(SPEC, np.random.default_rng(1), start_jitter=start_jitter)
    assert stalled_fraction(clock, 6000.0, 0.05) == pytest.approx(5 / 60, abs=0.003)
    assert clock.stall_fraction == pytest.approx(5 / 60)


def test_extra_is_the_spec_inside_and_zero_outside():
    clock = EpisodeClock(SPEC, np.random.default_rng(2))
    values = {clock.extra_rtt_s(float(t)) for t in np.arange(0, 600, 0.1)}
    assert values == {0.0, 0.150}


def test_nearby_times_in_one_episode_are_both_stalled():
    clock = EpisodeClock(SPEC, np.random.default_rng(3), start_jitter=0.5)
    t = 0.0
    while not clock.stalled(t):
        t += 0.01
    start, end = clock.window(t)
    assert end - start == pytest.approx(5.0)
    # every point of the episode is stalled: bursts, not independent noise
    for dt in np.linspace(0, 4.99, 50):
        assert clock.extra_rtt_s(start + dt) == 0.150
    assert not clock.stalled(end + 1e-9)
    assert not clock.stalled(max(start - 1e-9, 0.0)) or start == 0.0


def test_periodic_without_start_jitter():
    clock = EpisodeClock(SPEC, np.random.default_rng(4))
    p = clock.phase_s
    assert 0 <= p < 60
    for n in range(1, 5):
        assert clock.window(p + n * 60 + 1.0) == pytest.approx((p + n * 60, p + n * 60 + 5))
        assert not clock.stalled(p + n * 60 + 5.5)


def test_seeded_phase_and_query_order_independence():
    a = EpisodeClock(SPEC, np.random.default_rng(9), start_jitter=1.0)
    b = EpisodeClock(SPEC, np.random.default_rng(9), start_jitter=1.0)
    ts = np.arange(0, 3000, 0.7)
    fwd = [a.stalled(float(t)) for t in ts]
    back = [b.stalled(float(t)) for t in ts[::-1]][::-1]
    assert fwd == back
    c = EpisodeClock(SPEC, np.random.default_rng(10))
    assert c.phase_s != a.phase_s


def test_none_never_stalls_and_long_always_stalls():
    rng = np.random.default_rng(0)
    never = EpisodeClock(None, rng)
    assert never.extra_rtt_s(123.0) == 0.0 and never.stall_fraction == 0.0
    always = EpisodeClock(Episodes(every_s=1.0, lasting_s=2.0, extra_rtt_s=0.1), rng)
    assert always.extra_rtt_s(0.0) == 0.1 and always.extra_rtt_s(1e6) == 0.1
    assert always.window(5.0) == (0.0, math.inf)


@pytest.mark.parametrize(
    "spec,kw",
    [
        (Episodes(0.0, 1.0, 0.1), {}),
        (Episodes(1.0, -1.0, 0.1), {}),
        (Episodes(1.0, 0.5, -0.1), {}),
        (Episodes(1.0, 0.5, 0.1), {"start_jitter": 1.5}),
    ],
)
def test_bad_specs_raise(spec, kw):
    with pytest.raises(ValueError):
        EpisodeClock(spec, np.random.default_rng(0), **kw)


def test_negative_time_raises():
    with pytest.raises(ValueError):
        EpisodeClock(SPEC, np.random.default_rng(0)).extra_rtt_s(-1.0)
