"""The product page's deal examples (shared/seeds/000, "Examples"), every row, exactly,
plus the host-pick rules and the cases people hit with other tools (issue 2).

Expected values come from the product page's table and from hand calculation, never
from running the planner. The toy model has 40 layers of exactly 1 GiB and no
embedding, head, draft or KV cache, so "holds N" in the table means "lends N GiB".
Ranges are compared in the 1-based inclusive form the page prints ("1-22").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.deal import DealError, deal, pick_host
from planner.model import Architecture, ModelSpec, spec_from_architecture
from planner.room import DealOptions, Device
from splitroom.scenario import load

GiB = 2**30
ROOT = Path(__file__).resolve().parents[2]


def toy(layers: int = 40, layer_bytes: int = GiB) -> ModelSpec:
    """A model of ``layers`` layers of ``layer_bytes`` each and nothing else."""
    return ModelSpec(id=f"toy-{layers}", name=f"toy-{layers}", layers=layers, hidden=2048,
                     layer_bytes=layer_bytes, layer_active_bytes=layer_bytes,
                     layer_flops_per_token=0.0, kv_bytes_per_token=0)


def computer(id_: str, gib: float, ms: float | None = None, copy: float | None = None, **kw) -> Device:
    """A WebGPU computer lending ``gib`` GiB (optionally measured ``ms`` per layer)."""
    return Device(id=id_, kind="computer", lends_bytes=int(gib * GiB),
                  s_per_layer=None if ms is None else ms / 1000, copy_speed_Bps=copy, **kw)


def phone(id_: str, gib: float, **kw) -> Device:
    """A WebGPU phone lending ``gib`` GiB."""
    return Device(id=id_, kind="phone", lends_bytes=int(gib * GiB), **kw)


def shown(d) -> dict[str, str]:
    """device -> range as the page prints it; guests map to "asks only"."""
    out = {s.device: (f"{s.start + 1}-{s.end}" if s.end - s.start > 1 else str(s.end)) for s in d.stages}
    out.update({g: "asks only" for g in d.guests})
    return out


# --- product page 000, "Examples": For speed --------------------------------------------

def test_speed_row1_host30_desktop30_phone2_unmeasured():
    room = [computer("host", 30), computer("desktop", 30), phone("phone", 2)]
    d = deal(room, toy(), DealOptions(split="speed", host="host"))
    assert d.host == "host"
    assert shown(d) == {"host": "1-30", "desktop": "31-40", "phone": "asks only"}
    assert d.fits


def test_speed_row1_host_picked_by_lowest_id_on_a_tie():
    # Same room without forcing: both lend 30 GiB, so the lowest id ("a-host") hosts.
    room = [computer("desktop", 30), computer("a-host", 30), phone("phone", 2)]
    d = deal(room, toy())
    assert d.host == "a-host"
    assert shown(d) == {"a-host": "1-30", "desktop": "31-40", "phone": "asks only"}


def test_speed_row2_desktop_measured_2x_faster():
    room = [computer("host", 30, ms=2.0), computer("desktop", 30, ms=1.0), phone("phone", 2)]
    d = deal(room, toy(), DealOptions(host="host"))
    assert shown(d) == {"host": "1-10", "desktop": "11-40", "phone": "asks only"}
    assert d.stages[0].device == "host"  # the chain starts at the host's range


def test_speed_row3_computers_cannot_hold_40():
    # 20 + 15 + 2 = 37 < 40: leftover 3 spread by memory 20:15:2 ->
    # quotas 1.62, 1.22, 0.16 -> floors 1, 1, 0; the one left goes to the largest
    # remainder (host, .62) -> +2, +1, +0 -> 22, 16, 2.
    room = [computer("host", 20), computer("desktop", 15), phone("phone", 2)]
    d = deal(room, toy())
    assert d.host == "host"  # lends the most
    assert shown(d) == {"host": "1-22", "desktop": "23-38", "phone": "39-40"}
    assert not d.fits
    assert any("leftover 3" in n for n in d.notes)


# --- product page 000, "Examples": By memory --------------------------------------------

def test_memory_row1_host30_desktop30_phone2():
    room = [computer("host", 30), computer("desktop", 30), phone("phone", 2)]
    d = deal(room, toy(), DealOptions(split="memory", host="host"))
    assert shown(d) == {"host": "1-20", "desktop": "21-40", "phone": "asks only"}
    assert any("phone" in n and "asks only" in n for n in d.notes)


def test_memory_row2_with_phone_layers():
    # 40 x 30/62 = 19.35, 19.35; 40 x 2/62 = 1.29 -> 19 + 19 + 1 = 39; the last layer
    # goes to the largest remainder, a tie of .35 broken towards the chain's start (host).
    room = [computer("host", 30), computer("desktop", 30), phone("phone", 2)]
    d = deal(room, toy(), DealOptions(split="memory", phone_layers=True, host="host"))
    assert shown(d) == {"host": "1-20", "desktop": "21-39", "phone": "40"}


# --- cases people hit with other tools (issue 2) ----------------------------------------

@pytest.mark.parametrize("split", ["speed", "memory"])
def test_10_layers_over_3_devices_loses_no_layer(split):
    room = [computer("a", 4), computer("b", 4), computer("c", 4)]
    d = deal(room, toy(10), DealOptions(split=split))
    assert sum(s.end - s.start for s in d.stages) == 10
    assert d.stages[0].start == 0 and d.stages[-1].end == 10
    assert all(x.end == y.start for x, y in zip(d.stages, d.stages[1:]))
    if split == "memory":  # 10/3 = 3.33 each: 4, 3, 3 (tie of remainders to the host)
        assert sorted(s.end - s.start for s in d.stages) == [3, 3, 4]
    else:  # fewest hops: a (host, lowest id) 4, then b 4, then c 2
        assert shown(d) == {"a": "1-4", "b": "5-8", "c": "9-10"}


def test_3_layers_over_5_devices_memory_gives_3_stages_and_2_guests():
    room = [computer(x, 8) for x in "abcde"]
    d = deal(room, toy(3), DealOptions(split="memory"))
    assert len(d.stages) == 3 and all(s.end > s.start for s in d.stages)
    assert len(d.guests) == 2
    assert d.stages[0].device == d.host == "a"


def test_3_layers_over_5_devices_speed_each_holding_one():
    room = [computer(x, 1) for x in "abcde"]
    d = deal(room, toy(3))
    assert shown(d) == {"a": "1", "b": "2", "c": "3", "d": "asks only", "e": "asks only"}


def test_memory_ratio_049_051_on_64_layers_gives_31_33():
    # 64 x .49 = 31.36, 64 x .51 = 32.64 -> 31 + 32 = 63; the largest remainder (.64)
    # takes the last layer: 31 / 33.
    room = [computer("small", 49), computer("big", 51)]
    d = deal(room, toy(64), DealOptions(split="memory"))
    assert d.host == "big"
    n = {s.device: s.end - s.start for s in d.stages}
    assert n == {"big": 33, "small": 31}


def test_kv_bytes_28_layers_8_heads_dim_128_ctx_131072():
    # K and V, 8 heads x 128 values, 2 bytes each: 4096 B per token per layer;
    # x 131072 tokens x 28 layers = 15,032,385,536 B.
    arch = Architecture(layers=28, hidden=3584, heads=28, kv_heads=8, head_dim=128, vocab=1000, ffn=1)
    spec = spec_from_architecture("kv-test", "kv-test", arch)
    assert spec.kv_bytes_per_token == 4096
    assert spec.layers * spec.kv_bytes(131072, "f16") == 15_032_385_536
    assert spec.layers * spec.kv_bytes(131072, "q8") == 15_032_385_536 // 2


def test_kv_share_makes_layers_bigger_and_q8_smaller():
    # 1 GiB of weights + 1 KiB per token of KV: at 1M tokens a layer is 2 GiB (f16),
    # 1.5 GiB at q8. A device lending 12 GiB holds 6 (f16) or 8 (q8) layers.
    m = ModelSpec(id="t", name="t", layers=40, hidden=8, layer_bytes=GiB, layer_active_bytes=GiB,
                  layer_flops_per_token=0.0, kv_bytes_per_token=1024)
    room = [computer("a", 12), computer("b", 100)]
    for kv, held in (("f16", 6), ("q8", 8)):
        d = deal(room, m, DealOptions(context_tokens=2**20, kv_cache=kv, host="a"))
        assert d.stages[0] == type(d.stages[0])("a", 0, held)


def test_host_share_is_lends_minus_embedding_head_and_draft():
    # 10 GiB lent, 1 + 1 + 1 GiB of embedding, head and draft -> 7 layers of 1 GiB.
    m = ModelSpec(id="t", name="t", layers=40, hidden=8, layer_bytes=GiB, layer_active_bytes=GiB,
                  layer_flops_per_token=0.0, kv_bytes_per_token=0,
                  embedding_bytes=GiB, head_bytes=GiB, draft_bytes=GiB)
    d = deal([computer("a", 10), computer("b", 100)], m, DealOptions(host="a"))
    assert shown(d) == {"a": "1-7", "b": "8-40"}
    assert [sh.used_bytes for sh in d.shares if sh.device == "a"] == [10 * GiB]


def test_host_keeps_at_least_one_layer_when_others_are_faster():
    # The desktop is measured faster and holds all 40; the host still keeps one. The
    # desktop lends less than half of the host's 100 GiB, so the 1.5x speed rule does
    # not make it host (issue 12: with 50 GiB it would, and then it holds all 40).
    room = [computer("host", 100, ms=5.0), computer("desktop", 40, ms=1.0)]
    d = deal(room, toy())
    assert d.host == "host"
    assert shown(d) == {"host": "1", "desktop": "2-40"}


# --- host pick (product page 000, "Which device is the model host") ---------------------

def test_host_pick_webgpu_first():
    room = [computer("a", 100, webgpu=False), computer("b", 10)]
    assert pick_host(room)[0] == "b"


def test_host_pick_computer_before_phone():
    room = [phone("a", 100), computer("b", 10)]
    assert pick_host(room)[0] == "b"


def test_host_pick_most_memory_then_lowest_id():
    assert pick_host([computer("a", 10), computer("b", 20)])[0] == "b"
    assert pick_host([computer("b", 20), computer("a", 20)])[0] == "a"


@pytest.mark.parametrize("fast_copy, fast_lends, hosts", [
    (150.0, 50.0, "fast"),   # exactly 1.5x and exactly half: overrides
    (149.9, 50.0, "big"),    # just under 1.5x
    (150.0, 49.9, "big"),    # just under half the memory
    (300.0, 100.0, "fast"),  # well over both
])
def test_host_pick_gpu_copy_speed_override_thresholds(fast_copy, fast_lends, hosts):
    room = [computer("big", 100, copy=100e9), computer("fast", fast_lends, copy=fast_copy * 1e9)]
    assert pick_host(room)[0] == hosts


def test_host_pick_copy_override_needs_same_kind():
    # A phone that copies 10x as fast does not take over from a computer.
    room = [computer("big", 100, copy=10e9), phone("fastphone", 90, copy_speed_Bps=100e9)]
    assert pick_host(room)[0] == "big"


def test_host_pick_identical_machines_keep_memory_pick():
    room = [computer("b", 64, copy=200e9), computer("a", 64, copy=200e9)]
    assert pick_host(room)[0] == "a"


def test_forced_host():
    room = [computer("big", 100), computer("small", 10)]
    d = deal(room, toy(), DealOptions(host="small"))
    assert d.host == "small" and d.stages[0].device == "small"
    assert shown(d) == {"small": "1-10", "big": "11-40"}


def test_forced_host_unknown_is_an_error():
    with pytest.raises(DealError, match="nope"):
        deal([computer("a", 100)], toy(), DealOptions(host="nope"))


def test_device_without_webgpu_is_a_guest():
    room = [computer("a", 30), computer("b", 100, webgpu=False), computer("c", 30)]
    d = deal(room, toy())
    assert d.host == "a"
    assert shown(d) == {"a": "1-30", "c": "31-40", "b": "asks only"}


# --- the bundled scenarios ----------------------------------------------------------------

def test_gb10_m5_mac_hosts_and_both_hold_layers():
    scn = load(ROOT / "scenarios" / "gb10_m5.yaml")
    d = deal(scn.devices, scn.model, scn.options)
    assert d.host == "mac"
    assert [s.device for s in d.stages] == ["mac", "spark"]
    assert all(s.end > s.start for s in d.stages) and d.stages[-1].end == 40
    assert d.fits and d.guests == ()


def test_home_deals_all_three_devices():
    scn = load(ROOT / "scenarios" / "home.yaml")
    d = deal(scn.devices, scn.model, scn.options)
    assert {s.device for s in d.stages} == {"desktop", "laptop", "phone"}
    assert d.stages[-1].end == 30 and d.fits and d.guests == ()


# --- bugs found by the property tests, pinned as plain cases -----------------------------

def test_memory_split_computer_that_cannot_hold_one_layer_asks_only():
    # "at least one each" must not push a computer lending half a layer over what it lends
    # while the other computer holds the whole model.
    room = [computer("big", 50), computer("tiny", 0.5)]
    d = deal(room, toy(), DealOptions(split="memory"))
    assert shown(d) == {"big": "1-40", "tiny": "asks only"}
    assert d.fits


def test_nobody_lends_anything_names_every_device():
    # Before: "host 'a' lends no memory" named only the host.
    room = [computer("a", 0), computer("b", 0), phone("c", 0)]
    with pytest.raises(DealError) as e:
        deal(room, toy())
    assert all(x in str(e.value) for x in ("a ", "b ", "c "))


def test_no_device_has_webgpu_names_every_device():
    room = [computer("a", 10, webgpu=False), computer("b", 10, webgpu=False)]
    with pytest.raises(DealError) as e:
        deal(room, toy())
    assert "a: no WebGPU" in str(e.value) and "b: no WebGPU" in str(e.value)
