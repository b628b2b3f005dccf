"""The lap-cost model and the simulator read a scenario's link overrides the same way
(planner.links.resolve_link): fields merge, the more specific and then the later win."""

from __future__ import annotations

import math

from planner.frames import HEADER_BYTES
from planner.lapcost import LapCost
from planner.model import lookup
from planner.room import Device, LinkSpec, Network
from planner.links import resolve_link
import sim.link

MODEL = lookup("smollm2-135m")
DEVICES = (Device(id="a", lends_bytes=1 << 30), Device(id="b", lends_bytes=1 << 30))


def test_two_undirected_overrides_of_one_pair_merge_and_the_later_wins():
    net = Network(rtt_s=0.010, bandwidth_Bps=1e9, hop_overhead_s=0.0,
                  links=(LinkSpec(between=("a", "b"), rtt_s=0.030),
                         LinkSpec(between=("b", "a"), rtt_s=0.050, hop_overhead_s=0.005)))
    frame = HEADER_BYTES + MODEL.residual_bytes_per_token
    by_hand = 0.050 / 2 + 0.005 + frame / 1e9  # rtt of the later override, its overhead, the room's bandwidth
    assert math.isclose(LapCost(DEVICES, MODEL, net).hop_s("a", "b"), by_hand, rel_tol=1e-12)
    spec = resolve_link(net, "a", "b")
    assert (spec.rtt_s, spec.hop_overhead_s, spec.bandwidth_Bps) == (0.050, 0.005, 1e9)
    assert sim.link.resolve_link is resolve_link  # the simulator's links are resolved by the same function


def test_a_directed_override_beats_an_undirected_one_in_both_models():
    net = Network(rtt_s=0.010, bandwidth_Bps=1e9,
                  links=(LinkSpec(between=("a", "b"), directed=True, rtt_s=0.100),
                         LinkSpec(between=("a", "b"), rtt_s=0.020)))
    frame = HEADER_BYTES + MODEL.residual_bytes_per_token
    cost = LapCost(DEVICES, MODEL, net)
    assert math.isclose(cost.hop_s("a", "b"), 0.100 / 2 + frame / 1e9, rel_tol=1e-12)
    assert math.isclose(cost.hop_s("b", "a"), 0.020 / 2 + frame / 1e9, rel_tol=1e-12)
