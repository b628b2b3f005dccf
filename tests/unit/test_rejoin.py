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

from planner.chain import measured_faster, measured_lap_s, merge_lost, rejoin_rule
from planner.deal import Deal, Stage
from planner.hops import HopTimed, Measured, StageSpeeds, StageTimed
from planner.liveness import SILENT, Liveness, rejoin_hold_s
from planner.protocol import ChainReady, Computed, DeviceBack, DeviceLost, IgnoreReason, QuestionAsked, Redeal, RunStage
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
                rejoin=lambda current, lost, measured: DEAL)
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
                      rejoin=lambda current, lost, measured: None)
    s.handle(QuestionAsked(0, "h", (7, 8), 3), 0.0)
    out = s.handle(DeviceLost("w"), 0.0)
    s.handle(ChainReady(out[-1].first_lap), 0.0)
    assert s.handle(DeviceBack("w"), 1.0) == [] and s.lost == set()
    assert s.deal.stages == MERGED.stages and not s.ignored
    # it is no longer lost: losing it again is news, not a repeat (it holds no layers: nothing to re-deal)
    s.handle(DeviceLost("w"), 2.0)
    assert not [i for i in s.ignored if i.reason == IgnoreReason.REPEATED]


def test_device_back_that_was_never_lost_or_in_a_stopped_room_is_ignored_with_the_reason():
    s = HostScheduler(DEAL, SchedulerConfig(hidden=4), rejoin=lambda current, lost, measured: DEAL)
    assert s.handle(DeviceBack("w"), 0.0) == []
    assert [(i.reason, i.detail) for i in s.ignored] == [(IgnoreReason.REPEATED, "w was not lost")]
    s.handle(DeviceLost("w"), 0.0)  # no re-deal rule: the room stops
    assert s.state == HostState.STOPPED
    assert s.handle(DeviceBack("w"), 1.0) == []
    assert s.ignored[-1].reason == IgnoreReason.STALE and s.state == HostState.STOPPED


# -- the rule: measured faster, never declared faster -----------------------------

PINNED = ["stages=[{device: desktop, layers: '1-20'}, {device: laptop, layers: '21-30'}]",
          "devices[0].lends=1 GB"]
FIRST = Deal.pinned("desktop", (("desktop", 0, 20), ("laptop", 20, 30)))
ALONE = merge_lost(FIRST, frozenset({"laptop"}))
#: home.yaml's hop by the lap model (a hop the room did not time): half the 4 ms round
#: trip + 0.5 ms overhead + 2,336 B (32 B header + 576 x 4 B) at 200 Mbit/s (0.09344 ms)
HOME_HOP_S = 0.002 + 0.0005 + 2336 / 25e6


def rule_with(declared: dict | None = None, lends: list | None = None, margin: float | None = None):
    """home.yaml's desktop 1-20 / laptop 21-30 (the first deal), each device's declared
    seconds per layer from ``declared`` (what a calibration would say: the rule must not
    use it)."""
    scn = load("scenarios/home.yaml", PINNED + (lends or []))
    devices = [replace(d, s_per_layer=(declared or {}).get(d.id)) for d in scn.devices]
    kw = {} if margin is None else {"margin": margin}
    return rejoin_rule(devices, scn.model, FIRST, scn.options, scn.network, scn.decoding.return_path, **kw)


def test_the_rule_deals_the_device_back_when_it_is_measured_faster():
    # measured: desktop 10 ms a layer, laptop 4 ms, head not timed (0 both ways), hops not
    # timed (the lap model's 2.59344 ms). Alone 30 x 10 = 300 ms; with the laptop 20 x 10
    # + 10 x 4 + 2 x 2.59344 = 245.187 ms: 1.2236x, past the 1.2x margin
    assert [(s.device, s.start, s.end) for s in ALONE.stages] == [("desktop", 0, 30)]
    measured = Measured({"desktop": 0.010, "laptop": 0.004})
    assert measured_lap_s("desktop", [("desktop", 0, 30)], measured) == pytest.approx(0.300)
    assert measured_lap_s("desktop", [("desktop", 0, 20), ("laptop", 20, 30)], measured,
                          lambda a, b: HOME_HOP_S) == pytest.approx(0.240 + 2 * HOME_HOP_S)
    back = rule_with()(ALONE, frozenset(), measured)
    assert back is not None and back.stages == FIRST.stages
    assert rule_with()(ALONE, frozenset({"laptop"}), measured) is None  # still lost: the same deal


def test_the_rule_stays_when_the_device_is_measured_slower_whatever_it_declares():
    # laptop measured 6 ms a layer: 200 + 60 + 5.187 = 265.187 ms against 300: 1.131x, under
    # the margin, though its declared 0.1 ms a layer would make the deal with it 3.5x faster
    measured = Measured({"desktop": 0.010, "laptop": 0.006})
    assert rule_with({"desktop": 0.010, "laptop": 0.0001})(ALONE, frozenset(), measured) is None


def test_the_rule_stays_when_the_device_was_never_measured():
    # the laptop came back before the room timed it: only its declared speed says it is
    # fast (0.1 ms a layer), and a declared speed never re-deals
    measured = Measured({"desktop": 0.010})
    assert rule_with({"desktop": 0.010, "laptop": 0.0001})(ALONE, frozenset(), measured) is None
    assert rule_with()(ALONE, frozenset(), Measured({})) is None


def test_the_rule_stays_when_the_deal_with_it_does_not_fit_what_it_lends():
    measured = Measured({"desktop": 0.010, "laptop": 0.0001})
    # 10 layers of 14 MB in 20 MB less headroom: check_lent refuses, however fast it was
    assert rule_with(lends=["devices[1].lends=20 MB"])(ALONE, frozenset(), measured) is None


def test_the_margin_is_the_slower_than_optimal_ratio():
    from planner.chain import REJOIN_MARGIN
    from planner.optimal import SLOWER_THAN_OPTIMAL_RATIO
    assert REJOIN_MARGIN == SLOWER_THAN_OPTIMAL_RATIO


def test_the_margin_decides_on_the_measured_head_and_hops():
    # measured: desktop 10 ms a layer, laptop 8 ms, head 80 ms, hops desktop -> laptop 2 ms
    # and back 3 ms. Alone 80 + 300 = 380 ms; with the laptop 80 + 200 + 80 + 2 + 3 =
    # 365 ms: 1.04110x, taken past a 1.041 margin, not past 1.045. The hops not timed (the
    # lap model's 2 x 2.59344 ms): 365.187 ms, 1.04056x, not past 1.041 but past 1.04
    timed = Measured({"desktop": 0.010, "laptop": 0.008}, 0.080,
                     {("desktop", "laptop"): 0.002, ("laptop", "desktop"): 0.003})
    untimed = Measured({"desktop": 0.010, "laptop": 0.008}, 0.080)
    assert rule_with(margin=1.041)(ALONE, frozenset(), timed).stages == FIRST.stages
    assert rule_with(margin=1.045)(ALONE, frozenset(), timed) is None
    assert rule_with(margin=1.041)(ALONE, frozenset(), untimed) is None
    assert rule_with(margin=1.04)(ALONE, frozenset(), untimed).stages == FIRST.stages


def test_a_measured_lap_by_hand_returning_through_the_stages():
    # h (0 layers: nothing to time) -> a (2 layers at 1 ms) -> b (3 at 2 ms) and back through
    # b -> a -> h: head 0.5 ms; hops h>a 1, a>b 2, b>a 3 (timed), a>h by the model's 4 ms:
    # 0.5 + 2 + 6 + 1 + 2 + 3 + 4 = 18.5 ms
    m = Measured({"a": 0.001, "b": 0.002}, 0.0005, {("h", "a"): 0.001, ("a", "b"): 0.002, ("b", "a"): 0.003})
    rows = [("h", 0, 0), ("a", 0, 2), ("b", 2, 5)]
    assert measured_lap_s("h", rows, m, lambda x, y: 0.004, "via_stages") == pytest.approx(0.0185)
    assert measured_lap_s("h", rows, m, None, "via_stages") == pytest.approx(0.0145)  # a>h untimed, no model: 0
    assert measured_lap_s("h", rows + [("c", 5, 6)], m) is None  # c never timed
    assert not measured_faster(Deal.pinned("h", rows), Deal.pinned("a", [("a", 0, 5)]), m, margin=0.0)  # another host


def test_the_room_times_one_position_laps_per_layer_it_held():
    # lap 3 (one position): h held 20 layers, w 10; lap 4 a 9-position prefill chunk
    sp = StageSpeeds()
    layers = {"h": 20, "w": 10}
    sp.lap(3, 1, layers)
    sp.lap(4, 9, layers)
    sp.lap(5, 1, {"h": 30})
    sp.timed(StageTimed("w", 3, 0.05))  # 5 ms a layer
    sp.timed(StageTimed("w", 4, 9.0))  # a prefill chunk: not a decode step's time
    sp.timed(StageTimed("w", 5, 1.0))  # w held no layers in lap 5
    sp.timed(StageTimed("w", 77, 1.0))  # a lap it was not told of
    sp.computed(Computed("h", "RunStage", 3, 0.2))  # 10 ms a layer
    sp.computed(Computed("h", "RunStage", 5, 0.6))  # 20 ms a layer
    sp.computed(Computed("h", "RunHead", 3, 0.004))
    sp.computed(Computed("h", "Draft", 3, 5.0))
    sp.hop(HopTimed("h", "w", 3, 0.002, 0.0))
    sp.hop(HopTimed("h", "w", 4, 0.5, 0.0))  # the prefill's frame
    m = sp.measured()
    assert m.s_per_layer == pytest.approx({"w": 0.005, "h": 0.015})
    assert m.head_s == pytest.approx(0.004) and m.hop_s == pytest.approx({("h", "w"): 0.002})
    few = StageSpeeds(keep=2)
    few.lap(0, 1, {"w": 1})
    for s in (9.0, 1.0, 3.0):
        few.timed(StageTimed("w", 0, s))
    assert few.measured().s_per_layer == {"w": 2.0}  # the latest 2


def test_the_chain_hands_the_rule_what_the_room_timed():
    # a room with a rejoin rule: the chain tells its speeds each lap the host begins; the
    # driver's times of w's decode laps (10 ms over its layer) and the host's (4 ms over
    # its) reach the rule when w comes back, with the chain as it is then
    seen = []
    h = Harness(DEAL, SchedulerConfig(hidden=4, prefill_chunk=2), redeal=merge_lost,
                rejoin=lambda current, lost, measured: seen.append((current.stages, lost, measured)))
    h.ask(0, "h", 4, 6)
    h.run()
    decode = [c.lap_id for c in h.log if isinstance(c, RunStage) and c.device == "h" and c.tokens == 1]
    assert len(decode) == 5  # the prompt in 2 chunks of 2; 6 tokens: the prompt's head gives the first
    for lap in decode:
        h.chain.speeds.timed(StageTimed("w", lap, 0.010))
        h.chain.speeds.computed(Computed("h", "RunStage", lap, 0.004))
    h.lose("w")
    h.run()
    h.back("w")
    ((stages, lost, measured),) = seen
    assert stages == MERGED.stages and lost == frozenset()
    assert measured.s_per_layer == pytest.approx({"w": 0.010, "h": 0.004})


# -- the rule's branches by hand: a room that is not pinned, a pinned first deal, what is checked

GIB = 2**30


def gib_layers(layers: int = 6, kv_bytes_per_token: int = 0):
    from planner.model import ModelSpec
    return ModelSpec(id="g", name="g", layers=layers, hidden=4, layer_bytes=GIB, layer_active_bytes=GIB,
                     layer_flops_per_token=0.0, kv_bytes_per_token=kv_bytes_per_token)


def every_hop(ids, s):
    return {(a, b): s for a in ids for b in ids if a != b}


def rows(d):
    return [(s.device, s.start, s.end) for s in d.stages]


def test_a_room_that_is_not_pinned_is_dealt_again_over_the_devices_not_lost_keeping_its_host():
    # h hosts (3 GiB: 3 layers of 1 GiB), u and w lend 4 GiB, v 3 GiB; 6 layers. The room
    # began h 1-3, w 4-6; w was lost, then u: it runs h 1-3, v 4-6. u comes back, w is
    # still lost. split: speed over h, u, v fills the fewest devices, the host first, then
    # the device that holds most (u): h 1-3, u 4-6, not the first deal (w is lost) and not
    # a deal hosted by u or w (they lend the most). Measured: h 10 ms a layer, u 5 ms,
    # v 20 ms, every hop 1 ms: now 30 + 60 + 2 = 92 ms, with u 30 + 15 + 2 = 47 ms (1.96x).
    from planner.room import DealOptions, Device
    devices = [Device("h", lends_bytes=3 * GIB), Device("u", lends_bytes=4 * GIB),
               Device("v", lends_bytes=3 * GIB), Device("w", lends_bytes=4 * GIB)]
    first = Deal(host="h", split="speed", stages=(Stage("h", 0, 3), Stage("w", 3, 6)), guests=(), fits=True,
                 notes=())
    current = Deal.pinned("h", (("h", 0, 3), ("v", 3, 6)))
    rule = rejoin_rule(devices, gib_layers(), first, DealOptions(split="speed"))
    measured = Measured({"h": 0.010, "u": 0.005, "v": 0.020}, None, every_hop("huvw", 0.001))
    back = rule(current, frozenset({"w"}), measured)
    assert back is not None and back.host == "h" and rows(back) == [("h", 0, 3), ("u", 3, 6)]
    assert back.split == "speed" and back.fits
    # nobody back (u and w lost): the deal over h and v is the one the room runs
    assert rule(current, frozenset({"u", "w"}), measured) is None


def test_a_pinned_first_deal_comes_back_as_it_was_once_nothing_of_it_is_lost():
    # the first deal is pinned (h 1-2, w 3-6) though the options name no stages; w was lost
    # (h ran all six) and is back. h alone 6 x 10 = 60 ms; the first deal 20 + 4 x 5 + 2 =
    # 42 ms (1.43x): the first deal itself, not a new deal (which would put all six on h, as
    # it lends 8 GiB: the fewest devices).
    from planner.room import DealOptions, Device
    devices = [Device("h", lends_bytes=8 * GIB), Device("w", lends_bytes=8 * GIB)]
    first = Deal.pinned("h", (("h", 0, 2), ("w", 2, 6)))
    rule = rejoin_rule(devices, gib_layers(), first, DealOptions(split="speed"))
    measured = Measured({"h": 0.010, "w": 0.005}, None, every_hop("hw", 0.001))
    assert rule(merge_lost(first, frozenset({"w"})), frozenset(), measured) == first


def test_the_rule_checks_only_the_stages_whose_range_changed():
    # pinned h 1-2, a 3-4, b 5-6, where b lends 1 GiB for its two layers (it has held them
    # all along). a was lost (h ran 1-4) and is back: b's stage is the same as now, so it
    # is not checked again (it is loaded already); h's and a's are, and fit. h 10 ms a
    # layer, a 1 ms, b 10 ms, every hop 1 ms: now 40 + 20 + 2 = 62 ms, back 20 + 2 + 20 + 3
    # = 45 ms (1.38x).
    from planner.room import DealOptions, Device
    devices = [Device("h", lends_bytes=8 * GIB), Device("a", lends_bytes=8 * GIB), Device("b", lends_bytes=GIB)]
    first = Deal.pinned("h", (("h", 0, 2), ("a", 2, 4), ("b", 4, 6)))
    now = merge_lost(first, frozenset({"a"}))
    assert rows(now) == [("h", 0, 4), ("b", 4, 6)]
    rule = rejoin_rule(devices, gib_layers(), first, DealOptions(split="speed"))
    measured = Measured({"h": 0.010, "a": 0.001, "b": 0.010}, None, every_hop("hab", 0.001))
    back = rule(now, frozenset(), measured)
    assert back is not None and rows(back) == rows(first)
    # a lends 1 GiB too: its new stage (two layers) is checked and refused
    small_a = [devices[0], Device("a", lends_bytes=GIB), devices[2]]
    assert rejoin_rule(small_a, gib_layers(), first, DealOptions(split="speed"))(now, frozenset(), measured) is None


def test_the_rule_stays_on_the_same_deal_whatever_the_margin():
    # nothing changes (the first deal is the one running): None even at a margin under 1,
    # where any deal would be "faster" than itself
    from planner.room import DealOptions, Device
    devices = [Device("h", lends_bytes=8 * GIB), Device("w", lends_bytes=8 * GIB)]
    first = Deal.pinned("h", (("h", 0, 2), ("w", 2, 6)))
    rule = rejoin_rule(devices, gib_layers(), first, DealOptions(split="speed"), margin=0.5)
    assert rule(first, frozenset(), Measured({"h": 0.010, "w": 0.005}, None, every_hop("hw", 0.001))) is None


def test_the_rule_sizes_each_layers_kv_at_the_rooms_kv_cache():
    # 1 KiB of f16 KV a token and layer: at 65,536 tokens of f32 KV a layer is 1 GiB +
    # 128 MiB, at f16 1 GiB + 64 MiB. w's two layers: 2 GiB + 256 MiB at f32, over the
    # 2 GiB + 192 MiB it lends (2 GiB + 128 MiB at f16 would fit).
    from planner.room import DealOptions, Device
    mib = 2**20
    devices = [Device("h", lends_bytes=8 * GIB), Device("w", lends_bytes=2 * GIB + 192 * mib)]
    first = Deal.pinned("h", (("h", 0, 2), ("w", 2, 4)))
    measured = Measured({"h": 0.010, "w": 0.001}, None, every_hop("hw", 0.001))
    now = merge_lost(first, frozenset({"w"}))
    model = gib_layers(4, kv_bytes_per_token=1024)
    f32 = DealOptions(context_tokens=65536, kv_cache="f32")
    f16 = DealOptions(context_tokens=65536, kv_cache="f16")
    assert rejoin_rule(devices, model, first, f32)(now, frozenset(), measured) is None
    assert rows(rejoin_rule(devices, model, first, f16)(now, frozenset(), measured)) == rows(first)


def test_the_rule_counts_the_hops_of_the_rooms_return_path():
    # pinned h 1-2, a 3-4, b 5-6; a was lost (h 1-4, b 5-6) and is back. 10 ms a layer
    # everywhere; every hop 1 ms but b -> h 50 ms. Now (h -> b -> h either way) 60 + 51 =
    # 111 ms. Back, direct (h -> a -> b -> h): 60 + 52 = 112 ms, not faster; via_stages
    # (h -> a -> b -> a -> h): 60 + 4 = 64 ms, 1.73x.
    from planner.room import DealOptions, Device
    devices = [Device(i, lends_bytes=8 * GIB) for i in "hab"]
    first = Deal.pinned("h", (("h", 0, 2), ("a", 2, 4), ("b", 4, 6)))
    hops = every_hop("hab", 0.001) | {("b", "h"): 0.050}
    measured = Measured({"h": 0.010, "a": 0.010, "b": 0.010}, None, hops)
    now = merge_lost(first, frozenset({"a"}))
    via = rejoin_rule(devices, gib_layers(), first, DealOptions(split="speed"), return_path="via_stages")
    direct = rejoin_rule(devices, gib_layers(), first, DealOptions(split="speed"), return_path="direct")
    assert rows(via(now, frozenset(), measured)) == rows(first)
    assert direct(now, frozenset(), measured) is None


def test_measured_faster_by_hand_both_laps_on_the_return_path_and_the_cost_model():
    # three stages against two, 10 ms a layer, b -> h 50 ms, other hops 1 ms (as above):
    # h 1-2, a 3-4, b 5-6 is 112 ms direct and 64 ms via_stages; h 1-4, b 5-6 111 ms either way
    three = Deal.pinned("h", (("h", 0, 2), ("a", 2, 4), ("b", 4, 6)))
    two = Deal.pinned("h", (("h", 0, 4), ("b", 4, 6)))
    hops = every_hop("hab", 0.001) | {("b", "h"): 0.050}
    m = Measured({"h": 0.010, "a": 0.010, "b": 0.010}, None, hops)
    assert measured_faster(three, two, m, None, "direct", margin=1.0)  # 112 > 111
    assert not measured_faster(three, two, m, None, "via_stages", margin=1.0)  # 64 < 111
    assert measured_faster(two, three, m, None, "via_stages", margin=1.7)  # 111 > 1.7 x 64
    assert not measured_faster(two, three, m, None, "direct", margin=1.0)
    # hops not timed: the cost model's 5 ms each, on both laps. h 1-3, v 4-6 (h 10 ms a
    # layer, v 20 ms) 30 + 60 + 10 = 100 ms; h 1-3, w 4-6 (w 12 ms) 30 + 36 + 10 = 76 ms:
    # 1.316x, past 1.3 (without the model's hops on the first lap: 90 against 76, 1.18x)
    v = Deal.pinned("h", (("h", 0, 3), ("v", 3, 6)))
    w = Deal.pinned("h", (("h", 0, 3), ("w", 3, 6)))
    untimed = Measured({"h": 0.010, "v": 0.020, "w": 0.012})
    assert measured_faster(v, w, untimed, lambda a, b: 0.005, margin=1.3)
    assert not measured_faster(v, w, untimed, lambda a, b: 0.005, margin=1.32)
    # exactly as fast is not faster: both laps 2 x 0.5 + 2 x 0.25 + 2 x 0.125 = 1.75 s
    exact = Measured({"h": 0.5, "v": 0.25, "w": 0.25}, None, every_hop("hvw", 0.125))
    v2 = Deal.pinned("h", (("h", 0, 2), ("v", 2, 4)))
    w2 = Deal.pinned("h", (("h", 0, 2), ("w", 2, 4)))
    assert measured_lap_s("h", rows(v2), exact) == 1.75 == measured_lap_s("h", rows(w2), exact)
    assert not measured_faster(v2, w2, exact, margin=1.0)


def test_a_scenarios_rejoin_rule_is_the_rule_over_its_devices_options_network_and_return_path():
    from planner.chain import rejoin_rule_for
    scn = load("scenarios/home.yaml", PINNED)
    # as in test_the_rule_deals_the_device_back_when_it_is_measured_faster: 1.2236x. The
    # laptop's 10 layers (157 MB at home's 2,048-token context) fit the 190 MB it may use
    # (200 MB less the 5 % headroom); at the default 8,192 tokens they would be 205 MB.
    measured = Measured({"desktop": 0.010, "laptop": 0.004})
    assert rejoin_rule_for(scn, FIRST)(ALONE, frozenset(), measured).stages == FIRST.stages
    assert rejoin_rule_for(scn, FIRST, margin=1.23)(ALONE, frozenset(), measured) is None
    # hops not timed: home's lap model (2.59344 ms a hop), 380 against 365.187 ms: 1.04056x
    # (a 1 ms, 1 Gbit/s network would make it 361.04 ms: 1.0525x)
    untimed = Measured({"desktop": 0.010, "laptop": 0.008}, 0.080)
    assert rejoin_rule_for(scn, FIRST, margin=1.0405)(ALONE, frozenset(), untimed).stages == FIRST.stages
    assert rejoin_rule_for(scn, FIRST, margin=1.041)(ALONE, frozenset(), untimed) is None
    # returning through the stages: desktop 1-10, laptop 11-20, phone 21-30; the laptop was
    # lost (desktop 1-20, phone 21-30) and is back. 10 ms a layer, hops 1 ms but phone ->
    # desktop 50 ms: now 300 + 51 = 351 ms; back via the stages 300 + 4 = 304 ms (1.155x,
    # past 1.1), directly 300 + 52 = 352 ms. The phone's unchanged stage is not checked.
    three = ["stages=[{device: desktop, layers: '1-10'}, {device: laptop, layers: '11-20'}, "
             "{device: phone, layers: '21-30'}]", "decoding.return=via_stages"]
    via = load("scenarios/home.yaml", three)
    first3 = Deal.pinned("desktop", (("desktop", 0, 10), ("laptop", 10, 20), ("phone", 20, 30)))
    now = merge_lost(first3, frozenset({"laptop"}))
    ids = ["desktop", "laptop", "phone"]
    hops = {(a, b): 0.001 for a in ids for b in ids if a != b} | {("phone", "desktop"): 0.050}
    m3 = Measured({d: 0.010 for d in ids}, None, hops)
    assert rejoin_rule_for(via, first3, margin=1.1)(now, frozenset(), m3).stages == first3.stages
    direct = load("scenarios/home.yaml", three[:1])
    assert rejoin_rule_for(direct, first3, margin=1.1)(now, frozenset(), m3) is None
