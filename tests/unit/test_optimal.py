"""``split: optimal`` against brute force over every host, ordered set and cut (issue 12).

The brute force and its lap formula are written here from the definition in
planner/lapcost.py's module doc (head + every stage's layers x its ms per layer + every
hop's RTT/2 + overhead + frame/bandwidth), not by calling the planner's cost model.
Devices are measured (``ms_per_layer``) and the model has no head bytes, so the head is
the constant sampling cost on every host.
"""

from __future__ import annotations

import itertools
import random

import pytest

from planner.deal import DealError, deal
from planner.model import ModelSpec
from planner.optimal import EXACT_MAX_DEVICES, optimal_deal
from planner.room import DealOptions, Device, LinkSpec, Network

GiB = 2**30
SAMPLE_S = 1e-4      # planner/lapcost.py SAMPLE_S (the sampling cost on the host)
FRAME = 32           # planner/frames.py header; residual_bytes_per_token = 0 below
BW = 1e9             # bytes/s on every link


def toy(layers: int) -> ModelSpec:
    return ModelSpec(id="toy", name="toy", layers=layers, hidden=8, layer_bytes=GiB, layer_active_bytes=GiB,
                     layer_flops_per_token=0.0, kv_bytes_per_token=0, residual_bytes_per_token=0)


def random_room(rng: random.Random, n: int, layers: int):
    """``n`` measured devices lending 1..layers GiB, random per-pair RTT and overhead
    (some pairs directed), and the hop table the brute force uses."""
    devs = [Device(f"d{i}", lends_bytes=rng.randint(1, layers) * GiB,
                   s_per_layer=rng.choice([0.5, 1, 2, 3, 5, 8]) * 1e-3) for i in range(n)]
    rtt0, over0 = rng.choice([1e-3, 5e-3, 20e-3]), rng.choice([0.0, 1e-3, 3.5e-3])
    hop = {(a.id, b.id): rtt0 / 2 + over0 + FRAME / BW for a in devs for b in devs if a is not b}
    links = []
    for a, b in itertools.combinations(devs, 2):
        r = rng.random()
        if r < 0.4:
            rtt, over = rng.uniform(0, 60e-3), rng.uniform(0, 5e-3)
            links.append(LinkSpec(between=(a.id, b.id), rtt_s=rtt, hop_overhead_s=over))
            hop[(a.id, b.id)] = hop[(b.id, a.id)] = rtt / 2 + over + FRAME / BW
        elif r < 0.6:
            rtt = rng.uniform(0, 60e-3)
            links.append(LinkSpec(between=(a.id, b.id), directed=True, rtt_s=rtt))
            hop[(a.id, b.id)] = rtt / 2 + over0 + FRAME / BW
    net = Network(rtt_s=rtt0, hop_overhead_s=over0, bandwidth_Bps=BW, links=tuple(links))
    return devs, net, hop


def best_cut(total: int, caps: list[int], s: list[float], spent: float, best: float) -> float:
    """The least ``spent + sum n_i s_i`` over every cut giving each device >= 1 layer and
    at most its cap, summing to ``total``; branches that cannot beat ``best`` (even with
    every remaining layer at the fastest remaining speed) are skipped."""
    if not caps:
        return spent if total == 0 else best
    if spent + total * min(s) >= best:
        return best
    for first in range(1, min(caps[0], total - (len(caps) - 1)) + 1):
        best = min(best, best_cut(total - first, caps[1:], s[1:], spent + first * s[0], best))
    return best


def brute_force(devs: list[Device], hop: dict, L: int, via: bool = False) -> float:
    """Least lap over every host, ordered set of other devices and cut. ``via``: the
    result returns back through every stage (each hop paid again in reverse)."""
    best = float("inf")
    s = {d.id: d.s_per_layer for d in devs}
    cap = {d.id: d.lends_bytes // GiB for d in devs}  # no extras, no KV, no headroom
    for h in devs:
        others = [d.id for d in devs if d is not h]
        for k in range(len(others) + 1):
            for order in itertools.permutations(others, k):
                chain = [h.id, *order]
                if via:
                    hops = sum(hop[(a, b)] + hop[(b, a)] for a, b in zip(chain, chain[1:]))
                else:
                    ring = chain + [h.id]
                    hops = sum(hop[(a, b)] for a, b in zip(ring, ring[1:]) if a != b)
                if SAMPLE_S + hops + L * min(s.values()) >= best:
                    continue
                best = best_cut(L, [cap[c] for c in chain], [s[c] for c in chain], SAMPLE_S + hops, best)
    return best


def lap_of(d, hop: dict, devs: list[Device], via: bool = False) -> float:
    s = {x.id: x.s_per_layer for x in devs}
    chain = [d.host] + [st.device for st in d.stages if st.device != d.host]
    if via:
        hops = sum(hop[(a, b)] + hop[(b, a)] for a, b in zip(chain, chain[1:]))
    else:
        ring = chain + [d.host]
        hops = sum(hop[(a, b)] for a, b in zip(ring, ring[1:]) if a != b)
    return SAMPLE_S + hops + sum(st.layers * s[st.device] for st in d.stages)


@pytest.mark.parametrize("via", [False, True], ids=["direct", "via_stages"])
@pytest.mark.parametrize("n, L, seeds", [(2, 24, 10), (3, 24, 10), (4, 24, 6), (5, 12, 6), (6, 8, 5),
                                         (5, 24, 5), (6, 24, 5)])
def test_optimal_matches_brute_force(n, L, seeds, via):
    rp = "via_stages" if via else "direct"
    for seed in range(seeds):
        rng = random.Random(1000 * n + L + seed)
        devs, net, hop = random_room(rng, n, L)
        if sum(d.lends_bytes for d in devs) < L * GiB:
            with pytest.raises(DealError):
                optimal_deal(devs, toy(L), DealOptions(), net, rp)
            continue
        want = brute_force(devs, hop, L, via)
        d = optimal_deal(devs, toy(L), DealOptions(), net, rp)
        got = lap_of(d, hop, devs, via)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (seed, d.stages)
        assert d.predicted["lap_s"] == pytest.approx(got, rel=1e-9)
        assert d.predicted["exact"] is True
        # a valid deal: contiguous, every layer once, each within what its device lends
        assert d.stages[0].device == d.host and d.stages[0].start == 0 and d.stages[-1].end == L
        assert all(a.end == b.start for a, b in zip(d.stages, d.stages[1:]))
        assert d.fits


def test_optimal_beats_speed_on_the_issue_room():
    # Issue 12's room: fast (1 GB, 1 ms/layer) and slow (2 GB, 5 ms/layer), SmolLM2-135M,
    # 1 ms RTT, 5 ms hop overhead. fast alone: 30 layers x 1 ms + head; a second
    # device would add 2 hops of 5.5 ms: fast hosts alone.
    from planner.model import lookup
    room = [Device("fast", lends_bytes=10**9, s_per_layer=1e-3), Device("slow", lends_bytes=2 * 10**9,
                                                                         s_per_layer=5e-3)]
    net = Network(rtt_s=1e-3, hop_overhead_s=5e-3)
    d = deal(room, lookup("smollm2-135m"), DealOptions(context_tokens=2048, split="optimal"), net)
    assert d.split == "optimal" and d.host == "fast" and [s.device for s in d.stages] == ["fast"]
    assert d.guests == ("slow",)
    assert any("slow asks only" in n for n in d.notes)
    assert any("vs split speed" in n for n in d.notes)
    # forced slow host: optimal still prefers one hop of slow's layer 1 over more
    d2 = deal(room, lookup("smollm2-135m"), DealOptions(context_tokens=2048, split="optimal", host="slow"), net)
    assert d2.host == "slow"


def test_optimal_leaves_out_a_far_device_and_orders_the_ring():
    # Three devices each holding 10 of 30 layers at 1 ms; b-c is slow (100 ms RTT)
    # one way round. The ring a -> c -> b -> a avoids b->c... both orders use the pair
    # {b, c} once, so make it directed: b->c 200 ms, c->b 1 ms.
    room = [Device(x, lends_bytes=10 * GiB, s_per_layer=1e-3) for x in "abc"]
    net = Network(rtt_s=2e-3, bandwidth_Bps=BW, links=(LinkSpec(between=("b", "c"), directed=True, rtt_s=0.2),
                                                       LinkSpec(between=("c", "b"), directed=True, rtt_s=0.001)))
    d = optimal_deal(room, toy(30), DealOptions(host="a"), net)
    assert [s.device for s in d.stages] == ["a", "c", "b"]


@pytest.mark.parametrize("rp", ["direct", "via_stages"])
def test_heuristic_beyond_exact_limit_reports_a_gap(rp):
    rng = random.Random(5)
    devs, net, hop = random_room(rng, EXACT_MAX_DEVICES + 2, 40)
    devs = [Device(d.id, lends_bytes=8 * GiB, s_per_layer=d.s_per_layer) for d in devs]
    d = optimal_deal(devs, toy(40), DealOptions(), net, rp)
    assert d.predicted["exact"] is False
    assert d.predicted["lap_s"] == pytest.approx(lap_of(d, hop, devs, rp == "via_stages"), rel=1e-9)
    assert d.predicted["bound_lap_s"] <= d.predicted["lap_s"] + 1e-12
    assert any("lower bound" in n for n in d.notes)
    assert d.stages[-1].end == 40


def test_uneven_layers_cut_by_bytes():
    # 6 layers: the first weighs 5 GiB, the rest 1 GiB (10 GiB). a lends 4 GiB and cannot
    # hold layer 1; b lends 6 GiB. The chain starts at the host, so b hosts with layers
    # 1-2 (6 GiB) and a takes 3-6 (4 GiB): the only deal that fits.
    sizes = (5 * GiB,) + (GiB,) * 5
    m = ModelSpec(id="u", name="u", layers=6, hidden=8, layer_bytes=-(-sum(sizes) // 6),
                  layer_active_bytes=GiB, layer_flops_per_token=0.0, kv_bytes_per_token=0, layer_sizes=sizes)
    room = [Device("a", lends_bytes=4 * GiB, s_per_layer=1e-3), Device("b", lends_bytes=6 * GiB, s_per_layer=1e-3)]
    d = optimal_deal(room, m, DealOptions(), Network())
    assert [(s.device, s.start, s.end) for s in d.stages] == [("b", 0, 2), ("a", 2, 6)]
    assert d.fits


def test_plan_optimal_json_says_why_and_how_much_faster(tmp_path):
    # The issue's room with slow forced... not forced: the speed deal's host is now
    # fast too; pin a slower speed deal by making the rules pick slow (no measurements
    # to compare: copy speeds equal) while slow runs 5 ms per layer.
    import json as _json

    from typer.testing import CliRunner

    from splitroom.cli import app
    scn = {"model": "smollm2-135m", "context": 2048, "split": "optimal",
           "devices": [{"id": "fast", "lends": "1 GB", "ms_per_layer": "1 ms", "copy_speed": "100 GB/s"},
                       {"id": "slow", "lends": "2 GB", "ms_per_layer": "5 ms", "copy_speed": "100 GB/s"}],
           "network": {"rtt": "1 ms", "hop_overhead": "5 ms"}}
    f = tmp_path / "fs.yaml"
    f.write_text(_json.dumps(scn))
    r = CliRunner().invoke(app, ["plan", str(f), "--json"])
    assert r.exit_code == 0, r.output
    j = _json.loads(r.output)
    assert j["split"] == "optimal" and j["host"] == "fast" and j["stages"] == [
        {"device": "fast", "start": 0, "end": 30, "max_context": j["stages"][0]["max_context"]}]
    # By hand, from SmolLM2-135M's architecture (30 layers, hidden 576, 9 query and 3 KV
    # heads of 64, ffn 1536, vocab 49152, tied, float32):
    #   one layer = 4 B x (2 x 576 x 576 + 2 x 576 x 192 + 3 x 576 x 1536 + 2 x 576)
    #             = 14,160,384 B; the head (the tied embedding) = 4 B x 49152 x 576
    #             = 113,246,208 B = 7.9974 layers.
    # A measured device's head costs what its 7.9974 layers would (the roofline scaled by
    # measured/roofline) + 0.1 ms of sampling: fast 8.097 ms, slow 40.087 ms.
    # A hop: 0.5 ms (half the RTT) + 5 ms overhead + a 32 B header and 576 x 4 B residual
    # at the default 125 MB/s (0.0187 ms) = 5.5187 ms.
    # speed deal: slow hosts (memory pick, equal copy speeds) and keeps layer 1, fast
    # takes 2-30: lap = 40.087 + 5 + 29 x 1 + 2 x 5.5187 = 85.124 ms (11.75 tok/s).
    # optimal: fast alone: 8.097 + 30 x 1 = 38.097 ms. Speed-up 85.124 / 38.097 = 2.234.
    layer_b = 4 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576)
    head_layers = 4 * 49152 * 576 / layer_b
    hop_ms = 0.5 + 5 + (32 + 576 * 4) / 125e6 * 1e3
    optimal_ms = head_layers * 1 + 0.1 + 30 * 1
    speed_ms = head_layers * 5 + 0.1 + 1 * 5 + 29 * 1 + 2 * hop_ms
    assert (layer_b, round(optimal_ms, 3), round(speed_ms, 3)) == (14_160_384, 38.097, 85.124)
    p = j["predicted"]
    assert p["lap_s"] * 1e3 == pytest.approx(optimal_ms, rel=1e-9)
    assert p["speed_tokens_per_s"] == pytest.approx(1e3 / speed_ms, rel=1e-9)
    assert p["speedup_vs_speed"] == pytest.approx(speed_ms / optimal_ms, rel=1e-9)
    assert any("vs split speed (slow hosts" in n for n in j["notes"])


# --- the network and return path reach the optimal search through every caller ---------
# a, b, c each lend 10 GiB (10 of the toy's 30 layers of 1 GiB) at 1 ms a layer, so every
# deal needs all three with 10 layers each and only the ring order differs. Every link is
# 2 ms RTT (a 1 ms hop) but for one directed link of 200 ms RTT (a 100 ms hop):
# - FAR_BA (b -> a slow), return direct: ring a -> b -> c -> a pays 1 + 1 + 1 ms of hops,
#   a -> c -> b -> a pays 1 + 1 + 100 ms: the chain is a, b, c.
# - FAR_CA (c -> a slow), return via_stages (each hop paid there and back): chain a, b, c
#   pays a-b and b-c both ways, 4 x 1 ms; a, c, b pays a -> c -> a, 1 + 100 ms, and c-b
#   both ways: the chain is a, b, c. Returned directly it would be a, c, b (its ring
#   a -> c -> b -> a avoids c -> a).
ABC = [Device(x, lends_bytes=10 * GiB, s_per_layer=1e-3) for x in "abc"]
FAR_BA = Network(rtt_s=2e-3, bandwidth_Bps=BW, links=(LinkSpec(between=("b", "a"), directed=True, rtt_s=0.2),))
FAR_CA = Network(rtt_s=2e-3, bandwidth_Bps=BW, links=(LinkSpec(between=("c", "a"), directed=True, rtt_s=0.2),))
OPTIMAL_A = DealOptions(split="optimal", host="a")


def chain_of(d) -> list[str]:
    return [s.device for s in d.stages]


def test_deal_searches_against_the_network_and_return_path_it_is_given():
    from planner.deal import deal_one
    for make in (deal, deal_one):
        assert chain_of(make(ABC, toy(30), OPTIMAL_A, FAR_BA)) == ["a", "b", "c"]
        assert chain_of(make(ABC, toy(30), OPTIMAL_A, FAR_BA, "direct")) == ["a", "b", "c"]
        assert chain_of(make(ABC, toy(30), OPTIMAL_A, FAR_CA)) == ["a", "c", "b"]
        assert chain_of(make(ABC, toy(30), OPTIMAL_A, FAR_CA, "via_stages")) == ["a", "b", "c"]
    d = deal(ABC, toy(30), OPTIMAL_A, FAR_CA, "via_stages")
    # via_stages: 4 hops of 1 ms (+ a 32 B header at 1 GB/s each), 30 layers x 1 ms, sampling
    assert d.predicted["lap_s"] == pytest.approx(SAMPLE_S + 4 * (1e-3 + FRAME / BW) + 30e-3, rel=1e-9)


def test_a_re_deal_searches_against_the_rooms_network_and_return_path():
    from planner.chain import redeal_rule, redeal_rule_for
    from planner.room import Decoding, Scenario
    four = ABC + [Device("d", lends_bytes=10 * GiB, s_per_layer=1e-3)]
    first = deal(four, toy(30), OPTIMAL_A, FAR_BA)
    lost = frozenset({"d"})
    assert chain_of(redeal_rule(four, toy(30), OPTIMAL_A, FAR_BA)(first, lost)) == ["a", "b", "c"]
    assert chain_of(redeal_rule(four, toy(30), OPTIMAL_A, FAR_CA)(first, lost)) == ["a", "c", "b"]
    assert chain_of(redeal_rule(four, toy(30), OPTIMAL_A, FAR_CA, "via_stages")(first, lost)) == ["a", "b", "c"]
    for net, rp in ((FAR_BA, "direct"), (FAR_CA, "via_stages")):
        scn = Scenario(name="ring", seed=0, model=toy(30), devices=tuple(four), options=OPTIMAL_A, network=net,
                       decoding=Decoding(return_path=rp))
        assert chain_of(redeal_rule_for(scn)(first, lost)) == ["a", "b", "c"]


def test_a_rejoin_searches_against_the_rooms_network_and_return_path():
    # The ring above with c back in the room (nothing lost now), every device timed at
    # 1 ms a layer, every hop timed at 1 ms but c -> a at 100 ms (FAR_CA as measured).
    # - direct: the search deals a, c, b (ring a -> c -> b -> a: 3 ms of hops + 30 ms);
    #   a room running a, b, c pays a -> b -> c -> a, 1 + 1 + 100 ms + 30 ms = 132 ms:
    #   4x slower, so the rule takes a, c, b.
    # - via_stages: the search deals a, b, c (a-b and b-c both ways: 4 ms + 30 ms); a room
    #   running a, c, b pays a -> c -> b -> c -> a, 1 + 1 + 1 + 100 + 30 = 133 ms: it takes a, b, c.
    from planner.chain import rejoin_rule
    from planner.deal import Deal
    from planner.hops import Measured
    hops = {(x, y): 1e-3 for x in "abc" for y in "abc" if x != y} | {("c", "a"): 0.100}
    measured = Measured({x: 1e-3 for x in "abc"}, None, hops)
    abc = Deal.pinned("a", (("a", 0, 10), ("b", 10, 20), ("c", 20, 30)))
    acb = Deal.pinned("a", (("a", 0, 10), ("c", 10, 20), ("b", 20, 30)))
    for rp, running, taken in (("direct", abc, ["a", "c", "b"]), ("via_stages", acb, ["a", "b", "c"])):
        first = deal(ABC, toy(30), OPTIMAL_A, FAR_CA, rp)
        new = rejoin_rule(ABC, toy(30), first, OPTIMAL_A, FAR_CA, rp)(running, frozenset(), measured)
        assert new is not None and chain_of(new) == taken
