"""The simulator end to end: determinism, hand-calculated laps, and the cost of a hop."""

import pytest

from splitroom.scenario import from_mapping
from sim.driver import simulate

G = 2**30


def room(devices, **over):
    base = {
        "name": "t", "seed": 5,
        "model": {"name": "toy", "layers": 8, "hidden": 1024, "layer_bytes": "100 MiB", "residual_bytes_per_token": "2 KiB"},
        "devices": devices,
        "network": {"rtt": "10 ms", "bandwidth": "1000 Gbit/s", "hop_overhead": "1 ms"},
        "workload": {"questions": 1, "prompt_tokens": 4, "answer_tokens": 21},
        "decoding": {"prefill_chunk": 4},
    }
    for k, v in over.items():
        base[k] = v
    return from_mapping(base)


def two_devices():
    return [{"id": "a", "lends": "1 GiB", "ms_per_layer": "2 ms"},
            {"id": "b", "lends": "500 MiB", "ms_per_layer": "3 ms"}]


def test_same_seed_same_numbers_other_seed_other_jitter():
    net = {"rtt": "10 ms", "bandwidth": "1 Gbit/s", "hop_overhead": "1 ms",
           "jitter": {"distribution": "paretonormal", "scale": "2 ms"}}
    pins = [{"device": "a", "layers": "1-5"}, {"device": "b", "layers": "6-8"}]
    r1 = simulate(room(two_devices(), network=net, stages=pins))
    r2 = simulate(room(two_devices(), network=net, stages=pins))
    r3 = simulate(room(two_devices(), network=net, stages=pins, seed=6))
    assert r1.metrics == r2.metrics
    assert r1.metrics["inter_token_s"] != r3.metrics["inter_token_s"]


def test_plain_lap_equals_the_hand_sum_of_its_parts():
    # a (the host) could hold all 8 layers (1 GiB / 100 MiB): pin the stages so both work.
    scn = room(two_devices(), stages=[{"device": "a", "layers": "1-5"}, {"device": "b", "layers": "6-8"}])
    r = simulate(scn)
    frame = 32 + 1024 * 2  # header + one f16 residual row (hidden 1024)
    hop = 0.010 / 2 + 0.001 + frame / 125e9
    # measured ms per layer: a 5 x 2 ms, b 3 x 3 ms; embedding, head and sampling of the
    # inline model cost what sim/devices.py says for a model without embedding/head bytes
    from sim.devices import DeviceModel
    dm = DeviceModel(scn.devices[0], scn.model)
    host_extra = dm.embed_s(1) + dm.head_s(1) + dm.sample_s(1)
    lap = 5 * 0.002 + 3 * 0.003 + 2 * hop + host_extra
    assert r.metrics["inter_token_s"]["p50"] == pytest.approx(lap, rel=1e-6)
    assert r.metrics["tokens_per_s"] == pytest.approx(1 / lap, rel=1e-6)
    assert r.metrics["tokens_per_lap"] == 1.0


def test_an_extra_device_costs_one_hop_overhead_on_a_perfect_network():
    # Product page 000: each extra device costs about 3.5-4 ms per token even on a perfect
    # network. With zero RTT and a 3.5 ms hop overhead, splitting the same 8 layers over
    # three devices instead of two adds one hop: 3.5 ms (compute is the same).
    net = {"rtt": "0 ms", "bandwidth": "1000 Gbit/s", "hop_overhead": "3.5 ms"}
    devs = [{"id": "a", "lends": "1 GiB", "ms_per_layer": "1 ms"},
            {"id": "b", "lends": "1 GiB", "ms_per_layer": "1 ms"},
            {"id": "c", "lends": "1 GiB", "ms_per_layer": "1 ms"}]
    two = room(devs, network=net, stages=[{"device": "a", "layers": "1-4"}, {"device": "b", "layers": "5-8"}])
    three = room(devs, network=net, stages=[{"device": "a", "layers": "1-3"}, {"device": "b", "layers": "4-6"},
                                            {"device": "c", "layers": "7-8"}])
    lap2 = simulate(two).metrics["lap_s"]["mean"]
    lap3 = simulate(three).metrics["lap_s"]["mean"]
    assert lap3 - lap2 == pytest.approx(0.0035, abs=2e-5)


def test_speculation_keeps_more_tokens_per_lap_and_via_stages_costs_more():
    pins2 = [{"device": "a", "layers": "1-5"}, {"device": "b", "layers": "6-8"}]
    plain = simulate(room(two_devices(), stages=pins2))
    spec = simulate(room(two_devices(), stages=pins2, decoding={"prefill_chunk": 4, "speculative": {
        "drafter": "ngram", "draft_tokens": 4, "acceptance": 1.0}}))
    assert spec.metrics["tokens_per_lap"] == pytest.approx(5.0, abs=0.3)  # 4 drafts + bonus, last lap cut
    assert spec.metrics["tokens_per_s"] > 2 * plain.metrics["tokens_per_s"]
    three = [{"id": "a", "lends": "300 MiB", "ms_per_layer": "1 ms"},
             {"id": "b", "lends": "300 MiB", "ms_per_layer": "1 ms"},
             {"id": "c", "lends": "300 MiB", "ms_per_layer": "1 ms"}]
    pins = [{"device": "a", "layers": "1-3"}, {"device": "b", "layers": "4-6"}, {"device": "c", "layers": "7-8"}]
    direct = simulate(room(three, stages=pins))
    via = simulate(room(three, stages=pins, decoding={"prefill_chunk": 4, "return": "via_stages"}))
    # via_stages: the result goes c -> b -> a instead of c -> a: one more hop of 6 ms
    assert via.metrics["lap_s"]["mean"] - direct.metrics["lap_s"]["mean"] == pytest.approx(0.006, abs=1e-4)


def test_phone_clock_down_is_prevented_by_wake():
    devs = [{"id": "a", "lends": "600 MiB", "ms_per_layer": "1 ms"},
            {"id": "p", "kind": "phone", "lends": "600 MiB", "ms_per_layer": "1 ms"}]
    # 20 ms RTT: the wake (sent at the lap's start, spinning up to 50 ms) covers the
    # frame's arrival 10 ms + 4 ms of compute later
    net = {"rtt": "20 ms", "bandwidth": "1000 Gbit/s"}
    pinned = [{"device": "a", "layers": "1-4"}, {"device": "p", "layers": "5-8"}]
    woken = simulate(room(devs, network=net, stages=pinned))
    asleep = simulate(room(devs, network=net, stages=pinned,
                           decoding={"prefill_chunk": 4, "wake": False}))
    # the phone's 4 layers of 1 ms take 1.5x as long clocked down: +2 ms a lap
    assert asleep.metrics["lap_s"]["mean"] - woken.metrics["lap_s"]["mean"] == pytest.approx(0.002, abs=1e-4)


def test_phone_only_room_decodes_slower_clocked_down_and_prefills_the_same():
    # issue 9: clock-down must slow decode by about a third and leave prefill alone
    devs = [{"id": "p", "kind": "phone", "lends": "600 MiB", "ms_per_layer": "1 ms"}]
    free = simulate(room(devs, decoding={"prefill_chunk": 4, "wake": False}))
    pinned = simulate(room([dict(devs[0], clocks_down=False)], decoding={"prefill_chunk": 4, "wake": False}))
    woken = simulate(room(devs))
    assert free.metrics["ttft_s"] == pytest.approx(pinned.metrics["ttft_s"], rel=0.02)
    # decode: 8 layers of 1 ms at 1.5x plus the same head: between 1.3x and 1.5x slower
    ratio = pinned.metrics["tokens_per_s"] / free.metrics["tokens_per_s"]
    assert 1.3 < ratio <= 1.5
    assert woken.metrics["tokens_per_s"] == pytest.approx(pinned.metrics["tokens_per_s"], rel=1e-9)


def test_trace_round_trips_through_jsonl_and_gives_the_same_metrics(tmp_path):
    from planner.metrics import compute
    from splitroom.report import read_trace, write_trace
    r = simulate(room(two_devices(), stages=[{"device": "a", "layers": "1-5"}, {"device": "b", "layers": "6-8"}],
                      decoding={"prefill_chunk": 4, "speculative": {
        "drafter": "ngram", "draft_tokens": 3, "acceptance": 0.6}, "async_laps": 2}))
    p = tmp_path / "t.jsonl"
    write_trace(p, r.trace)
    assert compute(read_trace(p)) == r.metrics
