"""``split: optimal`` is never predicted slower than the product page's deals (issue 12).

For random rooms of up to 8 devices, whenever the ``speed`` or ``memory`` deal fits
in what every device lends, it is one of the deals the exact search ranges over, so
the optimal deal's lap (by the same lap model) can only be shorter or equal.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.deal import DealError, deal
from planner.lapcost import LapCost
from planner.model import ModelSpec
from planner.room import DealOptions, Device, LinkSpec, Network

GiB = 2**30
FAST = settings(max_examples=int(os.environ.get("SPLITROOM_OPTIMAL_EXAMPLES", "60")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@st.composite
def rooms(draw):
    n = draw(st.integers(1, 8))
    layers = draw(st.integers(1, 40))
    devs = [Device(f"d{i}", kind=draw(st.sampled_from(["computer", "computer", "phone"])),
                   lends_bytes=draw(st.integers(0, 30)) * GiB,
                   s_per_layer=draw(st.one_of(st.none(), st.sampled_from([0.5e-3, 1e-3, 2e-3, 5e-3]))),
                   memory_bandwidth_Bps=draw(st.sampled_from([None, 50e9, 200e9, 800e9])))
            for i in range(n)]
    links = tuple(LinkSpec(between=(a.id, b.id), rtt_s=draw(st.floats(0, 0.05)),
                           hop_overhead_s=draw(st.floats(0, 0.005)))
                  for i, a in enumerate(devs) for b in devs[i + 1:] if draw(st.booleans()))
    net = Network(rtt_s=draw(st.floats(0, 0.02)), hop_overhead_s=draw(st.floats(0, 0.004)), links=links)
    model = ModelSpec(id="p", name="p", layers=layers, hidden=64, layer_bytes=GiB, layer_active_bytes=GiB,
                      layer_flops_per_token=0.0, kv_bytes_per_token=0, embedding_bytes=draw(st.sampled_from([0, GiB])),
                      residual_bytes_per_token=128)
    return devs, net, model, draw(st.sampled_from(["direct", "via_stages"]))


@FAST
@given(rooms())
def test_optimal_is_never_slower_than_the_rules(room):
    devs, net, model, rp = room
    opts = DealOptions(headroom=0.05)
    try:
        best = deal(devs, model, DealOptions(headroom=0.05, split="optimal"), net, rp)
    except DealError:
        best = None
    cost = LapCost(devs, model, net, rp)
    for split in ("speed", "memory"):
        try:
            d = deal(devs, model, DealOptions(headroom=opts.headroom, split=split))
        except DealError:
            continue
        if not d.fits:
            continue
        assert best is not None, f"{split} fits but optimal found nothing"
        lap = cost.lap_s(d.host, [(s.device, s.start, s.end) for s in d.stages])
        assert best.predicted["lap_s"] <= lap + 1e-12, (split, d.stages, best.stages)
    if best is not None:
        assert best.fits
        assert best.stages[0].device == best.host and best.stages[-1].end == model.layers
