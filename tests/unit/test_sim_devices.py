"""sim.devices against hand calculations from the published architecture numbers."""

from __future__ import annotations

import pytest

from planner.model import ModelSpec, lookup
from planner.room import Device, Speculative
from sim.devices import DeviceModel

QWEN = lookup("qwen3.6-35b-a3b")
SPARK = Device(id="spark", memory_bandwidth_Bps=273e9, compute_flops=100e12)

# Qwen3.6-35B-A3B, one layer, by hand (planner/model.py's architecture numbers):
# attention 2048*16*256*2 + 2048*2*256*2 = 18,874,368; norms 4,096; router 2048*256
# = 524,288; shared expert 3*2048*512 = 3,145,728; 8 active experts of 3*2048*512.
EXPERT_PARAMS = 3 * 2048 * 512
ACTIVE_PARAMS = 18_874_368 + 4_096 + 524_288 + EXPERT_PARAMS + 8 * EXPERT_PARAMS
ACTIVE_BYTES = ACTIVE_PARAMS * 4.5 / 8  # 4.5 bits per weight = 26,839,296 bytes
EXPERT_BYTES = EXPERT_PARAMS * 4.5 / 8
HEAD_BYTES = 248_320 * 2048 * 4.5 / 8


def test_hand_numbers_match_the_catalog():
    assert QWEN.layer_active_bytes == ACTIVE_BYTES == 26_839_296
    assert QWEN.head_bytes == HEAD_BYTES


def test_decode_is_layer_bytes_over_bandwidth():
    dm = DeviceModel(SPARK, QWEN)
    # 26.84 MB / 273 GB/s = 98.3 us per layer; 20 layers = 1.966 ms
    assert dm.stage_s(1, 1) == pytest.approx(ACTIVE_BYTES / 273e9, rel=1e-12)
    assert dm.stage_s(20, 1) == pytest.approx(20 * 26_839_296 / 273e9, rel=1e-12)
    assert dm.stage_s(20, 1) == pytest.approx(1.9663e-3, rel=1e-4)
    assert dm.stage_s(0, 1) == 0.0 and dm.stage_s(20, 0) == 0.0


def test_moe_chunk_reads_the_expected_distinct_experts():
    dm = DeviceModel(SPARK, QWEN)
    n = 16
    distinct = 256 * (1 - (1 - 8 / 256) ** n)  # = 101.96 experts
    assert distinct == pytest.approx(101.96, abs=0.01)
    per_layer = ACTIVE_BYTES + (distinct - 8) * EXPERT_BYTES
    assert dm.stage_s(10, n) == pytest.approx(10 * per_layer / 273e9, rel=1e-12)
    # flops side (16 * 95.4 MFLOP / 100 TFLOPS = 15 us) stays far below
    assert 16 * QWEN.layer_flops_per_token / 100e12 < per_layer / 273e9
    # a huge chunk reads every expert: capped at the whole layer
    assert dm.layer_bytes_read(100_000) == QWEN.layer_bytes


def test_dense_chunk_memory_then_compute_bound():
    m = lookup("qwen2.5-7b")
    dev = Device(id="d", memory_bandwidth_Bps=100e9, compute_flops=10e12)
    dm = DeviceModel(dev, m)
    mem = m.layer_bytes / 100e9
    assert dm.stage_s(1, 16) == pytest.approx(mem)  # 16 tokens share one weight read
    n = 1024
    # weights' FLOPs plus attention over the chunk itself: position i attends to i positions,
    # 4 FLOPs each per unit of Qwen2.5-7B's attention width (28 heads x 128)
    attention = 4 * 28 * 128 * (n * (n + 1) / 2)
    assert dm.stage_s(2, n) == pytest.approx(2 * (n * m.layer_flops_per_token + attention) / 10e12)
    assert dm.stage_s(2, n) > 2 * mem


def test_inline_moe_without_layout_uses_upper_bound():
    m = ModelSpec(id="toy-moe", name="toy", layers=4, hidden=64, layer_bytes=1000,
                  layer_active_bytes=100, layer_flops_per_token=0.0, kv_bytes_per_token=0)
    dm = DeviceModel(Device(id="d", memory_bandwidth_Bps=1e3), m)
    assert dm.stage_s(1, 4) == pytest.approx(0.4)
    assert dm.stage_s(1, 50) == pytest.approx(1.0)


def test_kv_context_read_is_added():
    dm = DeviceModel(SPARK, QWEN)
    ctx = 8192
    assert dm.stage_s(10, 1, context_tokens=ctx) == pytest.approx(10 * (ACTIVE_BYTES + ctx * 512) / 273e9)


def test_measured_time_scales_with_roofline_ratio():
    dev = Device(id="mac", memory_bandwidth_Bps=390e9, s_per_layer=0.9e-3)
    dm = DeviceModel(dev, QWEN)
    assert dm.stage_s(10, 1) == pytest.approx(9e-3)
    distinct = 256 * (1 - (1 - 8 / 256) ** 16)
    ratio = (ACTIVE_BYTES + (distinct - 8) * EXPERT_BYTES) / ACTIVE_BYTES
    assert dm.stage_s(10, 16) == pytest.approx(9e-3 * ratio)
    # the same efficiency carries to the host's head: measured/roofline = 0.9 ms / 68.8 us
    scale = 0.9e-3 / (ACTIVE_BYTES / 390e9)
    assert dm.host_scale == pytest.approx(scale)
    assert dm.head_s(1) == pytest.approx(HEAD_BYTES / 390e9 * scale)


def test_head_embed_sample_draft():
    dm = DeviceModel(SPARK, QWEN)
    assert dm.head_s(1) == pytest.approx(HEAD_BYTES / 273e9)  # 1.05 ms
    assert dm.head_s(5) == pytest.approx(HEAD_BYTES / 273e9)  # 5 rows: still memory bound
    row = 2048 * 4.5 / 8
    assert dm.embed_s(16) == pytest.approx(16 * row / 273e9)
    assert dm.sample_s(5) == pytest.approx(5e-4)
    # MTP draft layer: its active weights + the shared head per drafted token
    assert dm.draft_s(4) == pytest.approx(4 * (ACTIVE_BYTES + HEAD_BYTES) / 273e9)
    assert dm.draft_s(4, Speculative(draft_s_per_token=0.05)) == pytest.approx(0.2)
    assert dm.draft_s(4, Speculative(drafter="ngram")) == pytest.approx(4e-5)
    with pytest.raises(ValueError):
        dm.draft_s(4, Speculative(drafter="model9b"))


def test_defaults_by_kind():
    assert DeviceModel(Device(id="p", kind="phone"), QWEN).bandwidth_Bps == 50e9
    assert DeviceModel(Device(id="c"), QWEN).bandwidth_Bps == 100e9
    dm = DeviceModel(Device(id="c"), QWEN)
    assert dm.stage_s(1, 1) == pytest.approx(ACTIVE_BYTES / 100e9)


def test_slowdown_multiplies_compute():
    a = DeviceModel(SPARK, QWEN)
    b = DeviceModel(SPARK, QWEN, slowdown=3.0)
    assert b.stage_s(10, 16) == pytest.approx(3 * a.stage_s(10, 16))
    assert b.head_s(1) == pytest.approx(3 * a.head_s(1))


# --- phone clock-down ---------------------------------------------------------------

PHONE = Device(id="phone", kind="phone", memory_bandwidth_Bps=50e9)


def test_clocked_down_phone_decodes_a_third_slower_and_prefills_at_full_speed():
    # public figures (issue 9): Adreno 830, 21.0 tok/s with the clock free vs 31.5 pinned
    dm = DeviceModel(PHONE, QWEN)
    c = dm.stage_s(2, 1)
    assert dm.stage_s(2, 1, now_s=10.0) == pytest.approx(c * 31.5 / 21.0)
    # back to back: the clock still falls between a token's small submissions
    assert dm.stage_s(2, 1, now_s=10.0 + c * 1.5) == pytest.approx(c * 1.5)
    p = dm.stage_s(2, 16)
    assert dm.stage_s(2, 16, now_s=20.0) == pytest.approx(p)  # a prefill chunk: unchanged


def test_wake_keeps_the_clock_up_for_at_most_50_ms():
    dm = DeviceModel(PHONE, QWEN)
    c = dm.stage_s(2, 1)
    dm.wake(1.0, 1.04)  # the frame is due 40 ms later: the spin covers it
    assert dm.penalty_s(1.04, c) == 0.0
    assert dm.stage_s(2, 1, now_s=1.04) == pytest.approx(c)
    dm.wake(2.0, 2.3)  # due 300 ms later: the spin stops at 2.05 and the clock falls
    assert dm.busy_until_s == pytest.approx(2.05)
    assert dm.stage_s(2, 1, now_s=2.3) == pytest.approx(1.5 * c)
    host = DeviceModel(PHONE, QWEN, self_wake=True)  # a phone model host wakes itself
    assert host.stage_s(2, 1, now_s=5.0) == pytest.approx(c)


def test_computers_never_clock_down_and_pure_calls_have_no_state():
    dm = DeviceModel(SPARK, QWEN)
    c = dm.stage_s(5, 1)
    assert dm.stage_s(5, 1, now_s=0.0) == c
    assert dm.stage_s(5, 1, now_s=100.0) == c
    ph = DeviceModel(PHONE, QWEN)
    for _ in range(3):
        assert ph.stage_s(2, 1) == ph.stage_s(2, 1)
    assert ph.busy_until_s == float("-inf")


@pytest.mark.parametrize("dev,kw", [
    (Device(id="x", memory_bandwidth_Bps=-1.0), {}),
    (Device(id="x", s_per_layer=0.0), {}),
    (Device(id="x"), {"slowdown": 0.0}),
    (Device(id="x"), {"pass_overhead_s": -1.0}),
    (Device(id="x"), {"efficiency": 0.0}),
])
def test_bad_values_raise(dev, kw):
    with pytest.raises(ValueError):
        DeviceModel(dev, QWEN, **kw)


def test_negative_layers_raise():
    with pytest.raises(ValueError):
        DeviceModel(SPARK, QWEN).stage_s(-1, 1)
