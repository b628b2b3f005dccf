"""Scenario keys for the rooms people run: a room that does not fit, offload, a device's
engine efficiency and overheads. Each expected number is worked out by hand beside it.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from planner.deal import deal
from planner.fit import RoomDoesNotFit, check_fits, offload_bytes
from sim.devices import device_model
from splitroom.cli import app
from splitroom.scenario import ScenarioError, from_mapping

MiB = 1024 ** 2

#: four layers of exactly 100 MiB, no KV, no embedding or head: what a device holds is
#: a count of 100 MiB blocks, and a decode pass reads 100 MiB a layer
ROOM = """\
name: tight
model: {name: blocks, layers: 4, hidden: 64, layer_bytes: 100 MiB}
headroom: 0
network: {rtt: 0 ms}
workload: {prompt_tokens: 4, answer_tokens: 8}
devices:
  - {id: a, lends: 150 MiB, memory_bandwidth: 100 GiB/s, compute: 1000 TFLOPS}
  - {id: b, lends: 150 MiB, memory_bandwidth: 100 GiB/s, compute: 1000 TFLOPS}
"""


def scenario(text: str = ROOM, sets: list[str] = ()):
    import yaml
    return from_mapping(yaml.safe_load(text), "room.yaml", list(sets))


def simulate_cli(tmp_path, text: str, *args: str):
    f = tmp_path / "room.yaml"
    f.write_text(text)
    return CliRunner().invoke(app, ["simulate", str(f), "--no-progress", "--json", *args])


# --- a room that does not fit -------------------------------------------------------

def test_room_that_does_not_fit_is_exit_2_with_each_shortfall(tmp_path):
    # each device holds 1 layer (150 // 100); the speed deal spreads the 2 left over by
    # memory (equal lends: one each), so a and b hold 2 layers = 200 MiB of 150 MiB: short 50 MiB
    r = simulate_cli(tmp_path, ROOM)
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert "\n" not in err and "Traceback" not in r.output
    assert err.startswith("error: ") and "room.yaml: the room does not fit: " in err
    assert "a needs 200 MiB of 150 MiB (what it lends), short 50 MiB" in err
    assert "b needs 200 MiB of 150 MiB (what it lends), short 50 MiB" in err
    assert "offload" in err


def test_shortfall_counts_the_headroom():
    # headroom 0.2 of 150 MiB: ceil(31,457,280) bytes = 30 MiB kept free, 120 MiB usable;
    # each holds 1 layer, 2 each after the spread: 200 - 120 = 80 MiB short
    scn = scenario(sets=["headroom=0.2"])
    d = deal(scn.devices, scn.model, scn.options)
    with pytest.raises(RoomDoesNotFit) as e:
        check_fits(d, scn.devices, scn.model, scn.options)
    assert "a needs 200 MiB of 120 MiB (lends 150 MiB less 20% headroom), short 80 MiB" in str(e.value)


def test_a_room_that_fits_passes(tmp_path):
    r = simulate_cli(tmp_path, ROOM.replace("lends: 150 MiB", "lends: 200 MiB"))
    assert r.exit_code == 0, r.output


def test_sweep_marks_a_combination_that_does_not_fit(tmp_path):
    import json
    f = tmp_path / "room.yaml"
    f.write_text(ROOM)
    r = CliRunner().invoke(app, ["sweep", str(f), "--vary", "devices[0].lends=150 MiB,200 MiB",
                                 "--set", "devices[1].lends=200 MiB", "--json", "--jobs", "1"])
    assert r.exit_code == 0, r.output
    rows = {row["values"][0][1]: row for row in json.loads(r.stdout)["rows"]}
    # a at 150 MiB holds 1 layer, b 2: 3 of 4, the last spread to a (150/350 of it, the larger
    # remainder is b's 200/350: b) -- either way one device is over; at 200 MiB both hold 2
    assert "does not fit" in rows["150 MiB"]["error"]
    assert rows["200 MiB"]["error"] is None


# --- offload: the explicit opt-in, modelled -----------------------------------------

def test_offload_opt_in_is_modelled_by_hand():
    scn = scenario(sets=["devices[0].offload={bandwidth: 1 GiB/s}", "devices[1].offload={bandwidth: 1 GiB/s}"])
    d = deal(scn.devices, scn.model, scn.options)
    check_fits(d, scn.devices, scn.model, scn.options)  # opted in: no error
    assert offload_bytes(d, scn.devices, scn.model, scn.options) == {"a": 50 * MiB, "b": 50 * MiB}
    dm = device_model(scn.device("b"), scn, d)
    # a decode pass of b's 2 layers: 2 x 100 MiB / 100 GiB/s = 1/512 s = 1.953 ms resident,
    # plus the 50 MiB offloaded / 1 GiB/s = 1/20.48 s = 48.83 ms
    want = 2 * 100 / (100 * 1024) + 50 / 1024
    assert dm.run_s(2, 1, 0, 0.0, True) == pytest.approx(want, rel=1e-12)
    assert dm.stage_timer(2)(1, 0, 0.0, True) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(0.05078, abs=1e-5)


def test_offload_cannot_hold_more_than_the_weights():
    # 1 MiB lent: 2 layers = 200 MiB, short 199 MiB; the weights (200 MiB) cover it: fine.
    # A KV cache of 1 MiB per token at context 100 = 100 MiB a layer on top: short 399 MiB,
    # more than the 200 MiB of weights it may offload -> an error naming it
    text = ROOM.replace("layer_bytes: 100 MiB}", "layer_bytes: 100 MiB, kv_bytes_per_token: 1 MiB}")
    scn = scenario(text, ["context=100", "devices[1].lends=1 MiB", "devices[1].offload={bandwidth: 1 GiB/s}",
                          "devices[0].lends=1000 MiB", "stages=[{device: a, layers: '1-2'}, {device: b, layers: '3-4'}]"])
    d = deal(scn.devices, scn.model, scn.options)
    with pytest.raises(RoomDoesNotFit) as e:
        check_fits(d, scn.devices, scn.model, scn.options)
    assert "b needs 400 MiB of 1 MiB (what it lends), short 399 MiB, more than its layers' weights (200 MiB)" \
        in str(e.value)


def test_simulated_offload_room_runs_at_the_offload_rate(tmp_path):
    import json
    r = simulate_cli(tmp_path, ROOM, "--set", "devices[0].offload={bandwidth: 1 GiB/s}",
                     "--set", "devices[1].offload={bandwidth: 1 GiB/s}")
    assert r.exit_code == 0, r.output
    lap = json.loads(r.stdout)["metrics"]["lap_s"]["mean"]
    # a decode lap: two stages of 50.78 ms each (above), rtt 0, head/sampling microseconds
    assert lap == pytest.approx(2 * (2 * 100 / (100 * 1024) + 50 / 1024), rel=0.01)


# --- a device's efficiency and overheads ---------------------------------------------

def test_efficiency_and_overheads_by_hand():
    scn = scenario(ROOM.replace("lends: 150 MiB", "lends: 400 MiB"),
                   ["devices[1].efficiency=0.5", "devices[1].overhead={pass: 1 ms, layer: 100 us}",
                    "stages=[{device: a, layers: '1-2'}, {device: b, layers: '3-4'}]"])
    d = deal(scn.devices, scn.model, scn.options)
    dm = device_model(scn.device("b"), scn, d)
    # 2 x 100 MiB / 100 GiB/s = 1.953 ms, over 0.5 = 3.906 ms, + 1 ms + 2 x 0.1 ms = 5.106 ms
    want = 2 * 100 / (100 * 1024) / 0.5 + 1e-3 + 2 * 1e-4
    assert dm.run_s(2, 1, 0, 0.0, True) == pytest.approx(want, rel=1e-12)
    assert dm.stage_timer(2)(1, 0, 0.0, True) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(5.106e-3, abs=1e-6)


def test_own_efficiency_replaces_the_presets():
    # llama.cpp-metal's preset is 0.555; the device's own 0.25 wins, the preset's overheads stay (0)
    scn = scenario(ROOM.replace("lends: 150 MiB", "lends: 400 MiB"),
                   ["devices[0].engine=llama.cpp-metal", "devices[1].engine=llama.cpp-metal",
                    "devices[1].efficiency=0.25"])
    d = deal(scn.devices, scn.model, scn.options)
    assert device_model(scn.device("a"), scn, d).efficiency == 0.555
    assert device_model(scn.device("b"), scn, d).efficiency == 0.25


@pytest.mark.parametrize("sets, parts", [
    (["devices[0].efficiency=0"], ["devices[0].efficiency", "greater than 0"]),
    (["devices[0].efficiency=1.5"], ["devices[0].efficiency", "less than or equal to 1"]),
    (["devices[0].overhead={pass: 5}"], ["devices[0].overhead.pass", "expected a time", "got 5"]),
    (["devices[0].overhead={layer: -1 ms}"], ["devices[0].overhead.layer", "not negative"]),
    (["devices[0].overhead={launch: 1 ms}"], ["devices[0].overhead.launch", "unknown key"]),
    (["devices[0].offload={bandwidth: 0 GB/s}"], ["devices[0].offload.bandwidth", "more than 0"]),
    (["devices[0].offload={}"], ["devices[0].offload.bandwidth", "missing"]),
])
def test_bad_values_are_one_line(sets, parts):
    with pytest.raises(ScenarioError) as e:
        scenario(sets=sets)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("room.yaml: ")
    for p in parts:
        assert p in msg, (p, msg)


# --- engine presets: each efficiency from its cited single-device figure ------------

GiB = 1024 ** 3


@pytest.mark.parametrize("name, bytes_per_token, tokens_per_s, bandwidth_Bps", [
    ("llama.cpp-metal", 6.67 * GiB, 62.05, 800e9),        # llama.cpp PR #2917, M2 Ultra, 7B Q8_0
    ("llama.cpp-cuda", 4.33 * GiB, 155.02, 936e9),        # llama.cpp PR #15802, RTX 3090, 8B Q4_0
    ("vllm", 8.03e9 * 2, 75.0, 1555e9),                   # vLLM 0.23, A100 40GB, Llama-3.1-8B BF16
    ("hf-eager", 6.74e9 * 2, 1 / 0.03289, 936e9),         # bitsandbytes #347, RTX 3090, 7B fp16
    ("bnb-int8", 6.74e9, 1 / 0.15455, 936e9),             # bitsandbytes #347, RTX 3090, 7B int8
    ("mlx", 70.6e9 * 2, 4.7, 800e9),                      # mlx-examples #1069, M2 Ultra, 70B 16-bit
    ("webgpu-browser", 6.74e9 * 4.5 / 8 * 0.8, 204.8, 1008e9),  # 80% of MLC-LLM on an RTX 4090
])
def test_preset_efficiency_is_its_cited_benchmark(name, bytes_per_token, tokens_per_s, bandwidth_Bps):
    from sim.engines import ENGINES
    e = ENGINES[name]
    assert e.efficiency == pytest.approx(bytes_per_token * tokens_per_s / bandwidth_Bps, abs=6e-4)
    assert e.source and e.name == name


def test_nf4_preset_from_its_ratio():
    from sim.engines import ENGINES
    # fp16 at hf-eager's efficiency; NF4 reads 4.5/16 of the bytes in 48.6/36.5 of the time
    assert ENGINES["bnb-nf4"].efficiency == pytest.approx(0.438 * 4.5 / 16 * 36.5 / 48.6, abs=2e-4)


def test_every_preset_is_a_scenario_choice():
    from sim.engines import ENGINES
    for name in ENGINES:
        scn = scenario(sets=[f"devices[0].engine={name}"])
        assert scn.devices[0].engine == name
    with pytest.raises(ScenarioError) as e:
        scenario(sets=["devices[0].engine=tensorrt-magic"])
    assert "devices[0].engine" in str(e.value) and "llama.cpp-cuda" in str(e.value)


# --- mixture of experts by architecture -------------------------------------------

MOE = """\
model: {name: tiny-moe, layers: 2, hidden: 1024, heads: 8, kv_heads: 8, head_dim: 128, vocab: 1000,
        experts: 8, active_experts: 2, shared_experts: 1, expert_ffn: 512, dtype: f16}
devices:
  - {id: a, lends: 1 GiB, memory_bandwidth: 100 GB/s, compute: 1000 TFLOPS}
"""


def test_moe_sizes_come_from_the_architecture():
    from sim.devices import DeviceModel
    scn = scenario(MOE)
    m = scn.model
    # attention 1024x8x128 x2 (q, o) + 1024x8x128 x2 (k, v) = 4,194,304; norms 2,048;
    # router 1024x8 = 8,192; one expert 3x1024x512 = 1,572,864; shared = one expert
    expert = 3 * 1024 * 512
    base = 4_194_304 + 2_048 + 8_192 + expert  # attention, norms, router, shared expert
    assert m.layer_bytes == (base + 8 * expert) * 2 == 36_720_640
    assert m.layer_active_bytes == (base + 2 * expert) * 2 == 17_846_272
    assert (m.experts, m.active_experts, m.expert_bytes) == (8, 2, expert * 2)
    dm = DeviceModel(scn.devices[0], m)
    assert dm.stage_s(2, 1) == pytest.approx(2 * 17_846_272 / 100e9, rel=1e-12)
    # a 4-token chunk touches 8 x (1 - (6/8)^4) = 5.46875 experts: 3.46875 more than one token
    assert dm.layer_bytes_read(4) == pytest.approx(17_846_272 + 3.46875 * 3_145_728, rel=1e-12)


@pytest.mark.parametrize("model, parts", [
    ("{name: m, layers: 2, hidden: 64, heads: 2, vocab: 10, experts: 8, active_experts: 2}",
     ["model", "experts, active_experts and expert_ffn"]),
    ("{name: m, layers: 2, hidden: 64, heads: 2, vocab: 10, experts: 4, active_experts: 8, expert_ffn: 32}",
     ["model", "active_experts (8) is more than experts (4)"]),
    ("{name: m, layers: 2, hidden: 64, heads: 2, vocab: 10, experts: 0, active_experts: 1, expert_ffn: 32}",
     ["model.experts", "greater than or equal to 1"]),
    ("{name: m, layers: 2, hidden: 64, layer_bytes: 1 MB, experts: 4, active_experts: 1, expert_ffn: 32}",
     ["model", "not both"]),
])
def test_bad_moe_is_one_line(model, parts):
    with pytest.raises(ScenarioError) as e:
        scenario(MOE.split("model:")[0] + f"model: {model}\n" + MOE[MOE.index("devices:"):])
    msg = str(e.value)
    assert "\n" not in msg
    for p in parts:
        assert p in msg, (p, msg)


# --- attention compute grows with the context ---------------------------------------

def test_attention_flops_by_hand():
    from sim.devices import DeviceModel
    scn = scenario("""\
model: {name: att, layers: 1, hidden: 64, heads: 2, head_dim: 32, ffn: 128, vocab: 100, dtype: f16}
devices:
  - {id: a, lends: 1 GiB, memory_bandwidth: 1000000 GB/s, compute: 0.001 TFLOPS}
""")
    m = scn.model
    # weights: q,o 64x64 each, k,v 64x64 each (2 KV heads of 32) = 16,384; MLP 3x64x128 = 24,576;
    # norms 128: 41,088 parameters, 82,176 FLOPs a token; attention width 2 x 32 = 64
    assert m.layer_flops_per_token == 82_176 and m.attn_width == 64
    dm = DeviceModel(scn.devices[0], m)
    # a 16-token chunk after 1,000 cached positions at 1 GFLOP/s (compute bound):
    # 16 x 82,176 + 4 x 64 x (16 x 1000 + 16 x 17 / 2) = 1,314,816 + 4,130,816 FLOPs = 5.445632 ms
    want = (16 * 82_176 + 4 * 64 * (16 * 1000 + 136)) / 1e9
    assert want == pytest.approx(5.445632e-3, rel=1e-12)
    assert dm.stage_s(1, 16, context_tokens=1000) == pytest.approx(want, rel=1e-12)
    assert dm.stage_timer(1)(16, 1000, 0.0, False) == pytest.approx(want, rel=1e-12)
    # at no context the chunk is 16 x 82,176 + 4 x 64 x 136 FLOPs
    assert dm.stage_s(1, 16) == pytest.approx((16 * 82_176 + 4 * 64 * 136) / 1e9, rel=1e-12)


# --- several round trips per hop, poll waits ------------------------------------------

def test_round_trips_and_poll_fold_into_each_hand_off():
    from sim.link import resolve_link
    scn = scenario(sets=["network={rtt: 10 ms, hop_overhead: 1 ms, round_trips_per_hop: 3, poll: 4 ms, "
                         "links: [{between: [a, b], rtt: 30 ms}, {from: b, to: a, round_trips_per_hop: 1}]}"])
    # room: 1 ms + (3 - 1) x 10 ms + 4 ms / 2 = 23 ms a hand-off
    assert scn.network.hop_overhead_s == pytest.approx(0.023, rel=1e-12)
    # a -> b: its own rtt 30 ms: 1 ms + 2 x 30 ms + 2 ms = 63 ms; the flight is rtt/2 on top
    ab = resolve_link(scn.network, "a", "b")
    assert (ab.rtt_s, ab.hop_overhead_s) == (pytest.approx(0.030), pytest.approx(0.063, rel=1e-12))
    # b -> a: one round trip, the room's rtt (10 ms) for its own figure: 1 ms + 0 + 2 ms = 3 ms
    # (the directed override sets the hand-off; rtt 30 ms still comes from the undirected one)
    ba = resolve_link(scn.network, "b", "a")
    assert (ba.rtt_s, ba.hop_overhead_s) == (pytest.approx(0.030), pytest.approx(0.003, rel=1e-12))


def test_simulated_lap_pays_the_extra_round_trips():
    import yaml
    from sim.driver import simulate
    base = ROOM.replace("lends: 150 MiB", "lends: 400 MiB").replace("network: {rtt: 0 ms}",
                                                                     "network: {rtt: 20 ms}")
    sets = ["stages=[{device: a, layers: '1-2'}, {device: b, layers: '3-4'}]"]
    one = simulate(from_mapping(yaml.safe_load(base), "r", sets), trace=False).metrics["lap_s"]["mean"]
    three = simulate(from_mapping(yaml.safe_load(base), "r", sets + ["network.round_trips_per_hop=3"]),
                     trace=False).metrics["lap_s"]["mean"]
    # a decode lap crosses two hand-offs (a -> b, b -> a): each 2 x 20 ms more
    assert three - one == pytest.approx(2 * 2 * 0.020, rel=1e-6)


@pytest.mark.parametrize("sets, parts", [
    (["network.round_trips_per_hop=0"], ["network.round_trips_per_hop", "greater than or equal to 1"]),
    (["network.round_trips_per_hop=2.5"], ["network.round_trips_per_hop"]),
    (["network.poll=5"], ["network.poll", "expected a time", "got 5"]),
    (["network.links=[{between: [a, b], poll: -1 ms}]"], ["network.links[0].poll", "not negative"]),
])
def test_bad_round_trips_and_poll_are_one_line(sets, parts):
    with pytest.raises(ScenarioError) as e:
        scenario(sets=sets)
    msg = str(e.value)
    assert "\n" not in msg
    for p in parts:
        assert p in msg, (p, msg)


# --- a separate draft model ---------------------------------------------------------

DRAFT_SETS = ["devices[0].lends=400 MiB", "devices[1].lends=400 MiB", "network.rtt=10 ms",
              "stages=[{device: a, layers: '1-2'}, {device: b, layers: '3-4'}]",
              "decoding.speculative={drafter: model, draft_tokens: 4, "
              "draft_model: {name: small, layers: 2, hidden: 64, layer_bytes: 50 MiB}}"]


def host_model(sets):
    scn = scenario(sets=sets)
    d = deal(scn.devices, scn.model, scn.options)
    return scn, device_model(scn.device(d.host), scn, d)


def test_draft_model_on_the_host_by_hand():
    scn, dm = host_model(DRAFT_SETS)
    # 2 layers x 50 MiB / 100 GiB/s = 0.9765625 ms a pass (no head: the inline sizes give none);
    # k = 4 passes; the target's own layers (4 x 100 MiB) would cost 3.90625 ms a pass
    assert dm.draft_s(4, scn.decoding.speculative) == pytest.approx(4 * 2 * 50 / (100 * 1024), rel=1e-12)


def test_draft_model_k_plus_one_on_another_device_by_hand():
    sets = DRAFT_SETS[:-1] + [DRAFT_SETS[-1][:-1] + ", draft_passes: k+1, draft_device: b, "
                                                    "draft_engine: hf-eager}"]
    scn, dm = host_model(sets)
    # on b through hf-eager (0.438 of 100 GiB/s): 0.9765625 ms / 0.438 a pass, 5 passes,
    # plus the round trip a -> b -> a: 10 ms (no hop overhead)
    want = 5 * (2 * 50 / (100 * 1024)) / 0.438 + 0.010
    assert dm.draft_s(4, scn.decoding.speculative) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(0.021148, abs=1e-6)


@pytest.mark.parametrize("spec, parts", [
    ("{drafter: ngram, draft_model: qwen2.5-7b}", ["decoding.speculative", "draft_model needs drafter: model"]),
    ("{drafter: model, draft_device: b}", ["decoding.speculative", "give draft_model too"]),
    ("{drafter: model, draft_model: qwen9-1t}", ["decoding.speculative.draft_model", "qwen9-1t"]),
    ("{drafter: model, draft_model: {name: x, layers: 0, hidden: 8, layer_bytes: 1 MB}}",
     ["decoding.speculative.draft_model.layers"]),
    ("{drafter: model, draft_model: qwen2.5-7b, draft_device: phone}",
     ["decoding.speculative.draft_device", "not a device"]),
    ("{drafter: model, draft_model: qwen2.5-7b, draft_engine: warp}", ["decoding.speculative.draft_engine"]),
    ("{drafter: model, draft_model: qwen2.5-7b, draft_passes: k+2}", ["decoding.speculative.draft_passes"]),
])
def test_bad_draft_model_is_one_line(spec, parts):
    with pytest.raises(ScenarioError) as e:
        scenario(sets=[f"decoding.speculative={spec}"])
    msg = str(e.value)
    assert "\n" not in msg
    for p in parts:
        assert p in msg, (p, msg)


def test_drafting_is_in_the_round(tmp_path):
    import json
    text = ROOM.replace("network: {rtt: 0 ms}", "network: {rtt: 10 ms}")
    r = simulate_cli(tmp_path, text, *[a for x in DRAFT_SETS for a in ("--set", x)],
                     "--set", "decoding.speculative.acceptance=1.0")
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["metrics"]
    draft = [row for row in m["breakdown"] if row["kind"] == "draft"]
    # every lap is fed by one draft of 4 passes: 4 x 0.9765625 ms = 3.90625 ms
    assert len(draft) == 1 and draft[0]["mean_s"] == pytest.approx(4 * 2 * 50 / (100 * 1024), rel=1e-6)
    assert m["round_s"] == pytest.approx(m["lap_s"]["mean"] + draft[0]["mean_s"], rel=1e-12)


# --- return: via_host -------------------------------------------------------------------

VIA = """\
model: {name: blocks, layers: 3, hidden: 64, layer_bytes: 1 MiB}
headroom: 0
workload: {prompt_tokens: 4, answer_tokens: 16}
devices:
  - {id: h, lends: 10 MiB, memory_bandwidth: 1000 GiB/s, compute: 1000 TFLOPS}
  - {id: a, lends: 10 MiB, memory_bandwidth: 1000 GiB/s, compute: 1000 TFLOPS}
  - {id: b, lends: 10 MiB, memory_bandwidth: 1000 GiB/s, compute: 1000 TFLOPS}
host: h
stages: [{device: h, layers: "1"}, {device: a, layers: "2"}, {device: b, layers: "3"}]
network:
  rtt: 10 ms
  bandwidth: 100 GB/s
  links: [{between: [h, b], rtt: 20 ms}, {between: [a, b], rtt: 2 ms}]
"""


def test_via_host_relays_every_hand_off_by_hand():
    from sim.driver import simulate
    lap = {}
    for ret in ("direct", "via_host"):
        scn = scenario(VIA, [f"decoding.return={ret}"])
        lap[ret] = simulate(scn, trace=False).metrics["lap_s"]["mean"]
    # direct: h -> a 5 ms, a -> b 1 ms, b -> h 10 ms; via_host: a -> b becomes a -> h -> b,
    # (10 + 20) / 2 = 15 ms: the lap is 14 ms longer (compute, frames and head are the same)
    assert lap["via_host"] - lap["direct"] == pytest.approx(0.014, abs=1e-6)
    assert scenario(VIA, ["decoding.return=via_host"]).decoding.return_path == "direct"


def test_via_host_is_refused_by_a_real_room(tmp_path):
    f = tmp_path / "room.yaml"
    f.write_text(VIA)
    r = CliRunner().invoke(app, ["run", str(f), "--real", "--set", "decoding.return=via_host"])
    assert r.exit_code == 2 and "via_host is simulated only" in r.stderr and "\n" not in r.stderr.strip()


def test_bad_return_is_one_line():
    with pytest.raises(ScenarioError) as e:
        scenario(VIA, ["decoding.return=via_client"])
    assert "decoding.return" in str(e.value) and "via_host" in str(e.value)


# --- head: last_stage -----------------------------------------------------------------

def test_head_on_the_last_stage_by_hand():
    # a 64 MiB head (embedding_bytes, tied) on the host h at 1000 GiB/s takes 1/16,000 s;
    # on the last stage b at 10 GiB/s 1/160 s = 6.25 ms (plus 0.1 ms of sampling either way)
    text = VIA.replace("layer_bytes: 1 MiB}", "layer_bytes: 1 MiB, embedding_bytes: 64 MiB}").replace(
        "lends: 10 MiB", "lends: 100 MiB").replace(
        "{id: b, lends: 100 MiB, memory_bandwidth: 1000 GiB/s", "{id: b, lends: 100 MiB, memory_bandwidth: 10 GiB/s")
    for head, want in (("host", 64 / (1000 * 1024)), ("last_stage", 64 / (10 * 1024))):
        scn = scenario(text, [f"decoding.head={head}"])
        d = deal(scn.devices, scn.model, scn.options)
        dm = device_model(scn.device("h"), scn, d)
        assert dm.head_s(1) == pytest.approx(want, rel=1e-12)
        assert dm.sample_s(1) == pytest.approx(1e-4, rel=1e-12)


def test_head_last_stage_is_refused_by_a_real_room_and_checked(tmp_path):
    f = tmp_path / "room.yaml"
    f.write_text(VIA)
    r = CliRunner().invoke(app, ["run", str(f), "--real", "--set", "decoding.head=last_stage"])
    assert r.exit_code == 2 and "head: last_stage is simulated only" in r.stderr
    with pytest.raises(ScenarioError) as e:
        scenario(VIA, ["decoding.head=first_stage"])
    assert "decoding.head" in str(e.value) and "last_stage" in str(e.value) and "\n" not in str(e.value)
