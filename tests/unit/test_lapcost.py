"""planner/lapcost.py's lap arithmetic on rooms small enough to work out by hand: layers
of different sizes, both return paths over links of different round trips, and its
refusals."""

from __future__ import annotations

import pytest

from planner.lapcost import SAMPLE_S, LapCost
from planner.model import ModelSpec
from planner.room import Device, LinkSpec, Network

GiB = 2**30


def model(layer_sizes=(), residual=0):
    sizes = tuple(layer_sizes)
    return ModelSpec(id="t", name="t", layers=len(sizes) or 4, hidden=8,
                     layer_bytes=-(-sum(sizes) // len(sizes)) if sizes else 2 * GiB, layer_active_bytes=GiB,
                     layer_flops_per_token=0.0, kv_bytes_per_token=0, embedding_bytes=GiB,
                     residual_bytes_per_token=residual, layer_sizes=sizes)


def test_a_stage_of_uneven_layers_costs_its_bytes_over_the_mean():
    # layers of 3, 1, 1 and 3 GiB: mean 2 GiB; measured 1 ms per (mean) layer. Layer 1
    # alone is 3/2 of a mean layer (1.5 ms); layers 2-3 are 2 GiB, one mean layer (1 ms);
    # layers 2-4 are 5 GiB (2.5 ms).
    c = LapCost([Device("d", lends_bytes=GiB, s_per_layer=1e-3)], model((3 * GiB, GiB, GiB, 3 * GiB)))
    assert c.stage_s("d", 0, 1) == pytest.approx(1.5e-3)
    assert c.stage_s("d", 1, 3) == pytest.approx(1.0e-3)
    assert c.stage_s("d", 1, 4) == pytest.approx(2.5e-3)


NET = Network(rtt_s=0.0, bandwidth_Bps=1e6, hop_overhead_s=0.0,
              links=(LinkSpec(between=("h", "a"), rtt_s=2e-3), LinkSpec(between=("a", "b"), rtt_s=4e-3),
                     LinkSpec(between=("b", "h"), rtt_s=10e-3),
                     LinkSpec(between=("b", "a"), directed=True, rtt_s=20e-3)))


@pytest.mark.parametrize("return_path,hops_ms", [
    # host h, then a, then b. A hop is half its link's round trip + a 32 B header at 1 MB/s
    # (0.032 ms; the residual is 0 B here); b -> a alone has a directed 20 ms round trip.
    # direct: h -> a (1 ms), a -> b (2 ms), b -> h (5 ms): 8 ms + 3 frames
    ("direct", 8 + 3 * 0.032),
    # via_stages: h -> a, a -> b, then back b -> a (10 ms) and a -> h (1 ms): 14 ms + 4 frames
    ("via_stages", 14 + 4 * 0.032)])
def test_the_return_path_sets_the_hops_of_a_lap(return_path, hops_ms):
    devs = [Device(x, lends_bytes=GiB, s_per_layer=1e-3) for x in ("h", "a", "b")]
    c = LapCost(devs, model(), NET, return_path)
    assert c.hops_s("h", ["a", "b"]) == pytest.approx(hops_ms * 1e-3)
    # the lap: h's head (the 1 GiB embedding read as a layer's 1 GiB of active weights
    # is, measured at 1 ms: 1 ms, + sampling) + 1 + 3 layers at 1 ms + the hops
    lap = c.lap_s("h", [("a", 0, 1), ("b", 1, 4)])
    assert lap == pytest.approx(1e-3 + SAMPLE_S + 4e-3 + hops_ms * 1e-3)
    # the host holding the first layers itself: no hop to itself, either way h -> a, a -> h
    assert c.hops_s("h", ["h", "a"]) == pytest.approx((1 + 1 + 2 * 0.032) * 1e-3)


@pytest.mark.parametrize("n", [0, -2])
def test_fewer_than_one_question_in_flight_is_refused_by_name(n):
    c = LapCost([Device("d", lends_bytes=GiB, s_per_layer=1e-3)], model())
    with pytest.raises(ValueError) as e:
        c.tokens_per_s_in_flight("d", [("d", 0, 4)], n)
    assert str(e.value) == f"in_flight must be >= 1, got {n}"


def test_the_head_of_a_device_measured_or_not():
    # the 1 GiB embedding (tied head) read at 50 GB/s: 21.47 ms + sampling, unmeasured
    devs = [Device("u", lends_bytes=GiB, memory_bandwidth_Bps=50e9)]
    assert LapCost(devs, model()).head_s("u") == pytest.approx(GiB / 50e9 + SAMPLE_S)
    # measured, on a model whose layers read nothing (no roofline to scale by): unscaled
    m = ModelSpec(id="z", name="z", layers=2, hidden=8, layer_bytes=0, layer_active_bytes=0,
                  layer_flops_per_token=0.0, kv_bytes_per_token=0, embedding_bytes=GiB, residual_bytes_per_token=0)
    devs = [Device("m", lends_bytes=GiB, memory_bandwidth_Bps=50e9, s_per_layer=1e-3)]
    assert LapCost(devs, m).head_s("m") == pytest.approx(GiB / 50e9 + SAMPLE_S)
