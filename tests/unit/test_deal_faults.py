"""Faults of the product page's deal found in issue 12, each pinned as a test.

Expected values come from the issue's text and from hand calculation (shown beside
each assertion), never from running the planner first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.deal import DealError, deal, pick_host
from planner.model import ModelSpec, lookup
from planner.room import DealOptions, Device
from splitroom.cli import app
from splitroom.scenario import ScenarioError, from_mapping

GB = 10**9
GiB = 2**30
MiB = 2**20


def toy(layers: int = 40, layer_bytes: int = GiB, kv: int = 0, sizes: tuple[int, ...] = (),
        extra: int = 0) -> ModelSpec:
    return ModelSpec(id="toy", name="toy", layers=layers, hidden=64, layer_bytes=layer_bytes,
                     layer_active_bytes=layer_bytes, layer_flops_per_token=0.0, kv_bytes_per_token=kv,
                     embedding_bytes=extra, layer_sizes=sizes)


# --- 1. a slow device that lends more memory hosts ------------------------------------

def test_slow_big_device_no_longer_hosts_measured_ms():
    # Issue 12: fast lends 1 GB at 1 ms per layer, slow lends 2 GB at 5 ms per layer.
    # No copy speed given: estimated from ms per layer, fast is 5x >= 1.5x and lends
    # exactly half (>= half): fast hosts, and holds all 30 SmolLM2 layers
    # (30 x 14.2 MB + 113 MB embedding = 540 MB < 1 GB), so slow only asks.
    room = [Device("fast", lends_bytes=1 * GB, s_per_layer=1e-3),
            Device("slow", lends_bytes=2 * GB, s_per_layer=5e-3)]
    d = deal(room, lookup("smollm2-135m"), DealOptions(context_tokens=2048))
    assert d.host == "fast"
    assert [(s.device, s.start, s.end) for s in d.stages] == [("fast", 0, 30)]
    assert d.guests == ("slow",)


def test_slow_big_device_no_longer_hosts_bandwidth():
    # Same room with 800 vs 50 GB/s and no measurement: 16x, fast hosts.
    room = [Device("fast", lends_bytes=1 * GB, memory_bandwidth_Bps=800e9),
            Device("slow", lends_bytes=2 * GB, memory_bandwidth_Bps=50e9)]
    assert pick_host(room)[0] == "fast"


@pytest.mark.parametrize("fast_bw, fast_lends, hosts", [
    (150e9, 50, "fast"),    # exactly 1.5x and half: the page's thresholds, on bandwidth
    (149e9, 50, "big"),     # under 1.5x
    (300e9, 49, "big"),     # under half the memory
])
def test_bandwidth_estimate_uses_the_page_thresholds(fast_bw, fast_lends, hosts):
    room = [Device("big", lends_bytes=100 * GiB, memory_bandwidth_Bps=100e9),
            Device("fast", lends_bytes=fast_lends * GiB, memory_bandwidth_Bps=fast_bw)]
    assert pick_host(room)[0] == hosts


def test_measured_copy_speed_wins_over_the_estimate():
    # Both measured copies say "big" is as fast; bandwidths would say otherwise.
    room = [Device("big", lends_bytes=100 * GiB, copy_speed_Bps=200e9, memory_bandwidth_Bps=100e9),
            Device("fast", lends_bytes=60 * GiB, copy_speed_Bps=200e9, memory_bandwidth_Bps=800e9)]
    assert pick_host(room)[0] == "big"


def test_notes_do_not_say_asks_only_and_keeps_one_layer():
    # Forcing the slow device as host: the notes say it keeps one layer, never that it
    # "asks only" (the contradiction the issue quotes).
    room = [Device("fast", lends_bytes=1 * GB, s_per_layer=1e-3),
            Device("slow", lends_bytes=2 * GB, s_per_layer=5e-3)]
    d = deal(room, lookup("smollm2-135m"), DealOptions(context_tokens=2048, host="slow"))
    assert [(s.device, s.layers) for s in d.stages] == [("slow", 1), ("fast", 29)]
    assert not any(n.startswith("slow asks only") for n in d.notes)
    assert any("slow keeps one layer" in n for n in d.notes)


# --- 2. zero capacity ---------------------------------------------------------------

@pytest.mark.parametrize("zero", [dict(compute_flops=0.0), dict(s_per_layer=0.0),
                                  dict(memory_bandwidth_Bps=0.0)])
def test_zero_capacity_device_gets_no_layers_and_never_hosts(zero):
    # "z" lends the most (it would be the memory pick) but cannot compute.
    room = [Device("z", lends_bytes=100 * GiB, **zero), Device("a", lends_bytes=50 * GiB)]
    d = deal(room, toy())
    assert d.host == "a"
    assert [(s.device, s.start, s.end) for s in d.stages] == [("a", 0, 40)]
    assert d.guests == ("z",)


def test_nobody_with_capacity_is_a_deal_error_naming_everyone():
    room = [Device("z", lends_bytes=100 * GiB, compute_flops=0.0), Device("y", lends_bytes=9 * GiB,
                                                                          s_per_layer=0.0)]
    with pytest.raises(DealError) as e:
        deal(room, toy())
    msg = str(e.value)
    assert "no device can compute" in msg and "z: compute 0" in msg and "y: ms_per_layer 0" in msg


def test_forced_zero_capacity_host_is_a_deal_error():
    room = [Device("z", lends_bytes=100 * GiB, compute_flops=0.0), Device("a", lends_bytes=50 * GiB)]
    with pytest.raises(DealError, match="cannot compute"):
        deal(room, toy(), DealOptions(host="z"))


@pytest.mark.parametrize("key, value", [("compute", "0 TFLOPS"), ("ms_per_layer", "0 ms")])
def test_simulate_zero_capacity_exits_2_without_traceback(tmp_path, key, value):
    scn = {"model": "smollm2-135m", "context": 512,
           "devices": [{"id": "a", "lends": "1 GB", key: value}],
           "workload": {"questions": 1, "prompt_tokens": 8, "answer_tokens": 4}}
    f = tmp_path / "zero.yaml"
    f.write_text(json.dumps(scn))
    r = CliRunner().invoke(app, ["simulate", str(f), "--no-progress"])
    assert r.exit_code == 2
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit)
    assert "zero.yaml" in r.output and key in r.output


# --- 3. headroom ---------------------------------------------------------------------

def test_a_share_equal_to_the_lend_does_not_fit_with_headroom():
    # 380 GB of layers on a device lending exactly 380 GB: fits only without headroom.
    m = toy(layers=38, layer_bytes=10 * GB)
    room = [Device("a", lends_bytes=380 * GB)]
    assert deal(room, m, DealOptions(headroom=0.0)).fits
    d = deal(room, m, DealOptions(headroom=0.05))
    assert not d.fits
    assert any("headroom" in n for n in d.notes)


def test_headroom_sets_what_a_device_holds():
    # 100 GiB less 5% = 95 GiB -> 95 layers of 1 GiB; the rest goes to b.
    room = [Device("a", lends_bytes=100 * GiB), Device("b", lends_bytes=100 * GiB)]
    d = deal(room, toy(layers=120), DealOptions(headroom=0.05))
    assert [(s.device, s.layers) for s in d.stages] == [("a", 95), ("b", 25)]
    assert d.fits


def test_scenario_default_headroom_is_5_percent():
    s = from_mapping({"devices": [{"id": "a", "lends": "4 GB"}]})
    assert s.options.headroom == 0.05
    s = from_mapping({"headroom": 0, "devices": [{"id": "a", "lends": "4 GB"}]})
    assert s.options.headroom == 0.0
    with pytest.raises(ScenarioError, match="headroom"):
        from_mapping({"headroom": 1.5, "devices": [{"id": "a", "lends": "4 GB"}]})


# --- 4. per-layer sizes --------------------------------------------------------------

def test_layers_of_different_sizes_are_dealt_by_bytes():
    # 8 layers: the first two weigh 4 GiB, the rest 1 GiB (14 GiB in all). a (host,
    # lends the most: 10 GiB) holds 4 + 4 + 1 + 1 = 10 GiB = 4 layers; b (9 GiB) the
    # other 4 (4 GiB). By the mean size (1.75 GiB) a would "hold" 5 layers (11 GiB).
    sizes = (4 * GiB, 4 * GiB) + (1 * GiB,) * 6
    m = toy(layers=8, layer_bytes=-(-sum(sizes) // 8), sizes=sizes)
    room = [Device("a", lends_bytes=10 * GiB), Device("b", lends_bytes=9 * GiB)]
    d = deal(room, m)
    assert [(s.device, s.start, s.end) for s in d.stages] == [("a", 0, 4), ("b", 4, 8)]
    assert [sh.used_bytes for sh in d.shares] == [10 * GiB, 4 * GiB]
    assert d.fits


def test_big_first_layers_need_the_bigger_device_first():
    # Layer 1 weighs 6 GiB, the other 9 weigh 1 GiB. "small" lends 5 GiB and cannot hold
    # layer 1 at all; forced as host it must still keep layer 1 and is over; the memory
    # pick (big, 20 GiB) holds all 15 GiB.
    sizes = (6 * GiB,) + (1 * GiB,) * 9
    m = toy(layers=10, layer_bytes=-(-sum(sizes) // 10), sizes=sizes)
    room = [Device("big", lends_bytes=20 * GiB), Device("small", lends_bytes=5 * GiB)]
    d = deal(room, m)
    assert [(s.device, s.start, s.end) for s in d.stages] == [("big", 0, 10)]
    # forced: small keeps layer 1 (6 GiB > 5 GiB: over), big takes 2-10.
    d = deal(room, m, DealOptions(host="small"))
    assert [(s.device, s.start, s.end) for s in d.stages] == [("small", 0, 1), ("big", 1, 10)]
    assert not d.fits


def test_scenario_layer_bytes_list():
    s = from_mapping({"model": {"name": "uneven", "layers": 3, "hidden": 8,
                                "layer_bytes": ["3 GiB", "1 GiB", "1 GiB"]},
                      "devices": [{"id": "a", "lends": "10 GiB"}]})
    assert s.model.layer_sizes == (3 * GiB, GiB, GiB)
    assert s.model.weight_bytes(0, 3) == 5 * GiB
    with pytest.raises(ScenarioError, match="layer_bytes"):
        from_mapping({"model": {"name": "uneven", "layers": 3, "hidden": 8, "layer_bytes": ["3 GiB"]},
                      "devices": [{"id": "a", "lends": "10 GiB"}]})


# --- 5. max context per stage and for the room -------------------------------------------

def test_max_context_per_stage_and_room():
    # 1 GiB layers, 1 MiB of KV per token per layer, host extras 2 GiB, no headroom.
    # At context 1024 a layer is 1 GiB + 1 GiB of KV = 2 GiB: a holds (20-2)/2 = 9, b 10.
    # Max context: a: (20 - 2 - 9) GiB / (9 MiB per token) = 1024 tokens;
    #              b: (22 - 10) GiB / (10 MiB per token) = 1228.8 -> 1228.
    m = toy(layers=19, kv=MiB, extra=2 * GiB)
    room = [Device("a", lends_bytes=20 * GiB), Device("b", lends_bytes=22 * GiB)]
    d = deal(room, m, DealOptions(context_tokens=1024, host="a"))
    assert [(s.device, s.layers) for s in d.stages] == [("a", 9), ("b", 10)]
    ctx = {sh.device: sh.max_context for sh in d.shares}
    assert ctx == {"a": 1024, "b": 1228}
    assert d.max_context == 1024
    j = d.to_json()
    assert j["max_context"] == 1024
    assert [s["max_context"] for s in j["stages"]] == [1024, 1228]
    # q8 halves the KV per token: b: 12 GiB / 5 MiB = 2457.6 -> 2457.
    d8 = deal(room, m, DealOptions(context_tokens=1024, host="a", kv_cache="q8"))
    b = next(sh for sh in d8.shares if sh.device == "b")
    assert b.max_context == (22 * GiB - b.layers * GiB) * 2 // (b.layers * MiB)


def test_plan_json_and_table_report_max_context():
    root = Path(__file__).resolve().parents[2]
    r = CliRunner().invoke(app, ["plan", str(root / "scenarios" / "gb10_m5.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)
    assert j["max_context"] == min(s["max_context"] for s in j["stages"])
    assert j["max_context"] >= 8192  # the scenario's context fits
    r = CliRunner().invoke(app, ["plan", str(root / "scenarios" / "gb10_m5.yaml")])
    assert "max context" in r.output and "at most" in r.output


@pytest.mark.parametrize("devices, want", [
    # issue 12: "--set host=fast predicts 26.25" (measured 1 ms / 5 ms per layer)
    ([{"id": "fast", "lends": "1 GB", "ms_per_layer": "1 ms"},
      {"id": "slow", "lends": "2 GB", "ms_per_layer": "5 ms"}], 26.25),
    # issue 12: "With bandwidths instead (800 vs 50 GB/s) ... 92 vs 1,294 tok/s"
    ([{"id": "fast", "lends": "1 GB", "memory_bandwidth": "800 GB/s"},
      {"id": "slow", "lends": "2 GB", "memory_bandwidth": "50 GB/s"}], 1294),
])
def test_the_issue_rooms_now_predict_the_fast_host_rates(tmp_path, devices, want):
    scn = {"model": "smollm2-135m", "context": 2048, "devices": devices,
           "network": {"rtt": "1 ms", "hop_overhead": "5 ms"},
           "workload": {"questions": 1, "prompt_tokens": 32, "answer_tokens": 64}}
    f = tmp_path / "fs.yaml"
    f.write_text(json.dumps(scn))
    r = CliRunner().invoke(app, ["simulate", str(f), "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)
    assert j["plan"]["host"] == "fast"
    assert j["metrics"]["tokens_per_s"] == pytest.approx(want, rel=0.005)
