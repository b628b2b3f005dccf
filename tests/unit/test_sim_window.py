"""Slow start on a simulated link: extra round trips for frames larger than the window,
computed by hand."""

import simpy

from planner.room import Jitter, Network
from sim.link import Link, Uplinks, resolve_link


def link(window=11600.0, rtt=0.080):
    env = simpy.Environment()
    net = Network(rtt_s=rtt, jitter=Jitter(), bandwidth_Bps=1e15, hop_overhead_s=0.0, window_bytes=window)
    import numpy as np
    return env, Link(env, "a", "b", resolve_link(net, "a", "b"), Uplinks(env), np.random.default_rng(0))


def test_a_frame_within_the_window_pays_half_a_round_trip():
    env, ln = link()
    assert abs(ln.schedule(2336) - 0.040) < 1e-9


def test_a_70_kb_frame_needs_two_more_round_trips_then_the_window_has_grown():
    env, ln = link()
    # 11.6 KB in the first flight, then 23.2 (34.8 in all), then 46.4 (81.2 >= 70 KB): 2 extra RTTs
    assert abs(ln.schedule(70_000) - (0.040 + 2 * 0.080)) < 1e-9
    # the window is 46.4 KB now: 70 KB needs one more doubling (46.4 + 92.8): 1 extra RTT,
    # and the ordered link delivers it no earlier than the first
    t2 = ln.schedule(70_000)
    assert abs(t2 - max(0.040 + 0.080, 0.200)) < 1e-9


def test_the_window_falls_back_after_a_second_idle():
    env, ln = link()
    ln.schedule(70_000)
    env.run(until=2.0)
    assert abs(ln.schedule(70_000) - (2.0 + 0.040 + 2 * 0.080)) < 1e-9


def test_no_window_no_extra_round_trips():
    env, ln = link(window=None)
    assert abs(ln.schedule(1_000_000) - 0.040) < 1e-9
