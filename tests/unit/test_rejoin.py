"""A device lost by the heartbeat rule that comes back (a Wi-Fi drop of a few seconds)
can rejoin: planner/liveness.py un-forgets it after the rejoin hold (longer after each
drop), the host's scheduler takes DeviceBack and re-deals it back into the chain when
planner.chain.rejoin_rule finds the deal with it faster past the margin. Sans-IO, times
passed in.

By hand, for a beat every 0.25 s, a 1 s timeout and the 2 s hold after a first drop: a
peer heard last at 0 is lost at the tick of 1.25 (1.25 - 0 > 1); it says hello at 8.0 and
is heard every 0.25 s after; the timer ticks at 8.1 + 0.25 k, and the first tick with
now - 8.0 >= 2.0 is 10.1 (9.85 gives 1.85)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.chain import merge_lost, rejoin_rule
from planner.deal import Deal, Stage
from planner.liveness import SILENT, Liveness, rejoin_hold_s
from planner.protocol import ChainReady, DeviceBack, DeviceLost, IgnoreReason, QuestionAsked, Redeal
from planner.room import Network
from planner.scheduler import HostScheduler, HostState, SchedulerConfig
from splitroom.scenario import load
from tests.harness import Harness, truth


def beat_ticks(live: Liveness, times, hello_from=None, heard_until=None):
    """Tick at each time; the peer ``hello_from`` is heard every 0.25 s from its hello
    until ``heard_until``. Returns ``[(time, lost peers, back peers, beat peers)]``."""
    out = []
    for t in times:
        if hello_from is not None and heard_until is not None:
            k = 0
            while hello_from + 0.25 * k <= min(t, heard_until):
                live.heard("w1", hello_from + 0.25 * k)
                k += 1
        tick = live.handle_timer(t)
        for p, _, _ in tick.lost:
            live.forget(p, t)
        out.append((t, [p for p, _, _ in tick.lost], list(tick.back), list(tick.beat)))
    return out


def lost_at_1_25() -> Liveness:
    live = Liveness(["w1"], beat_s=0.25, timeout_s=1.0, grace_s=10.0, load_timeout_s=30.0)
    live.heard("w1", 0.0)
    got = beat_ticks(live, [0.25, 0.5, 0.75, 1.0, 1.25])
    assert [(t, lost) for t, lost, _, _ in got if lost] == [(1.25, ["w1"])]
    return live


def test_a_lost_peer_that_says_hello_again_is_back_after_the_hold_and_is_timed_again():
    live = lost_at_1_25()
    assert beat_ticks(live, [1.5])[0][3] == []  # lost: no heartbeats to it
    live.returned("w1", 8.0)
    assert live.coming_back("w1")
    times = [round(8.1 + 0.25 * k, 2) for k in range(12)]  # 8.1 .. 10.85
    got = beat_ticks(live, times, hello_from=8.0, heard_until=10.5)
    assert [t for t, _, back, _ in got if back] == [10.1]
    assert all(beat == ["w1"] for _, _, _, beat in got)  # heartbeats again while it comes back
    assert "w1" not in live.lost and not live.coming_back("w1")
    # back means timed again: last heard at 10.5, lost by the plain rule at the first tick past 11.5
    tick = live.handle_timer(11.6)
    assert [(p, rule) for p, _, rule in tick.lost] == [("w1", SILENT)]


def test_the_hold_doubles_with_each_drop_in_the_window_and_is_capped():
    assert rejoin_hold_s([], 0.0) == 2.0
    assert rejoin_hold_s([1.25], 8.0) == 2.0
    assert rejoin_hold_s([1.25, 20.0], 30.0) == 4.0
    assert rejoin_hold_s([1.25, 20.0, 40.0], 50.0) == 8.0
    assert rejoin_hold_s([0.0, 100.0], 700.0) == 2.0  # both drops older than 600 s: forgotten
    assert rejoin_hold_s([float(t) for t in range(20)], 30.0) == 120.0  # 2 * 2**19 capped


def test_a_peer_that_falls_silent_again_during_the_hold_is_another_drop_and_must_say_hello_again():
    live = lost_at_1_25()
    live.returned("w1", 8.0)
    got = beat_ticks(live, [8.1, 8.35, 8.6, 8.85, 9.1, 9.35, 9.6], hello_from=8.0, heard_until=8.5)
    # heard last at 8.5: at 9.6 (9.6 - 8.5 > 1) it is no longer coming back, and gets no beat
    assert got[-1][3] == [] and not live.coming_back("w1") and "w1" in live.lost
    assert live.drops["w1"] == [1.25, 9.6]
    live.returned("w1", 12.0)  # two drops in the window: a 4 s hold, back at the first tick >= 16.0
    times = [round(12.1 + 0.25 * k, 2) for k in range(18)]
    got = beat_ticks(live, times, hello_from=12.0, heard_until=17.0)
    assert [t for t, _, back, _ in got if back] == [16.1]


def test_hello_from_a_peer_that_is_not_lost_changes_nothing():
    live = Liveness(["w1"], beat_s=0.25, timeout_s=1.0, grace_s=10.0, load_timeout_s=30.0)
    live.heard("w1", 0.0)
    live.returned("w1", 0.5)
    assert not live.coming_back("w1") and live.handle_timer(0.6).back == ()


# -- the scheduler ------------------------------------------------------------------

DEAL = Deal(host="h", split="pinned", stages=(Stage("h", 0, 1), Stage("w", 1, 2)), guests=(), fits=True, notes=())
MERGED = Deal(host="h", split="pinned", stages=(Stage("h", 0, 2),), guests=(), fits=True, notes=())


def test_device_back_re_deals_it_into_the_chain_and_the_answer_is_the_greedy_one():
    h = Harness(DEAL, SchedulerConfig(hidden=4, prefill_chunk=2), redeal=merge_lost,
                rejoin=lambda current, lost: DEAL)
    h.ask(0, "h", 5, 30)
    for _ in range(40):
        h.step()
    before = len(h.answers().get(0, []))
    h.lose("w")
    for _ in range(30):
        h.step()
    assert 0 < before < len(h.answers()[0]) < 30  # lost mid-answer, answered on without it, not done
    assert h.host.deal.stages == MERGED.stages and h.host.lost == {"w"}
    h.back("w")
    assert h.host.lost == set()
    redeals = [x for x in h.log if isinstance(x, Redeal)]
    assert [(r.lost, r.back, r.stages) for r in redeals] == [
        ("w", None, (("h", 0, 2),)), ("", "w", (("h", 0, 1), ("w", 1, 2)))]
    assert h.host.state == HostState.RECOVERING
    h.run()
    assert h.answers() == {0: [truth(p) for p in range(5, 35)]}
    assert h.ended() == {0: "answered"}
    assert not [i for i in h.ignored if i.reason == IgnoreReason.BUG]


def test_device_back_without_a_faster_deal_only_takes_it_out_of_lost():
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4), redeal=lambda d, lost: MERGED,
                      rejoin=lambda current, lost: None)
    s.handle(QuestionAsked(0, "h", (7, 8), 3), 0.0)
    out = s.handle(DeviceLost("w"), 0.0)
    s.handle(ChainReady(out[-1].first_lap), 0.0)
    assert s.handle(DeviceBack("w"), 1.0) == [] and s.lost == set()
    assert s.deal.stages == MERGED.stages and not s.ignored
    # it is no longer lost: losing it again is news, not a repeat (it holds no layers: nothing to re-deal)
    s.handle(DeviceLost("w"), 2.0)
    assert not [i for i in s.ignored if i.reason == IgnoreReason.REPEATED]


def test_device_back_that_was_never_lost_or_in_a_stopped_room_is_ignored_with_the_reason():
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4), rejoin=lambda current, lost: DEAL)
    assert s.handle(DeviceBack("w"), 0.0) == []
    assert [(i.reason, i.detail) for i in s.ignored] == [(IgnoreReason.REPEATED, "w was not lost")]
    s.handle(DeviceLost("w"), 0.0)  # no re-deal rule: the room stops
    assert s.state == HostState.STOPPED
    assert s.handle(DeviceBack("w"), 1.0) == []
    assert s.ignored[-1].reason == IgnoreReason.STALE and s.state == HostState.STOPPED


# -- the rule -----------------------------------------------------------------------

PINNED = ["stages=[{device: desktop, layers: '1-20'}, {device: laptop, layers: '21-30'}]",
          "devices[0].lends=1 GB"]


def rule_with(desktop_s: float, laptop_s: float):
    """home.yaml's desktop 1-20 / laptop 21-30, each with a measured seconds per layer."""
    scn = load("scenarios/home.yaml", PINNED)
    speed = {"desktop": desktop_s, "laptop": laptop_s}
    devices = [replace(d, s_per_layer=speed.get(d.id)) for d in scn.devices]
    first = Deal.pinned("desktop", (("desktop", 0, 20), ("laptop", 20, 30)))
    return rejoin_rule(devices, scn.model, first, scn.options, scn.network, scn.decoding.return_path), first


def test_the_rule_deals_the_device_back_when_the_deal_with_it_is_faster_past_the_margin():
    # desktop 10 ms a layer, laptop 0.1 ms: alone the desktop's lap is head + 300 ms; with
    # the laptop head + 200 + 1 ms + two hops (a few ms): over 1.2x faster for any head under 0.2 s
    rule, first = rule_with(0.010, 0.0001)
    alone = merge_lost(first, frozenset({"laptop"}))
    assert [(s.device, s.start, s.end) for s in alone.stages] == [("desktop", 0, 30)]
    back = rule(alone, frozenset())
    assert back is not None and back.stages == first.stages
    assert rule(alone, frozenset({"laptop"})) is None  # still lost: the same deal, nothing to do


def test_the_rule_stays_when_the_device_is_not_faster_past_the_margin():
    # desktop 10 ms, laptop 8 ms: head + 300 ms alone against head + 280 ms + hops: under 1.08x
    rule, first = rule_with(0.010, 0.008)
    alone = merge_lost(first, frozenset({"laptop"}))
    assert rule(alone, frozenset()) is None


def test_the_rule_stays_when_the_deal_with_it_does_not_fit_what_it_lends():
    scn = load("scenarios/home.yaml", PINNED + ["devices[1].lends=20 MB"])
    speed = {"desktop": 0.010, "laptop": 0.0001}
    devices = [replace(d, s_per_layer=speed.get(d.id)) for d in scn.devices]
    first = Deal.pinned("desktop", (("desktop", 0, 20), ("laptop", 20, 30)))
    rule = rejoin_rule(devices, scn.model, first, scn.options, Network(), scn.decoding.return_path)
    alone = merge_lost(first, frozenset({"laptop"}))
    assert rule(alone, frozenset()) is None  # 10 layers of 14 MB in 20 MB less headroom: check_lent refuses


def test_the_margin_is_the_slower_than_optimal_ratio():
    from planner.chain import REJOIN_MARGIN
    from planner.optimal import SLOWER_THAN_OPTIMAL_RATIO
    assert REJOIN_MARGIN == SLOWER_THAN_OPTIMAL_RATIO


def test_the_margin_decides_between_a_faster_deal_and_staying():
    # desktop 10 ms a layer, laptop 8 ms, by hand: the desktop's head is the tied embedding,
    # 113,246,208 B / 14,160,384 B a layer = 7.9974 layers at 10 ms + 0.1 ms sampling =
    # 80.074 ms. Alone: 80.074 + 30 x 10 = 380.074 ms. With the laptop: 80.074 + 20 x 10
    # + 10 x 8 + two hops of 2 ms (half the 4 ms RTT) + 0.5 ms overhead + 2,336 B at
    # 200 Mbit/s (0.093 ms) = 365.261 ms: 1.0406x faster. Taken past a 1.03 margin, not 1.05.
    scn = load("scenarios/home.yaml", PINNED)
    speed = {"desktop": 0.010, "laptop": 0.008}
    devices = [replace(d, s_per_layer=speed.get(d.id)) for d in scn.devices]
    first = Deal.pinned("desktop", (("desktop", 0, 20), ("laptop", 20, 30)))
    alone = merge_lost(first, frozenset({"laptop"}))

    def rule(margin):
        return rejoin_rule(devices, scn.model, first, scn.options, scn.network, scn.decoding.return_path,
                           margin=margin)
    back = rule(1.03)(alone, frozenset())
    assert back is not None and back.stages == first.stages
    assert rule(1.05)(alone, frozenset()) is None
