"""planner/chain.py: the one router, the re-deal rules, and recovery after a lost worker
(zero-time harness, hand-worked examples)."""

from __future__ import annotations

import pytest

from planner.chain import Chain, deal_of, merge_lost, redeal_rule
from planner.deal import Deal, DealError, Stage
from planner.frames import FrameHeader, FrameKind
from planner.model import lookup
from planner.protocol import (ChainReady, DeviceLost, DropFrame, EmitToken, FrameArrived, LapKind, QuestionAsked,
                              Redeal, Refuse, RunStage, SendFrame, StageFinished)
from planner.room import DealOptions, Device
from planner.scheduler import SchedulerConfig
from tests.harness import Harness, truth


def pinned(host, *stages):
    return Deal(host=host, split="pinned", stages=tuple(Stage(*s) for s in stages), guests=(), fits=True, notes=())


DEAL = pinned("h", ("h", 0, 2), ("w1", 2, 4), ("w2", 4, 6))
CFG = SchedulerConfig(hidden=4, prefill_chunk=4)


def test_routing_worker_events_to_workers_and_the_rest_to_the_host():
    chain = Chain(DEAL, CFG)
    assert set(chain.workers) == {"w1", "w2"} and chain.host is not None
    cmds = chain.handle(QuestionAsked(0, "h", (7, 8), 3), 0.0)
    assert isinstance(cmds[-1], RunStage) and cmds[-1].device == "h"
    h = FrameHeader(FrameKind.PREFILL, 0, 0, 0, 2, 4, returns=True)
    assert chain.handle(FrameArrived("w1", "h", h), 0.0) == [RunStage("w1", 0, 0, 0, 2)]
    assert chain.handle(StageFinished("w1", 0), 0.0) == [SendFrame("w1", "w2", h)]


def test_a_chain_that_runs_one_worker_ignores_the_rest():
    chain = Chain(DEAL, CFG, runs={"w2"})
    assert chain.host is None and set(chain.workers) == {"w2"}
    assert chain.handle(QuestionAsked(0, "h", (7,), 3), 0.0) == []
    h = FrameHeader(FrameKind.PREFILL, 0, 0, 0, 1, 4, returns=True)
    assert chain.handle(FrameArrived("w1", "h", h), 0.0) == []  # not this process's device
    assert chain.handle(FrameArrived("w2", "w1", h), 0.0) == [RunStage("w2", 0, 0, 0, 1)]
    with pytest.raises(ValueError, match="neither the host nor a worker"):
        Chain(DEAL, CFG, runs={"x"})


def test_merge_lost_gives_a_lost_range_to_the_stage_before_it():
    assert merge_lost(DEAL, frozenset({"w1"})).stages == (Stage("h", 0, 4), Stage("w2", 4, 6))
    assert merge_lost(DEAL, frozenset({"w2"})).stages == (Stage("h", 0, 2), Stage("w1", 2, 6))
    assert merge_lost(DEAL, frozenset({"w1", "w2"})).stages == (Stage("h", 0, 6),)
    coord = pinned("c", ("a", 0, 3), ("b", 3, 6))  # a coordinator host: the first stage's layers go on
    assert merge_lost(coord, frozenset({"a"})).stages == (Stage("b", 0, 6),)
    with pytest.raises(DealError):
        merge_lost(coord, frozenset({"a", "b"}))


def test_the_planner_rule_deals_again_over_the_devices_left_keeping_the_host():
    model = lookup("smollm2-135m")
    gib = 1 << 30
    devices = [Device("h", lends_bytes=gib), Device("w1", lends_bytes=gib), Device("w2", lends_bytes=gib)]
    from planner.deal import deal
    first = deal(devices, model, DealOptions(host="h", split="memory"))
    rule = redeal_rule(devices, model, DealOptions(host="h", split="memory"))
    new = rule(first, frozenset({"w1"}))
    assert new.host == "h" and {s.device for s in new.stages} <= {"h", "w2"}
    assert sum(s.layers for s in new.stages) == 30 and new.stages[0].device == "h"
    mib = 1 << 20  # without w1, h (200 MiB) and w2 (1 MiB) cannot hold the ~425 MB of layers
    tiny = [Device("h", lends_bytes=200 * mib), Device("w1", lends_bytes=600 * mib), Device("w2", lends_bytes=mib)]
    with pytest.raises(DealError, match="cannot hold"):
        redeal_rule(tiny, model, DealOptions(host="h"))(deal(tiny, model, DealOptions(host="h")),
                                                         frozenset({"w1"}))


def run_until_emitted(h: Harness, n: int) -> None:
    while sum(isinstance(x, EmitToken) for x in h.log) < n:
        assert h.step(0)


def test_a_worker_lost_mid_answer_the_answer_goes_on_token_for_token():
    prompt, max_new = 5, 6
    h = Harness(DEAL, CFG, redeal=redeal_rule([], lookup("smollm2-135m"), DealOptions()))
    h.ask(0, "h", prompt, max_new)
    h.ask(1, "g", 3, 2)  # waits in the queue while question 0 is answered and recovered
    run_until_emitted(h, 3)
    h.lose("w1")
    redeals = [x for x in h.log if isinstance(x, Redeal)]
    # by hand: w1's layers 2-4 go to h (the stage before it); 5 prompt + 3 answer tokens replay
    assert redeals == [Redeal("w1", "h", (("h", 0, 4), ("w2", 4, 6)), redeals[0].first_lap, 0, 8)]
    assert deal_of(redeals[0]).stages == (Stage("h", 0, 4), Stage("w2", 4, 6))
    h.run()
    assert h.ended() == {0: "answered", 1: "answered"}
    assert h.answers() == {0: [truth(prompt + i) for i in range(max_new)], 1: [truth(3), truth(4)]}
    first = redeals[0].first_lap
    replay = [(c.device, c.first_pos, c.tokens) for c in h.log
              if isinstance(c, RunStage) and c.lap_id >= first and c.question_id == 0 and c.first_pos < 8]
    # chunks of 4: [0, 4) and [4, 8) through h then w2, and nothing through w1
    assert sorted(replay) == [("h", 0, 4), ("h", 4, 4), ("w2", 0, 4), ("w2", 4, 4)]
    assert {x.kind for x in h.laps() if x.lap_id >= first and x.question_id == 0 and not x.stale} \
        >= {LapKind.REPLAY}
    assert not any(isinstance(c, (RunStage, SendFrame)) and "w1" in (getattr(c, "device", None),
                                                                     getattr(c, "dst", None))
                   for c in h.log[h.log.index(redeals[0]):])


def test_frames_of_laps_before_the_redeal_are_dropped_by_the_new_chain():
    chain = Chain(DEAL, CFG, redeal=lambda d, lost: merge_lost(d, lost))
    chain.handle(QuestionAsked(0, "h", (7, 8), 3), 0.0)
    cmds = chain.handle(DeviceLost("w1"), 0.0)
    r = next(c for c in cmds if isinstance(c, Redeal))
    assert r.first_lap == 1 and r.replay_tokens == 2 and set(chain.workers) == {"w2"}
    old = FrameHeader(FrameKind.PREFILL, 0, 0, 0, 2, 4, returns=True)
    out = chain.handle(FrameArrived("w2", "w1", old), 0.0)
    assert len(out) == 1 and isinstance(out[0], DropFrame)
    assert chain.handle(ChainReady(r.first_lap + 5), 0.0) == []  # not this re-deal's
    replay = chain.handle(ChainReady(r.first_lap), 0.0)
    assert replay[-1] == RunStage("h", r.first_lap + 1, 0, 0, 2, (7, 8))  # the re-deal keeps lap 1 for itself


def test_without_a_rule_or_when_the_host_is_lost_the_room_ends_with_reasons():
    h = Harness(DEAL, CFG)
    h.ask(0, "h", 4, 5)
    run_until_emitted(h, 1)
    h.lose("w2")
    h.run()
    assert h.ended()[0].startswith("refused: w2 left the room")
    h2 = Harness(pinned("c", ("a", 0, 3), ("b", 3, 6)), CFG, redeal=lambda d, lost: merge_lost(d, lost))
    h2.ask(0, "g", 4, 5)
    h2.lose("a")
    h2.lose("b")  # nothing of the chain is left
    h2.run()
    assert h2.ended()[0].startswith("refused: b left the room and the others cannot take its layers")
    refusals = [x for x in h2.log if isinstance(x, Refuse)]
    assert len(refusals) == 1


# --- a re-deal must fit what the devices left lend --------------------------------

GiB = 2**30


def gib_model(layers: int = 15):
    from planner.model import ModelSpec
    return ModelSpec(id="g", name="g", layers=layers, hidden=4, layer_bytes=GiB, layer_active_bytes=GiB,
                     layer_flops_per_token=0.0, kv_bytes_per_token=0)


def test_a_merged_re_deal_that_puts_a_device_over_what_it_lends_is_refused():
    # a (host) 1-5, b 6-10, c 11-15, 1 GiB a layer; b lends 6 GiB. Losing c merges 11-15
    # into b: 10 GiB in 6 -> refused, naming b. Losing b merges 6-10 into a: 10 GiB in
    # the 10 it lends -> fine. c keeps its range when b is lost, so it is not checked.
    devices = [Device(id="a", kind="computer", lends_bytes=10 * GiB), Device(id="b", kind="computer",
               lends_bytes=6 * GiB), Device(id="c", kind="computer", lends_bytes=1 * GiB)]
    opts = DealOptions()
    rule = redeal_rule(devices, gib_model(), opts)
    current = pinned("a", ("a", 0, 5), ("b", 5, 10), ("c", 10, 15))
    with pytest.raises(DealError, match=r"b would hold layers 6-15 \(10 GiB\) in the 6 GiB it may use"):
        rule(current, frozenset({"c"}))
    assert rule(current, frozenset({"b"})).stages == (Stage("a", 0, 10), Stage("c", 10, 15))


def test_the_real_hosts_rule_checks_the_same_when_given_what_each_lends():
    from runtime.control import NodeConfig
    cfg = NodeConfig(device="a", host="a", stages=[["a", 0, 5], ["b", 5, 10], ["c", 10, 15]],
                     scheduler={"hidden": 4}, model_dir="/nowhere",
                     usable_bytes={"a": 10 * GiB, "b": 6 * GiB, "c": GiB}, layer_bytes=[GiB] * 15)
    rule = cfg.redeal_rule()
    with pytest.raises(DealError, match="b would hold layers 6-15"):
        rule(cfg.deal(), frozenset({"c"}))
    assert [(s.device, s.start, s.end) for s in rule(cfg.deal(), frozenset({"b"})).stages] == [("a", 0, 10),
                                                                                                 ("c", 10, 15)]


def test_a_second_loss_after_the_room_stopped_keeps_the_reason_it_stopped_for():
    # a (host) 1-5, b 6-10, c 11-15, 1 GiB a layer; b lends 6 GiB, so losing c stops the
    # room (b cannot take 11-15). When b is lost afterwards the room stays stopped for
    # that first reason: "b left; the model must be re-dealt" would hide why it cannot
    # recover (a served room kept saying so after both its workers were killed).
    devices = [Device(id="a", kind="computer", lends_bytes=10 * GiB), Device(id="b", kind="computer",
               lends_bytes=6 * GiB), Device(id="c", kind="computer", lends_bytes=1 * GiB)]
    rule = redeal_rule(devices, gib_model(), DealOptions())
    h = Harness(pinned("a", ("a", 0, 5), ("b", 5, 10), ("c", 10, 15)), CFG, redeal=rule)
    h.ask(0, "a", 4, 5)
    h.lose("c")
    first = h.host.stopped
    assert first.startswith("c left the room and the others cannot take its layers") and "b would hold" in first
    h.lose("b")
    h.run()
    assert h.host.stopped == first
    assert h.ended()[0] == "refused: " + first
    h.ask(1, "a", 4, 5)
    h.run()
    assert h.ended()[1] == "refused: " + first


def test_merge_lost_is_a_pinned_deal_of_the_same_host_that_says_who_left():
    current = Deal(host="h", split="speed", stages=DEAL.stages, guests=("g",), fits=False, notes=("dealt",))
    new = merge_lost(current, frozenset({"w2", "w1"}))
    assert new == Deal(host="h", split="pinned", stages=(Stage("h", 0, 6),), guests=(), fits=False,
                       notes=("re-dealt after w1, w2 left: their layers went to their neighbours",))
    assert merge_lost(DEAL, frozenset({"w1"})).fits is True
    with pytest.raises(DealError) as e:
        merge_lost(DEAL, frozenset({"h", "w1", "w2"}))
    assert str(e.value) == "no device of the chain is left"


def test_check_lent_counts_the_hosts_extras_and_names_every_device_over():
    from planner.chain import check_lent
    # 1 GiB a layer. a (host) holds layer 1 plus 1 GiB of extras: 2 GiB in the 1.5 it may
    # use; b holds layers 2-4: 3 GiB in 2. Both are named, in chain order.
    new = pinned("a", ("a", 0, 1), ("b", 1, 4))
    usable = {"a": GiB + GiB // 2, "b": 2 * GiB}
    with pytest.raises(DealError) as e:
        check_lent(new, usable, [GiB] * 4, host_extra_bytes=GiB)
    assert str(e.value) == ("the devices left cannot hold the model: a would hold layers 1 (2 GiB) in the 1.5 GiB "
                            "it may use; b would hold layers 2-4 (3 GiB) in the 2 GiB it may use")
    # without extras (the default) a's 1 GiB fits in exactly 1 GiB; b alone is named
    with pytest.raises(DealError) as e:
        check_lent(new, {"a": GiB, "b": 2 * GiB}, [GiB] * 4)
    assert str(e.value) == "the devices left cannot hold the model: b would hold layers 2-4 (3 GiB) in the 2 GiB it may use"


def test_a_pinned_re_deal_sizes_each_layers_kv_at_the_rooms_kv_cache():
    from planner.model import ModelSpec
    # 4 layers of 1 GiB with 1 KiB of f16 KV per token: at 65,536 tokens of f32 KV (twice
    # f16) a layer needs 1 GiB + 128 MiB. Losing b gives a all four: 4.5 GiB in the
    # 4 GiB + 320 MiB it lends, over; at f16 it would be 4.25 GiB and fit.
    model = ModelSpec(id="k", name="k", layers=4, hidden=4, layer_bytes=GiB, layer_active_bytes=GiB,
                      layer_flops_per_token=0.0, kv_bytes_per_token=1024)
    devices = [Device(id="a", lends_bytes=4 * GiB + 320 * 2**20), Device(id="b", lends_bytes=4 * GiB)]
    opts = DealOptions(context_tokens=65536, kv_cache="f32")
    with pytest.raises(DealError, match=r"a would hold layers 1-4 \(4\.5 GiB\)"):
        redeal_rule(devices, model, opts)(pinned("a", ("a", 0, 2), ("b", 2, 4)), frozenset({"b"}))


def test_a_re_deal_that_cannot_hold_the_model_says_why_with_the_new_deals_notes():
    # h (the host, kept) and w2 are left with 2 + 1 GiB for 6 layers of 1 GiB.
    devices = [Device("h", lends_bytes=2 * GiB), Device("w1", lends_bytes=8 * GiB), Device("w2", lends_bytes=GiB)]
    first = Deal(host="h", split="memory", stages=DEAL.stages, guests=(), fits=True, notes=())
    with pytest.raises(DealError) as e:
        redeal_rule(devices, gib_model(6), DealOptions(split="memory"))(first, frozenset({"w1"}))
    msg = str(e.value)
    assert msg.startswith("the devices left cannot hold the model: h hosts: forced by the scenario; ")
    assert msg.endswith("; the room cannot hold the model in what it lends: some devices are over")


def test_the_new_chain_of_a_redeal_keeps_its_host():
    from planner.protocol import Redeal
    d = deal_of(Redeal(lost="w1", host="h", stages=(("h", 0, 4), ("w2", 4, 6)), first_lap=3))
    assert (d.host, d.split, d.stages) == ("h", "pinned", (Stage("h", 0, 4), Stage("w2", 4, 6)))


def test_a_scenarios_re_deal_rule_deals_over_the_devices_it_is_given():
    from planner.chain import redeal_rule_for
    from planner.deal import deal_for
    from splitroom.scenario import load
    scn = load("scenarios/home.yaml")  # its deal needs all three devices (the scenario's comment)
    first = deal_for(scn)
    assert redeal_rule_for(scn)(first, frozenset()).fits
    two = [d for d in scn.devices if d.id != "phone"]
    with pytest.raises(DealError, match="the devices left cannot hold the model"):
        redeal_rule_for(scn, two)(first, frozenset())


def test_relink_neighbours_by_hand():
    """The other ends of the links a lap crosses to or from the device dealt back, in the
    lap's order, the host left out; the same for either return path (neighbours in the chain)."""
    from planner.chain import relink_neighbours
    assert relink_neighbours("h", ["w1", "w2", "w3"], "w1") == ["w2"]  # h -> w1 -> w2: the host is left out
    assert relink_neighbours("h", ["w1", "w2", "w3"], "w3") == ["w2"]  # w3 -> h: left out
    assert relink_neighbours("h", ["w1", "w2", "w3"], "w2", "via_stages") == ["w1", "w3"]
    assert relink_neighbours("h", ["h", "w1", "w2"], "w1") == ["w2"]  # the host holding the first stage
    assert relink_neighbours("h", ["w1", "w2"], "w9") == []  # not in the chain


def test_gained_ranges_of_an_empty_new_range_is_nothing():
    from planner.chain import gained_ranges
    assert gained_ranges(None, (3, 3)) == ()
    assert gained_ranges((0, 5), (3, 3)) == ()
    assert gained_ranges((0, 5), (2, 8)) == ((5, 8),)  # layers 6-8 gained (1-based)


def test_after_a_redeal_the_room_times_each_device_over_the_layers_it_holds_now():
    # h 1-2, w1 3-4, w2 5-6; w1 is lost and its layers go to h (h 1-4, w2 5-6). The rejoin
    # rule makes the chain tell its speeds each lap; a decode lap of the new chain that took
    # 10 ms at w2 and 8 ms at h is 5 ms a layer at w2 (2 layers) and 2 ms at h (4 layers).
    from planner.hops import StageTimed
    from planner.protocol import Computed
    h = Harness(DEAL, SchedulerConfig(hidden=4, prefill_chunk=2), redeal=merge_lost,
                rejoin=lambda current, lost, measured: None)
    h.ask(0, "h", 4, 8)
    run_until_emitted(h, 2)
    h.lose("w1")
    h.run()
    (r,) = [x for x in h.log if isinstance(x, Redeal)]
    decode = [c.lap_id for c in h.log
              if isinstance(c, RunStage) and c.device == "h" and c.tokens == 1 and c.lap_id >= r.first_lap]
    assert decode
    for lap in decode:
        h.chain.speeds.timed(StageTimed("w2", lap, 0.010))
        h.chain.speeds.computed(Computed("h", "RunStage", lap, 0.008))
    assert h.chain.speeds.measured().s_per_layer == pytest.approx({"w2": 0.005, "h": 0.002})


def test_what_the_chain_does_not_run_is_recorded_with_its_reason_and_detail():
    from planner.protocol import Ignored
    one = Chain(DEAL, CFG, runs={"w2"})
    assert one.handle(QuestionAsked(0, "h", (7,), 3), 0.0) == []
    h = FrameHeader(FrameKind.PREFILL, 0, 0, 0, 1, 4, returns=True)
    assert one.handle(FrameArrived("w1", "h", h), 0.0) == []
    # a RESULT frame at a worker is a kind it never takes: its own record, in the chain's list
    res = FrameHeader(FrameKind.RESULT, 0, 0, 0, 1, 4, returns=True)
    assert one.handle(FrameArrived("w2", "w1", res), 0.0) == []
    assert one.take_ignored() == [
        Ignored("h", "QuestionAsked", "not_here", "the model host is not run here"),
        Ignored("w1", "FrameArrived", "not_here", "w1 is not run here"),
        Ignored("w2", "FrameArrived", "bug", "a RESULT frame at a worker (lap 0)")]
    # a chain that runs every device holds no w9: a device it no longer holds, stale
    every = Chain(DEAL, CFG)
    assert every.handle(FrameArrived("w9", "h", h), 0.0) == []
    assert every.take_ignored() == [Ignored("w9", "FrameArrived", "stale", "w9 is not run here")]
    with pytest.raises(ValueError) as e:
        Chain(DEAL, CFG, runs={"y", "x"})
    assert str(e.value) == "x, y is neither the host nor a worker of this deal"
