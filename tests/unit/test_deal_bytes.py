"""Deals that follow bytes: product page 000's "By memory" table when the host also holds
an embedding, and models whose layers differ in size.

Expected ranges are hand calculations (shown beside each case), never the planner's
output copied back. Ranges are compared in the 1-based inclusive form people read.
"""

from __future__ import annotations

import pytest

from planner.deal import DealError, cut_by_bytes, deal, format_bytes, pick_host, usable_bytes
from planner.model import ModelSpec
from planner.room import DealOptions, Device

GiB = 2**30
MB = 10**6


def shown(d) -> dict[str, str]:
    """device -> range as people read it; guests map to "asks only"."""
    out = {s.device: (f"{s.start + 1}-{s.end}" if s.end - s.start > 1 else str(s.end)) for s in d.stages}
    out.update({g: "asks only" for g in d.guests})
    return out


def computer(id_: str, n_bytes: int) -> Device:
    return Device(id=id_, kind="computer", lends_bytes=n_bytes)


def with_embedding(layers: int = 40) -> ModelSpec:
    """40 layers of 1 GiB and a 2 GiB embedding that only the model host keeps."""
    return ModelSpec(id="emb", name="emb", layers=layers, hidden=2048, layer_bytes=GiB, layer_active_bytes=GiB,
                     layer_flops_per_token=0.0, kv_bytes_per_token=0, embedding_bytes=2 * GiB)


def uneven() -> ModelSpec:
    """80 layers: the first 40 of 250 MB (10 GB), the last 40 of 200 MB (8 GB); no KV."""
    sizes = tuple([250 * MB] * 40 + [200 * MB] * 40)
    return ModelSpec(id="uneven", name="uneven", layers=80, hidden=2048, layer_bytes=225 * MB,
                     layer_active_bytes=225 * MB, layer_flops_per_token=0.0, kv_bytes_per_token=0,
                     layer_sizes=sizes)


# --- page 000 "By memory": proportion to what each device lends for layers ------------

def test_memory_row1_when_the_host_also_keeps_the_embedding():
    # "Host holds 30, desktop 30, phone 2": the host lends 32 GiB, 2 of them for the
    # embedding, so it holds 30 layers like the desktop: 40 x 30/60 = 20 each.
    room = [computer("host", 32 * GiB), computer("desktop", 30 * GiB),
            Device(id="phone", kind="phone", lends_bytes=2 * GiB)]
    d = deal(room, with_embedding(), DealOptions(split="memory", host="host"))
    assert shown(d) == {"host": "1-20", "desktop": "21-40", "phone": "asks only"}
    assert d.fits


def test_memory_row2_phone_layers_when_the_host_also_keeps_the_embedding():
    # 40 x 30/62 = 19.35 twice, 40 x 2/62 = 1.29: 19 + 19 + 1, the last layer to the
    # host (tie of remainders broken towards the chain's start): 20 / 19 / 1.
    room = [computer("host", 32 * GiB), computer("desktop", 30 * GiB),
            Device(id="phone", kind="phone", lends_bytes=2 * GiB)]
    d = deal(room, with_embedding(), DealOptions(split="memory", phone_layers=True, host="host"))
    assert shown(d) == {"host": "1-20", "desktop": "21-39", "phone": "40"}


# --- layers of different sizes: deal bytes, not counts --------------------------------

def test_memory_split_of_uneven_layers_gives_equal_lenders_equal_bytes():
    # 18 GB over two devices lending 12 GB each: 9 GB each. 36 x 250 MB = 9 GB, then
    # 4 x 250 MB + 40 x 200 MB = 9 GB. By count it would be 40/40 = 10 GB vs 8 GB.
    room = [computer("a", 12 * 10**9), computer("b", 12 * 10**9)]
    d = deal(room, uneven(), DealOptions(split="memory"))
    assert shown(d) == {"a": "1-36", "b": "37-80"}
    used = {sh.device: sh.used_bytes for sh in d.shares}
    assert used == {"a": 9 * 10**9, "b": 9 * 10**9}


def test_memory_split_of_uneven_layers_follows_unequal_lends():
    # a lends 12 GB, b 6 GB: a's quota is 18 x 12/18 = 12 GB = 40 x 250 MB + 10 x 200 MB.
    room = [computer("a", 12 * 10**9), computer("b", 6 * 10**9)]
    d = deal(room, uneven(), DealOptions(split="memory"))
    assert shown(d) == {"a": "1-50", "b": "51-80"}
    assert d.fits


@pytest.mark.parametrize("split", ["speed", "memory"])
def test_a_room_that_holds_uneven_layers_exactly_fits(split):
    # Both lend 9 GB, the model is 18 GB: only 1-36 (9 GB) / 37-80 (9 GB) fits; counting
    # layers at the mean size, the deal held "79 of 80" and did not fit.
    room = [computer("a", 9 * 10**9), computer("b", 9 * 10**9)]
    d = deal(room, uneven(), DealOptions(split=split))
    assert shown(d) == {"a": "1-36", "b": "37-80"}
    assert d.fits
    assert not any("holds 79" in n for n in d.notes)


@pytest.mark.parametrize("split", ["speed", "memory"])
def test_the_bigger_lender_hosts_the_heavy_layers(split):
    # b lends 10 GB (hosts: lends the most), a 8 GB: b holds the 40 heavy layers
    # (10 GB), a the 40 light ones (8 GB); nothing else fits.
    room = [computer("a", 8 * 10**9), computer("b", 10 * 10**9)]
    d = deal(room, uneven(), DealOptions(split=split))
    assert d.host == "b"
    assert shown(d) == {"b": "1-40", "a": "41-80"}
    assert d.fits


def test_cut_by_bytes_by_hand():
    # costs 3, 1, 1, 1 over equal weights: quota 3 -> cut after the first layer.
    assert cut_by_bytes([3, 1, 1, 1], [1, 1]) == [1, 3]
    # three equal shares of 6 x 1: 2 each; at least one each when weights are 0.
    assert cut_by_bytes([1] * 6, [1, 1, 1]) == [2, 2, 2]
    assert cut_by_bytes([1] * 3, [1, 0, 0]) == [1, 1, 1]
    # quota 3.5 of [5, 1, 1] is nearest the boundary after the first layer (5): [1, 2].
    assert cut_by_bytes([5, 1, 1], [1, 1], budgets=[5, 2]) == [1, 2]
    # weights 3:1 of 8 bytes: quota 6 -> [3, 1]; device 0 may hold 4, device 1 has room
    # for one more layer: [2, 2].
    assert cut_by_bytes([2, 2, 2, 2], [3, 1], budgets=[4, 4]) == [2, 2]


def test_cut_by_bytes_quota_when_the_weights_say_nothing_or_sum_below_one():
    # all weights 0: an even split of the bytes. 6 x 1 over three: quotas 6*1/3 = 2 and
    # 6*2/3 = 4 -> cuts after layers 2 and 4.
    assert cut_by_bytes([1] * 6, [0, 0, 0]) == [2, 2, 2]
    # weights 0.25 : 0.75 (sum 1) of 4 x 1: quota 4 * 0.25 = 1 -> [1, 3], not the even [2, 2].
    assert cut_by_bytes([1, 1, 1, 1], [0.25, 0.75]) == [1, 3]
    # a device of weight 0 first: quota 0, but each device keeps at least one layer -> [1, 2].
    assert cut_by_bytes([1, 1, 1], [0, 1]) == [1, 2]


@pytest.mark.parametrize("costs,weights,budgets,want", [
    # 6 x 1 over three equal weights: [2, 2, 2] before budgets (cuts at 2 and 4).
    # Device 1 may hold 1 byte, device 2 has room: the forward pass moves the cut at 4 to 3.
    ([1] * 6, [1, 1, 1], [2, 1, 10], [2, 1, 3]),
    # device 0 may hold 1 and device 1 (2 bytes, may hold 3) takes one more layer exactly
    # (2 + 1 = 3 <= 3): [1, 3, 2].
    ([1] * 6, [1, 1, 1], [1, 3, 2], [1, 3, 2]),
    # device 1 over (2 > 1) and device 2 full (2 + 1 > 2): the backward pass gives
    # device 1's first layer to device 0 (2 + 1 <= 10): [3, 1, 2].
    ([1] * 6, [1, 1, 1], [10, 1, 2], [3, 1, 2]),
    # the last device over (2 > 1): device 1 takes its first layer exactly (2 + 1 <= 3): [2, 3, 1].
    ([1] * 6, [1, 1, 1], [10, 3, 1], [2, 3, 1]),
    # exactly at budget is not over: [3, 3] stays, whichever side has room.
    ([1] * 6, [1, 1], [3, 10], [3, 3]),
    ([1] * 6, [1, 1], [10, 3], [3, 3]),
    # costs 1, 1, 4, 1, 1, 1 (running 1, 2, 6, 7, 8, 9), quota 4.5 -> nearest boundary 6:
    # [3, 3] of 6 and 3 bytes. Device 0 may hold 5: its last layer weighs 4, and device 1
    # (3 bytes) has room for it at budget 7 (exactly) but not at 6.
    ([1, 1, 4, 1, 1, 1], [1, 1], [5, 7], [2, 4]),
    ([1, 1, 4, 1, 1, 1], [1, 1], [5, 6], [3, 3]),
    # costs 1, 1, 1, 4, 1, 1 (running 1, 2, 3, 7, 8, 9): [3, 3] of 3 and 6 bytes. Device 1
    # may hold 5: its first layer weighs 4, and device 0 (3 bytes) has room for it at 7
    # (exactly) but not at 6.
    ([1, 1, 1, 4, 1, 1], [1, 1], [7, 5], [4, 2]),
    ([1, 1, 1, 4, 1, 1], [1, 1], [6, 5], [3, 3]),
    # a one-layer range over its budget keeps its layer (at least one each), either way.
    ([5, 1], [1, 1], [1, 10], [1, 1]),
    ([1, 5], [1, 1], [10, 1], [1, 1]),
])
def test_cut_by_bytes_moves_a_cut_only_to_a_neighbour_with_room(costs, weights, budgets, want):
    assert cut_by_bytes(costs, weights, budgets=budgets) == want


# --- what the host pick and the capacity checks tell a person --------------------------

def test_the_host_pick_names_its_reason():
    a, b = computer("a", 8 * GiB), computer("b", 4 * GiB)
    assert pick_host([a, b]) == ("a", ["a hosts by memory: WebGPU, computer, lends the most"])
    blind = [Device(id="a", lends_bytes=8 * GiB, webgpu=False), Device(id="b", lends_bytes=4 * GiB, webgpu=False)]
    assert pick_host(blind) == ("a", ["a hosts by memory: no device has WebGPU, computer, lends the most"])
    with pytest.raises(DealError) as e:
        pick_host([])
    assert str(e.value) == "the room has no devices"
    with pytest.raises(DealError) as e:
        pick_host([b, a], forced="z")
    assert str(e.value) == "host 'z' is not a device of the room (a, b)"


def test_the_fastest_copier_that_lends_the_most_hosts_instead_of_the_memory_pick():
    # a is the memory pick (8 GiB). b and c copy 3x as fast as a (300 vs 100 B/s), d 2x;
    # all lend at least half of a's 8 GiB. The fastest win (b, c); of those b lends more.
    room = [Device(id="a", lends_bytes=8 * GiB, copy_speed_Bps=100.0),
            Device(id="c", lends_bytes=5 * GiB, copy_speed_Bps=300.0),
            Device(id="d", lends_bytes=7 * GiB, copy_speed_Bps=200.0),
            Device(id="b", lends_bytes=6 * GiB, copy_speed_Bps=300.0)]
    assert pick_host(room) == (
        "b", ["b hosts: copies GPU memory 3.00x as fast as a (the memory pick) and lends at least half as much"])


def test_a_device_without_webgpu_never_hosts_for_speed():
    # b copies 10x as fast and lends as much, but without WebGPU it cannot hold layers.
    room = [Device(id="a", lends_bytes=8 * GiB, copy_speed_Bps=100.0),
            Device(id="b", lends_bytes=8 * GiB, copy_speed_Bps=1000.0, webgpu=False)]
    assert pick_host(room)[0] == "a"


@pytest.mark.parametrize("zero,why", [
    ({"compute_flops": 0.0}, "a: compute 0 TFLOPS (zero capacity)"),
    ({"memory_bandwidth_Bps": 0.0}, "a: memory_bandwidth 0 (zero capacity)"),
    ({"s_per_layer": 0.0}, "a: ms_per_layer 0 ms (zero capacity)"),
])
def test_a_room_of_zero_capacity_names_the_zero(zero, why):
    with pytest.raises(DealError) as e:
        deal([Device(id="a", lends_bytes=8 * GiB, **zero)], with_embedding())
    assert str(e.value) == "no device can compute a layer: " + why


def test_bytes_are_shown_whole_below_a_kib():
    assert [format_bytes(1.5), format_bytes(0), format_bytes(1536)] == ["2 B", "0 B", "1.5 KiB"]


def test_what_a_device_of_one_byte_may_use_is_less_its_headroom():
    # 1 - ceil(1 * 0.1) = 0 bytes for layers.
    assert usable_bytes(computer("a", 1), DealOptions(headroom=0.1)) == 0
