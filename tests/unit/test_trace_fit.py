"""planner.trace_fit on a trace written by hand: every figure below is worked out in
the comments from the records, not read back from the code."""

from __future__ import annotations

import pytest

from planner.deal import Deal
from planner.frames import FrameHeader, FrameKind
from planner.protocol import (BeginAnswer, Computed, Draft, DraftReady, EmitToken, FrameArrived, LapEnded, LapKind,
                              RunHead, RunStage, SendFrame)
from planner.trace_fit import calibrated_scenario, fit_trace
from splitroom.scenario import load

HIDDEN = 576
DEAL = Deal.pinned("laptop", [("laptop", 0, 10), ("desktop", 10, 30)])  # 10 and 20 layers


def _hdr(kind, lap, tokens=1):
    return FrameHeader(kind, 0, lap, 8, tokens, HIDDEN)


def _trace():
    tr = [(0.0, BeginAnswer(0, "laptop", 8))]
    # lap 1: the prompt's one chunk of 8 positions (prefill: only chunk_s_per_layer counts it)
    tr += [(0.01, RunStage("laptop", 1, 0, 0, 8)), (0.09, Computed("laptop", "RunStage", 1, 0.08)),
           (0.09, SendFrame("laptop", "desktop", _hdr(FrameKind.PREFILL, 1, 8))),
           (0.10, FrameArrived("desktop", "laptop", _hdr(FrameKind.PREFILL, 1, 8))),
           (0.10, RunStage("desktop", 1, 0, 0, 8)), (0.30, Computed("desktop", "RunStage", 1, 0.2)),
           (0.31, RunHead(1, 0, 1)), (0.32, Computed("laptop", "RunHead", 1, 0.05)),
           (0.32, LapEnded(1, 0, LapKind.PREFILL, 0, 1, False))]
    # laps 2-4: one decode position each; laptop 10/12/20 ms, desktop 30/50/40 ms,
    # hops 4/6/11 ms, head 2/3/4 ms for one row
    t = 1.0
    for lap, (sa, sb, hop, head) in zip((2, 3, 4), ((0.010, 0.030, 0.004, 0.002), (0.012, 0.050, 0.006, 0.003),
                                                    (0.020, 0.040, 0.011, 0.004))):
        tr += [(t, RunStage("laptop", lap, 0, 8 + lap, 1)), (t + sa, Computed("laptop", "RunStage", lap, sa)),
               (t + sa, SendFrame("laptop", "desktop", _hdr(FrameKind.DECODE, lap))),
               (t + sa + hop, FrameArrived("desktop", "laptop", _hdr(FrameKind.DECODE, lap))),
               (t + sa + hop, RunStage("desktop", lap, 0, 8 + lap, 1)),
               (t + sa + hop + sb, Computed("desktop", "RunStage", lap, sb)),
               (t + 0.5, RunHead(lap, 0, 1)), (t + 0.5 + head, Computed("laptop", "RunHead", lap, head))]
        t += 1.0
    # the answer so far: 5 6 7 9 (answer indices 0-3 at positions 8-11)
    tr += [(5.0 + i / 10, EmitToken(0, "laptop", i, tok)) for i, tok in enumerate((5, 6, 7, 9))]
    # draft 7 assumes 6 at position 9 (right) and proposes 7 8 1: 7 is kept at 10, 8 != 9 at 11 -> 1
    # draft 8 assumes 4 at position 9 (wrong: 6 was kept): not counted
    # draft 9 never came back: not counted
    tr += [(6.0, Draft(7, 0, 9, (6,), 3)), (6.01, DraftReady(7, (7, 8, 1))), (6.01, Computed("laptop", "Draft", 7, 0.006)),
           (6.1, Draft(8, 0, 9, (4,), 2)), (6.11, DraftReady(8, (1, 2))), (6.11, Computed("laptop", "Draft", 8, 0.004)),
           (6.2, Draft(9, 0, 11, (), 4))]
    return tr


def test_the_fit_of_a_hand_written_trace():
    fit = fit_trace(_trace(), DEAL)
    # medians of 10/12/20 ms over 10 layers and of 30/50/40 ms over 20 layers
    assert fit["s_per_layer"] == pytest.approx({"laptop": 0.0012, "desktop": 0.002})
    assert fit["lap_tokens"] == 1
    # the prefill chunk of 8: 80 ms / 10 layers and 200 ms / 20 layers
    assert fit["chunk_s_per_layer"]["laptop"] == pytest.approx((8, 0.008))
    assert fit["chunk_s_per_layer"]["desktop"] == pytest.approx((8, 0.01))
    assert fit["stage_s_each"]["laptop"] == pytest.approx([0.010, 0.012, 0.020])
    assert fit["stage_s_each"]["desktop"] == pytest.approx([0.030, 0.050, 0.040])
    # decode hops only (the prefill frame's 10 ms is not one): mean of 4, 6, 11 ms, median 6 ms
    assert fit["hops"] == 3
    assert fit["hop_s"] == pytest.approx(0.007)
    assert fit["hop_p50_s"] == pytest.approx(0.006)
    # the head of decode laps (the prefill lap's 50 ms left out): median of 2, 3, 4 ms a row
    assert fit["head_s_per_row"] == pytest.approx(0.003)
    # 6 + 4 ms drafting 3 + 2 tokens
    assert fit["draft_s_per_token"] == pytest.approx(0.002)
    assert fit["accepted"] == [1]


def test_a_trace_with_no_decode_gives_no_figures_rather_than_zeros_that_look_measured():
    fit = fit_trace([(0.0, BeginAnswer(0, "laptop", 8))], DEAL)
    assert fit["s_per_layer"] == {} and fit["hops"] == 0 and fit["head_s_per_row"] is None
    assert fit["draft_s_per_token"] is None and fit["accepted"] == [] and fit["lap_tokens"] == 1


def test_the_calibrated_scenario_takes_the_measured_parts():
    scn = load("scenarios/home.yaml", ["decoding.speculative={drafter: ngram, draft_tokens: 3}"])
    fit = fit_trace(_trace(), DEAL)
    out = calibrated_scenario(scn, fit, rtt_s=0.004, prompt_tokens=8, answer_tokens=0, questions=3, window_bytes=11600)
    # hop overhead: the mean hop 7 ms less the one-way 2 ms
    assert out.network.hop_overhead_s == pytest.approx(0.005)
    assert out.network.rtt_s == 0.004 and out.network.window_bytes == 11600 and out.network.links == ()
    assert (out.workload.prompt_tokens, out.workload.answer_tokens, out.workload.questions) == (8, 1, 3)
    assert out.decoding.speculative.accepted_sequence == (1,)
    assert out.decoding.speculative.draft_s_per_token == pytest.approx(0.002)
    assert out.measured_head_s_per_row == pytest.approx(0.003)
    devs = {d.id: d for d in out.devices}
    assert devs["laptop"].s_per_layer == pytest.approx(0.0012) and not devs["laptop"].clocks_down
    # the knee: n0 = 8 positions * 1.2 ms / 8 ms = 1.2 (>= the lap's 1); compute puts the
    # roofline's knee there: n0 * flops per token * bandwidth / bytes
    m = scn.model
    bw = devs["laptop"].memory_bandwidth_Bps
    assert devs["laptop"].compute_flops == pytest.approx(1.2 * m.layer_flops_per_token * bw / m.layer_active_bytes)
    # the phone ran no stage here: its own figures stay, only clocking down is turned off
    phone = {d.id: d for d in scn.devices}["phone"]
    assert devs["phone"].s_per_layer == phone.s_per_layer and not devs["phone"].clocks_down
