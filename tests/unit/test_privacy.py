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
    plain = p["plain_tokens_per_s"]
    assert p["change_pct"] == pytest.approx(100 * (p["tokens_per_s"] - plain) / plain)
    # the plain deal: b hosts (lends the most; a lends less than half as much) and holds
    # all 30 layers alone, no hop. Ends-local must send the middle to a and back: two
    # 3 ms hops (2 ms half-RTT + 1 ms overhead) a lap, so it is slower.
    plan = json.loads(r.output)["plan"]
    assert [s["device"] for s in plan["stages"]] == ["b", "a", "b" + TAIL_SUFFIX]
    assert p["change_pct"] < 0


def test_simulate_bad_ends_exit_2(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(json.dumps({**SCN, "privacy": {"ends_local": {"first": 20, "last": 10}}}))
    r = CliRunner().invoke(app, ["simulate", str(f), "--no-progress"])
    assert r.exit_code == 2 and "no middle" in r.output and "Traceback" not in r.output
