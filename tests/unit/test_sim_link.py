from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

from planner.room import Episodes, Jitter, LinkSpec, Network
from sim.link import LOOPBACK, Link, Links, ResolvedLink, Uplinks, resolve_link

GBIT = 1e9 / 8  # bytes/s


def plain_link(rtt=0.020, bw=GBIT, overhead=0.0005, jitter=Jitter(), episodes=None) -> ResolvedLink:
    return ResolvedLink(rtt_s=rtt, jitter=jitter, bandwidth_Bps=bw, hop_overhead_s=overhead, episodes=episodes)


def run_sends(env, link, sizes, at=0.0):
    out = []

    def go():
        if at:
            yield env.timeout(at)
        procs = [env.process(link.send(n)) for n in sizes]
        for p in procs:
            out.append((yield p))

    env.process(go())
    env.run()
    return out


# --- resolve_link -------------------------------------------------------------------

def test_resolve_defaults_and_symmetric_override():
    net = Network(rtt_s=0.001, bandwidth_Bps=GBIT, hop_overhead_s=0.0005,
                  jitter=Jitter("paretonormal", 0.0003),
                  links=(LinkSpec(between=("spark", "mac"), rtt_s=0.0004,
                                  episodes=Episodes(60, 5, 0.15)),))
    d = resolve_link(net, "spark", "phone")
    assert (d.rtt_s, d.bandwidth_Bps, d.hop_overhead_s, d.episodes) == (0.001, GBIT, 0.0005, None)
    assert d.jitter == Jitter("paretonormal", 0.0003)
    for a, b in (("spark", "mac"), ("mac", "spark")):
        o = resolve_link(net, a, b)
        assert o.rtt_s == 0.0004 and o.bandwidth_Bps == GBIT and o.episodes == Episodes(60, 5, 0.15)


def test_resolve_directed_wins_and_only_one_way():
    net = Network(rtt_s=0.010, links=(
        LinkSpec(between=("a", "b"), directed=True, bandwidth_Bps=1e6),
        LinkSpec(between=("a", "b"), rtt_s=0.050, bandwidth_Bps=5e6),
    ))
    ab, ba = resolve_link(net, "a", "b"), resolve_link(net, "b", "a")
    assert ab.bandwidth_Bps == 1e6 and ab.rtt_s == 0.050
    assert ba.bandwidth_Bps == 5e6 and ba.rtt_s == 0.050


def test_resolve_group_and_loopback():
    net = Network(links=(LinkSpec(between=("a", "b", "c"), rtt_s=0.07),))
    assert resolve_link(net, "c", "a").rtt_s == 0.07
    assert resolve_link(net, "a", "d").rtt_s == 0.001
    assert resolve_link(net, "a", "a") is LOOPBACK


@pytest.mark.parametrize("net", [
    Network(rtt_s=-1.0),
    Network(bandwidth_Bps=0.0),
    Network(hop_overhead_s=-0.1),
    Network(links=(LinkSpec(between=("a", "b", "c"), directed=True),)),
])
def test_resolve_rejects_bad_values(net):
    with pytest.raises(ValueError):
        resolve_link(net, "a", "b")


# --- Link timing --------------------------------------------------------------------

def test_one_frame_hand_calculation():
    env = simpy.Environment()
    link = Link(env, "a", "b", plain_link(), Uplinks(env), np.random.default_rng(0))
    [t] = run_sends(env, link, [10_000])
    # 10 kB at 125 MB/s = 80 us; + RTT/2 = 10 ms; + 0.5 ms overhead
    assert t == pytest.approx(80e-6 + 0.010 + 0.0005, abs=1e-12)
    assert env.now == pytest.approx(t, abs=1e-12)


def test_back_to_back_frames_serialize_through_the_uplink():
    env = simpy.Environment()
    link = Link(env, "a", "b", plain_link(), Uplinks(env), np.random.default_rng(0))
    t1, t2 = run_sends(env, link, [10_000, 10_000], at=1.0)
    assert t1 == pytest.approx(1.0 + 80e-6 + 0.0105, abs=1e-12)
    assert t2 == pytest.approx(1.0 + 160e-6 + 0.0105, abs=1e-12)


def test_sender_uplink_is_shared_between_receivers():
    env = simpy.Environment()
    up = Uplinks(env)
    ab = Link(env, "a", "b", plain_link(overhead=0), up, np.random.default_rng(0))
    ac = Link(env, "a", "c", plain_link(overhead=0), up, np.random.default_rng(1))
    cb = Link(env, "c", "b", plain_link(overhead=0), up, np.random.default_rng(2))
    assert ab.schedule(125_000) == pytest.approx(0.001 + 0.010)  # 1 ms on the wire
    assert ac.schedule(125_000) == pytest.approx(0.002 + 0.010)  # waits for a's uplink
    assert cb.schedule(125_000) == pytest.approx(0.001 + 0.010)  # c's own uplink is free
    assert up.busy("a") and up.free_at_s("a") == pytest.approx(0.002)


def test_uplink_matches_a_simpy_resource_reference():
    """Random traffic from three senders: serialization end times equal those of a
    capacity-1 FIFO simpy.Resource per sender (the textbook model)."""
    rng = np.random.default_rng(42)
    plan = [(float(rng.uniform(0, 0.05)), str(rng.choice(["a", "b", "c"])), int(rng.integers(1, 200_000)))
            for _ in range(300)]
    bw = 100e6

    env = simpy.Environment()
    res = {d: simpy.Resource(env, capacity=1) for d in "abc"}
    ref: list[float] = [0.0] * len(plan)

    def ref_send(i, at, dev, n):
        yield env.timeout(at)
        with res[dev].request() as req:
            yield req
            yield env.timeout(n / bw)
        ref[i] = env.now

    for i, (at, dev, n) in enumerate(plan):
        env.process(ref_send(i, at, dev, n))
    env.run()

    env2 = simpy.Environment()
    up = Uplinks(env2)
    links = {d: Link(env2, d, "z", plain_link(rtt=0.0, bw=bw, overhead=0.0), up, np.random.default_rng(0))
             for d in "abc"}
    got: list[float] = [0.0] * len(plan)

    def send(i, at, dev, n):
        yield env2.timeout(at)
        got[i] = yield env2.process(links[dev].send(n))

    for i, (at, dev, n) in enumerate(plan):
        env2.process(send(i, at, dev, n))
    env2.run()
    # no jitter, no rtt: delivery = serialization end, except where an earlier frame
    # of the same link delivers later (cannot happen without jitter)
    assert got == pytest.approx(ref, abs=1e-12)


def test_fifo_holds_under_heavy_jitter():
    env = simpy.Environment()
    spec = plain_link(rtt=0.020, jitter=Jitter("pareto", 0.050))
    link = Link(env, "a", "b", spec, Uplinks(env), np.random.default_rng(3))
    rng = np.random.default_rng(4)
    times = np.cumsum(rng.exponential(0.002, 2000))
    out = []

    def go():
        for t in times:
            yield env.timeout(t - env.now)
            out.append(link.schedule(1000))

    env.process(go())
    env.run()
    assert all(b >= a for a, b in zip(out, out[1:]))
    # jitter really reorders raw arrivals: some frames waited for earlier ones
    assert sum(b == a for a, b in zip(out, out[1:])) > 10
    # and nothing arrives before rtt/2 + serialization + overhead - clamp (>= send time)
    assert all(d >= t for d, t in zip(out, times))


def test_jitter_delay_never_negative():
    env = simpy.Environment()
    spec = plain_link(rtt=0.001, overhead=0.0, bw=math.inf, jitter=Jitter("normal", 0.010))
    link = Link(env, "a", "b", spec, Uplinks(env), np.random.default_rng(5))
    for _ in range(1000):
        link._last = -math.inf  # look at raw arrivals, without the ordering
        assert link.schedule(0) >= 0.0


def test_episode_adds_half_its_extra_rtt_both_ways():
    env = simpy.Environment()
    ep = Episodes(every_s=10.0, lasting_s=10.0, extra_rtt_s=0.150)  # always stalled
    net = Network(rtt_s=0.020, bandwidth_Bps=math.inf, episodes=ep)
    links = Links(env, net, np.random.default_rng(0))
    assert links.get("a", "b").schedule(0) == pytest.approx(0.010 + 0.075)
    assert links.get("a", "b").episodes is links.get("b", "a").episodes
    assert links("b", "a").schedule(0) == pytest.approx(0.085)


def test_episodes_make_slow_frames_come_in_bursts():
    env = simpy.Environment()
    net = Network(rtt_s=0.020, bandwidth_Bps=math.inf, episodes=Episodes(60.0, 5.0, 0.150))
    link = Links(env, net, np.random.default_rng(1)).get("a", "b")
    slow = []

    def go():
        for _ in range(12_000):  # one frame per 10 ms for 120 s
            slow.append(link.schedule(0) - env.now > 0.05)
            yield env.timeout(0.010)

    env.process(go())
    env.run()
    frac = np.mean(slow)
    assert frac == pytest.approx(5 / 60, abs=0.01)
    # runs, not scattered: about one run of ~500 frames per minute
    runs = sum(1 for a, b in zip(slow, slow[1:]) if b and not a) + int(slow[0])
    assert 1 <= runs <= 3


def test_links_are_deterministic_and_order_independent():
    net = Network(rtt_s=0.030, jitter=Jitter("paretonormal", 0.005))

    def trace(order):
        env = simpy.Environment()
        links = Links(env, net, np.random.default_rng(99))
        for pair in order:
            links.get(*pair)
        return [links.get(a, b).schedule(100) for a, b in [("a", "b"), ("b", "c"), ("a", "b"), ("c", "a")] * 5]

    one = trace([("a", "b"), ("b", "c"), ("c", "a")])
    two = trace([("c", "a"), ("b", "c"), ("a", "b")])
    assert one == two


def test_negative_frame_raises_at_once():
    env = simpy.Environment()
    link = Link(env, "a", "b", plain_link(), Uplinks(env), np.random.default_rng(0))
    with pytest.raises(ValueError):
        link.send(-1)
