"""Ends-local privacy in the simulator (issue 12): the host keeps the embedding, its
first N and last M layers and the head; the middle goes round the room. Expected ranges
are worked out by hand beside each assertion.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.deal import DealError
from planner.model import ModelSpec
from planner.privacy import TAIL_SUFFIX, ends_local
from planner.protocol import EmitToken
from planner.room import DealOptions, Device, LinkSpec, Network
from sim.driver import Simulation
from splitroom.cli import app
from splitroom.privacy_run import ends_local_scenario
from splitroom.scenario import from_mapping

GiB = 2**30


def toy(layers: int = 40) -> ModelSpec:
    return ModelSpec(id="toy", name="toy", layers=layers, hidden=64, layer_bytes=GiB, layer_active_bytes=GiB,
                     layer_flops_per_token=0.0, kv_bytes_per_token=0, residual_bytes_per_token=128)


def test_host_keeps_both_ends_and_the_middle_goes_round():
    # host (forced) lends 30 GiB, b 30 GiB, c 20 GiB. first 3, last 2: host holds 1-3 and
    # 39-40 (its virtual tail); the 35 middle layers go to b first (lends the most, holds
    # 30: layers 4-33), c takes the other 5 (34-38).
    room = [Device("host", lends_bytes=30 * GiB), Device("b", lends_bytes=30 * GiB),
            Device("c", lends_bytes=20 * GiB)]
    net = Network(rtt_s=2e-3, links=(LinkSpec(between=("host", "c"), rtt_s=9e-3),))
    devs, net2, d = ends_local(room, toy(), DealOptions(host="host"), net, 3, 2)
    tail = "host" + TAIL_SUFFIX
    assert [(s.device, s.start, s.end) for s in d.stages] == [
        ("host", 0, 3), ("b", 3, 33), ("c", 33, 38), (tail, 38, 40)]
    assert d.host == "host" and d.fits
    assert {x.id for x in devs} == {"host", "b", "c", tail}
    # the tail shares the host's links: c -> host.tail is the c-host override
    assert any(set(link.between) == {"c", tail} and link.rtt_s == 9e-3 for link in net2.links)
    assert any(set(link.between) == {"host", tail} and link.rtt_s == 0.0 for link in net2.links)


def test_host_memory_counts_both_ranges():
    # host lends 4 GiB: first 2 + last 2 = 4 GiB of layers fits (no headroom), 3 + 2 does not.
    room = [Device("host", lends_bytes=4 * GiB), Device("b", lends_bytes=100 * GiB)]
    assert ends_local(room, toy(), DealOptions(host="host"), Network(), 2, 2)[2].fits
    assert not ends_local(room, toy(), DealOptions(host="host"), Network(), 3, 2)[2].fits


@pytest.mark.parametrize("first, last, msg", [(0, 2, "first and last"), (20, 20, "no middle"), (2, 0, "first and last")])
def test_bad_ends_are_deal_errors(first, last, msg):
    room = [Device("host", lends_bytes=40 * GiB), Device("b", lends_bytes=40 * GiB)]
    with pytest.raises(DealError, match=msg):
        ends_local(room, toy(), DealOptions(), Network(), first, last)


def test_alone_is_a_deal_error():
    with pytest.raises(DealError, match="no device besides the host"):
        ends_local([Device("host", lends_bytes=40 * GiB)], toy(), DealOptions(), Network(), 1, 1)


SCN = {"model": "smollm2-135m", "context": 512, "seed": 3,
       "devices": [{"id": "a", "lends": "300 MB", "memory_bandwidth": "100 GB/s"},
                   {"id": "b", "lends": "1 GB", "memory_bandwidth": "50 GB/s"}],
       "network": {"rtt": "4 ms", "hop_overhead": "1 ms"},
       "workload": {"questions": 2, "prompt_tokens": 20, "answer_tokens": 24}}


def test_simulated_tokens_are_the_same_as_without_it():
    plain = from_mapping(json.loads(json.dumps(SCN)))
    priv = from_mapping({**json.loads(json.dumps(SCN)), "privacy": {"ends_local": {"first": 2, "last": 3}}})
    from planner.deal import deal
    r0 = Simulation(plain, deal(plain.devices, plain.model, plain.options)).run()
    s1, d1 = ends_local_scenario(priv)
    r1 = Simulation(s1, d1).run()

    def tokens(r):
        return [(o.question_id, o.index, o.token) for _, o in r.trace if isinstance(o, EmitToken)]
    assert tokens(r1) == tokens(r0) and len(tokens(r0)) == 2 * 24
    # the last layers ran on the host's tail, the first on the host
    assert d1.stages[0].device == d1.host and d1.stages[-1].device == d1.host + TAIL_SUFFIX


def test_simulate_json_reports_the_price_of_privacy(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(json.dumps({**SCN, "privacy": {"ends_local": {"first": 2, "last": 3}}}))
    r = CliRunner().invoke(app, ["simulate", str(f), "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)["privacy"]
    assert p["ends_local"] == {"first": 2, "last": 3}
    # By hand (SmolLM2-135M float32: a layer 4 B x 3,540,096 = 14,160,384 B, the tied head
    # 4 B x 49152 x 576 = 113,246,208 B; a lap reads each once; sampling 0.1 ms):
    # the plain deal: b hosts (lends the most; a lends less than half as much) and holds
    # all 30 layers alone, no hop: 30 x 14.16 MB / 50 GB/s = 8.496 ms + head 2.265 ms
    # + 0.1 ms = 10.861 ms a lap, 92.07 tok/s.
    # Ends-local: b keeps layers 1-2 and 28-30 (5 x 0.2832 = 1.416 ms) and the head
    # (2.365 ms); a runs 3-27 at 100 GB/s (25 x 0.1416 = 3.540 ms); two hops a lap, b -> a
    # and a -> b's tail, each 2 ms half-RTT + 1 ms overhead + (32 + 2304) B at 125 MB/s
    # = 3.0187 ms: 13.358 ms a lap, 74.86 tok/s, a change of 10.861 / 13.358 - 1 = -18.69 %.
    # KV reads (768 B a token a layer, a context under 50 tokens: under 0.02 ms a lap,
    # 0.15 %) are left out of the hand figure, hence rel=1e-2.
    layer, head = 4 * 3_540_096, 4 * 49152 * 576
    plain_ms = (30 * layer + head) / 50e9 * 1e3 + 0.1
    hop_ms = 2 + 1 + (32 + 576 * 4) / 125e6 * 1e3
    private_ms = (5 * layer + head) / 50e9 * 1e3 + 0.1 + 25 * layer / 100e9 * 1e3 + 2 * hop_ms
    assert (round(plain_ms, 3), round(private_ms, 3)) == (10.861, 13.358)
    plan = json.loads(r.output)["plan"]
    assert [(s["device"], s["start"], s["end"]) for s in plan["stages"]] == [
        ("b", 0, 2), ("a", 2, 27), ("b" + TAIL_SUFFIX, 27, 30)]
    assert p["plain_tokens_per_s"] == pytest.approx(1e3 / plain_ms, rel=1e-2)
    assert p["tokens_per_s"] == pytest.approx(1e3 / private_ms, rel=1e-2)
    assert p["change_pct"] == pytest.approx(100 * (plain_ms / private_ms - 1), rel=1e-2)


def test_simulate_bad_ends_exit_2(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(json.dumps({**SCN, "privacy": {"ends_local": {"first": 20, "last": 10}}}))
    r = CliRunner().invoke(app, ["simulate", str(f), "--no-progress"])
    assert r.exit_code == 2 and "no middle" in r.output and "Traceback" not in r.output
