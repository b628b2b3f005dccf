"""Deals that follow bytes: product page 000's "By memory" table when the host also holds
an embedding, and models whose layers differ in size.

Expected ranges are hand calculations (shown beside each case), never the planner's
output copied back. Ranges are compared in the 1-based inclusive form people read.
"""

from __future__ import annotations

import pytest

from planner.deal import DealError, cut_by_bytes, deal, format_bytes, pick_host, usable_bytes
from planner.model import ModelSpec
from planner.room import DealOptions, Device, PinnedStage

GiB = 2**30
MB = 10**6
MiB = 2**20


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


# --- pinned stages, the shares people read, and a room that holds nothing ---------------

def pinned_room() -> list[Device]:
    """a hosts (lends the most of the devices that can compute with WebGPU)."""
    return [computer("a", 8 * GiB), computer("b", 4 * GiB), Device(id="c", lends_bytes=8 * GiB, webgpu=False),
            Device(id="d", lends_bytes=8 * GiB, compute_flops=0.0), computer("e", 0), computer("f", 1)]


def pin(*ranges: tuple[str, int, int], **kw) -> DealOptions:
    return DealOptions(stages=tuple(PinnedStage(dev, start, end) for dev, start, end in ranges), **kw)


@pytest.mark.parametrize("ranges,message", [
    ((("z", 0, 4),), "stages[0]: 'z' is not a device of the room"),
    ((("b", 0, 2), ("b", 2, 4)), "stages[1]: 'b' holds two ranges; a device holds one contiguous range"),
    ((("c", 0, 4),), "stages[0]: 'c' has no WebGPU and cannot hold layers"),
    ((("d", 0, 4),), "stages[0]: 'd' cannot compute (d: compute 0 TFLOPS (zero capacity))"),
    ((("b", 1, 4),), "stages[0]: 'b' layers 2-4 must start at layer 1 and hold at least one"),
    ((("b", 0, 1), ("a", 2, 4)),
     "stages[1]: 'a' layers 3-4 must start at layer 2 (the stages before it end at layer 1) and hold at least one"),
    ((("b", 0, 2), ("a", 3, 4)),
     "stages[1]: 'a' layers 4 must start at layer 3 (the stages before it end at layer 2) and hold at least one"),
    ((("b", 0, 2), ("a", 2, 2)),
     "stages[1]: 'a' layers 2 must start at layer 3 (the stages before it end at layer 2) and hold at least one"),
    ((("b", 0, 3),), "stages cover layers 1-3 but the model has 4"),
    ((("b", 0, 2), ("a", 2, 4)), "stages[1]: the model host 'a' holds layers 3-4 but is not the first stage; "
                                 "the host's range must come first (or give the host no layers)"),
])
def test_a_pinned_deal_that_is_not_a_cover_says_which_stage_and_why(ranges, message):
    with pytest.raises(DealError) as e:
        deal(pinned_room(), with_embedding(4), pin(*ranges))
    assert str(e.value) == message


def test_a_pinned_deal_without_the_host_makes_it_a_coordinator_and_names_each_guest():
    # b holds the 4 layers of 1 GiB (4 GiB of its 4). a keeps the 2 GiB embedding only
    # and could hold (8 - 2) / 1 = 6 layers; c, d, e and f (1 byte) hold none, each for its reason.
    d = deal(pinned_room(), with_embedding(4), pin(("b", 0, 4)))
    assert (d.host, d.fits, d.guests) == ("a", True, ("c", "d", "e", "f"))
    assert d.notes[-2:] == ("stages pinned by the scenario",
                            "a holds no layers: a coordinator (embedding, head, sampling, drafting)")
    assert [(s.device, s.role, s.layers, s.holds_layers, s.used_bytes, s.why) for s in d.shares] == [
        ("b", "worker", 4, 4, 4 * GiB, "layers 1-4"),
        ("a", "model host", 0, 6, 2 * GiB, "coordinator, no layers"),
        ("c", "guest", 0, 0, 0, "no WebGPU"),
        ("d", "guest", 0, 0, 0, "zero capacity"),
        ("e", "guest", 0, 0, 0, "lends nothing"),
        ("f", "guest", 0, 0, 0, "not needed")]


def test_a_pinned_stage_over_what_it_may_use_says_by_how_much():
    # headroom 10%: b may use 4 GiB - ceil(0.4 GiB) and holds 4 GiB, into the headroom
    # by ceil(0.1 * 4 GiB) = 429,496,730 B = 409.6 MiB.
    d = deal(pinned_room(), with_embedding(4), pin(("b", 0, 4), headroom=0.1))
    assert not d.fits and d.shares[0].why == "layers 1-4; inside what it lends but into the 10% headroom by 409.6 MiB"
    assert d.notes[-1] == "the room cannot hold the model in what it lends less the 10% headroom: some devices are over"
    # without headroom, 5 layers of 1 GiB on b (4 GiB) are over what it lends by 1 GiB
    d = deal(pinned_room(), with_embedding(5), pin(("b", 0, 5)))
    assert not d.fits and d.shares[0].why == "layers 1-5; over what it lends by 1 GiB"
    assert d.notes[-1] == "the room cannot hold the model in what it lends: some devices are over"


def test_a_room_that_holds_no_layer_names_each_devices_shortfall():
    # first layer 3 MiB + its q8 KV (512 B/token * 2048 / 2 = 0.5 MiB) = 3.5 MiB; the host
    # (a, most lent) needs the 1 MiB embedding too: 4.5 MiB. Headroom 50%: a may use 1 of
    # its 2 MiB, b 512 KiB of its 1 MiB.
    model = ModelSpec(id="m", name="m", layers=4, hidden=64, layer_bytes=2 * MiB, layer_active_bytes=2 * MiB,
                      layer_flops_per_token=0.0, kv_bytes_per_token=512, embedding_bytes=MiB,
                      layer_sizes=(3 * MiB, 2 * MiB, 2 * MiB, MiB))
    room = [computer("a", 2 * MiB), computer("b", MiB), Device(id="c", lends_bytes=8 * MiB, webgpu=False),
            Device(id="d", lends_bytes=4 * MiB, compute_flops=0.0)]
    with pytest.raises(DealError) as e:
        deal(room, model, DealOptions(context_tokens=2048, kv_cache="q8", headroom=0.5))
    assert str(e.value) == (
        "no device can hold a layer: a lends 2 MiB (1 MiB after headroom), needs 4.5 MiB for one layer"
        " + embedding/head/draft (short 3.5 MiB); b lends 1 MiB (512 KiB after headroom), needs 3.5 MiB"
        " for one layer (short 3 MiB); c: no WebGPU; d: compute 0 TFLOPS (zero capacity)")
    # layers of one size: 2 MiB + 0.5 MiB of q8 KV; no embedding, no headroom
    flat = ModelSpec(id="f", name="f", layers=4, hidden=64, layer_bytes=2 * MiB, layer_active_bytes=2 * MiB,
                     layer_flops_per_token=0.0, kv_bytes_per_token=512)
    with pytest.raises(DealError) as e:
        deal([computer("a", 2 * MiB)], flat, DealOptions(context_tokens=2048, kv_cache="q8"))
    assert str(e.value) == ("no device can hold a layer: a lends 2 MiB, needs 2.5 MiB for one layer"
                            " + embedding/head/draft (short 512 KiB)")
    with pytest.raises(DealError) as e:
        deal([Device(id="a", lends_bytes=GiB, compute_flops=0.0), Device(id="b", lends_bytes=GiB, s_per_layer=0.0)],
             flat)
    assert str(e.value) == ("no device can compute a layer: a: compute 0 TFLOPS (zero capacity); "
                            "b: ms_per_layer 0 ms (zero capacity)")


def test_repeated_device_ids_are_named_once_each():
    room = [computer("b", GiB), computer("a", GiB), computer("b", GiB), computer("c", GiB), computer("a", GiB)]
    with pytest.raises(DealError) as e:
        deal(room, with_embedding(4))
    assert str(e.value) == "duplicate device id: a, b"


@pytest.mark.parametrize("host,message", [
    ("c", "host 'c' has no WebGPU and cannot hold layers"),
    ("d", "host 'd' cannot compute (d: compute 0 TFLOPS (zero capacity)); the model host keeps at least one layer"),
    ("e", "host 'e' lends no memory; the model host keeps at least one layer"),
])
def test_a_forced_host_that_cannot_keep_a_layer_is_refused(host, message):
    with pytest.raises(DealError) as e:
        deal(pinned_room(), with_embedding(4), DealOptions(host=host))
    assert str(e.value) == message


def test_a_forced_host_that_lends_one_byte_still_keeps_a_layer_and_does_not_fit():
    d = deal(pinned_room(), with_embedding(4), DealOptions(host="f"))
    assert (d.host, d.stages[0].device, d.stages[0].layers, d.fits) == ("f", "f", 1, False)


# --- the memory split's notes: who gets layers and why -------------------------------

SPLIT_NOTE = ("split memory: {n} devices get {basis} in proportion to what they lend for layers (less the "
              "headroom; the host's less its embedding, head and draft)")


def phone(id_: str, n_bytes: int) -> Device:
    return Device(id=id_, kind="phone", lends_bytes=n_bytes)


def test_the_memory_split_leaves_a_phone_out_while_the_computers_hold_the_model():
    # 10 layers of 1 GiB: a (host) holds 8 - 2 = 6 beside its embedding, b 4: exactly 10.
    room = [computer("a", 8 * GiB), computer("b", 4 * GiB), phone("p", 4 * GiB)]
    d = deal(room, with_embedding(10), DealOptions(split="memory"))
    assert shown(d) == {"a": "1-6", "b": "7-10", "p": "asks only"}
    assert "p asks only: phone left out, computers hold the model" in d.notes
    assert SPLIT_NOTE.format(n=2, basis="layers") in d.notes
    assert not any(n.startswith("phones get layers") for n in d.notes)


def test_the_memory_split_says_why_phones_get_layers():
    room = [computer("a", 8 * GiB), computer("b", 4 * GiB), phone("p", 4 * GiB)]
    d = deal(room, with_embedding(10), DealOptions(split="memory", phone_layers=True))
    assert "phones get layers: phone_layers is on" in d.notes and "p" in {s.device for s in d.stages}
    # the computers hold 2 + 2 of the 10 layers: the phone must take some
    d = deal([computer("a", 4 * GiB), computer("b", 2 * GiB), phone("p", 8 * GiB)], with_embedding(10),
             DealOptions(split="memory"))
    assert "phones get layers: the computers cannot hold the model" in d.notes
    # phone_layers on in a room of no phones: no such note
    d = deal([computer("a", 8 * GiB), computer("b", 4 * GiB)], with_embedding(10),
             DealOptions(split="memory", phone_layers=True))
    assert not any(n.startswith("phones get layers") for n in d.notes)


def test_the_memory_split_leaves_out_a_device_that_cannot_hold_one_layer_when_the_rest_hold_the_model():
    # a 6 + b 4 = 10 layers exactly; c (512 MiB) holds none
    room = [computer("a", 8 * GiB), computer("b", 4 * GiB), computer("c", GiB // 2)]
    d = deal(room, with_embedding(10), DealOptions(split="memory"))
    assert shown(d) == {"a": "1-6", "b": "7-10", "c": "asks only"}
    assert "c asks only: cannot hold one layer in what it lends" in d.notes


def test_the_memory_split_of_two_layers_over_three_devices_leaves_one_asking():
    room = [computer("a", 8 * GiB), computer("b", 4 * GiB), computer("c", 4 * GiB)]
    d = deal(room, with_embedding(2), DealOptions(split="memory"))
    assert [s.layers for s in d.stages] == [1, 1]
    assert sum(n.endswith("asks only: more devices than layers") for n in d.notes) == 1
    assert SPLIT_NOTE.format(n=2, basis="layers") in d.notes


def test_the_memory_split_of_layers_of_two_sizes_deals_bytes_even_with_one_layer_each():
    model = ModelSpec(id="two", name="two", layers=2, hidden=64, layer_bytes=2 * MiB, layer_active_bytes=2 * MiB,
                      layer_flops_per_token=0.0, kv_bytes_per_token=0, layer_sizes=(3 * MiB, MiB))
    d = deal([computer("a", 8 * MiB), computer("b", 8 * MiB)], model, DealOptions(split="memory"))
    assert SPLIT_NOTE.format(n=2, basis="bytes") in d.notes


def test_a_tail_range_counts_the_layers_before_its_start_that_fit_too():
    from planner.deal import _holds_from
    # layers of 1, 1, 2, 1 MiB, each with 0.5 MiB of q8 KV (512 B/token * 2048 / 2);
    # the host keeps a 1 MiB embedding. A worker starting at layer 3 (index 2) holds
    # layers 3-4 (2.5 + 1.5 = 4 MiB) and, with what is left, layers before it, last first.
    model = ModelSpec(id="t", name="t", layers=4, hidden=64, layer_bytes=MiB, layer_active_bytes=MiB,
                      layer_flops_per_token=0.0, kv_bytes_per_token=512, embedding_bytes=MiB,
                      layer_sizes=(MiB, MiB, 2 * MiB, MiB))
    opts = DealOptions(context_tokens=2048, kv_cache="q8")
    held = {lends: _holds_from(computer("b", lends), model, opts, False, 2)
            for lends in (27 * MiB // 4, 15 * MiB // 2, 19 * MiB // 2)}
    # 6.75 MiB: 2.75 left, layer 2 (1.5) fits, 1.25 left < 1.5 for layer 1 -> 3
    # 7.5 MiB: 3.5 left, layers 2 and 1 fit (1.5 each) -> 4; 9.5 MiB: still 4, the whole model
    assert held == {27 * MiB // 4: 3, 15 * MiB // 2: 4, 19 * MiB // 2: 4}
    # a range that does not reach the last layer holds what fits from its start: 1.5, then
    # 1.5 + 2.5 = 4 > 3 MiB -> 1
    assert _holds_from(computer("b", 3 * MiB), model, opts, False, 1) == 1
    # the host, from layer 1, beside its 1 MiB embedding: 6 - 1 = 5 MiB for 1.5 + 1.5, and
    # 2.5 more would be 5.5 -> 2
    assert _holds_from(computer("a", 6 * MiB), model, opts, True, 0) == 2


def kv_model(layers: int) -> ModelSpec:
    """Layers of 1 GiB with 1 KiB of f16 KV a token: 64 MiB a layer per cache of 65,536 positions."""
    return ModelSpec(id="kv", name="kv", layers=layers, hidden=64, layer_bytes=GiB, layer_active_bytes=GiB,
                     layer_flops_per_token=0.0, kv_bytes_per_token=1024)


def test_a_room_that_cannot_hold_every_kv_cache_asked_is_dealt_fewer():
    fewer = "{n} of the {asked} questions in flight fit: each keeps a KV cache of 65,536 positions on every stage"
    # 4 layers on a alone need 4 GiB + n * 256 MiB: in 4 GiB + 800 MiB, 3 caches fit, not 4
    a = [computer("a", 4 * GiB + 800 * MiB)]
    d = deal(a, kv_model(4), DealOptions(context_tokens=65536, kv_caches=6))
    assert (d.kv_caches, d.fits, d.notes[-1]) == (3, True, fewer.format(n=3, asked=6))
    # asked what fits: no note
    d = deal(a, kv_model(4), DealOptions(context_tokens=65536, kv_caches=2))
    assert d.kv_caches == 2 and not any("questions in flight fit" in n for n in d.notes)
    # one layer of 1 GiB + n * 64 MiB in 1 GiB + 200 MiB: with 4 caches or more nobody can
    # hold a layer (the deal is refused), with 3 it fits
    d = deal([computer("a", GiB + 200 * MiB)], kv_model(1), DealOptions(context_tokens=65536, kv_caches=6))
    assert (d.kv_caches, d.fits, d.notes[-1]) == (3, True, fewer.format(n=3, asked=6))



def test_the_kv_cache_search_goes_down_to_one_cache_past_refusals_and_misfits():
    # 4 layers on a alone need 4 GiB + n * 256 MiB; a lends 4 GiB + 100 MiB, so neither 2
    # caches nor 1 fit (while 3 layers and a cache do: the deal is made, not refused). The
    # search goes down to one cache and keeps that deal, saying it does not fit.
    d = deal([computer("a", 4 * GiB + 100 * MiB)], kv_model(4), DealOptions(context_tokens=65536, kv_caches=2))
    assert (d.kv_caches, d.fits) == (1, False)
    assert d.notes[-1] == ("1 of the 2 questions in flight fit: each keeps a KV cache of 65,536 positions on "
                           "every stage")
    # one layer of 1 GiB + n * 64 MiB in 1 GiB + 100 MiB: with 2 caches nobody can hold the
    # layer (deal_one refuses), with 1 it fits: the search goes on past the refusal
    d = deal([computer("a", GiB + 100 * MiB)], kv_model(1), DealOptions(context_tokens=65536, kv_caches=2))
    assert (d.kv_caches, d.fits) == (1, True)

# --- what a device holds, its budget and its context, by hand --------------------------

def spec(layers: int, layer_bytes: int, kv_per_token: int = 0, sizes: tuple[int, ...] = (),
         embedding: int = 0) -> ModelSpec:
    return ModelSpec(id="m", name="m", layers=layers, hidden=64, layer_bytes=layer_bytes,
                     layer_active_bytes=layer_bytes, layer_flops_per_token=0.0, kv_bytes_per_token=kv_per_token,
                     embedding_bytes=embedding, layer_sizes=sizes)


def test_holds_layers_counts_what_fits_by_hand():
    from planner.deal import holds_layers
    # layers of no bytes: a device with any byte free holds all 30, with none free none
    free_layers = spec(30, 0, embedding=MiB)
    assert holds_layers(computer("a", MiB), free_layers, DealOptions(), True) == 0  # the embedding takes it all
    assert holds_layers(computer("a", MiB + 1), free_layers, DealOptions(), True) == 30
    # layers of 1 byte: 5 bytes hold 5 of them
    assert holds_layers(computer("a", 5), spec(30, 1), DealOptions(), False) == 5
    # layers of 100, 100, 100, 101 B, 1 B of KV a token over 10 positions (10 B a layer in
    # f16, 5 in q8): 420 B hold 3 either way (f16 330, 441 over; q8 315, 421 over), 421 B
    # with q8 all 4
    uneven4 = spec(4, 100, kv_per_token=1, sizes=(100, 100, 100, 101))
    assert holds_layers(computer("a", 420), uneven4, DealOptions(context_tokens=10), False, 0) == 3
    assert holds_layers(computer("a", 420), uneven4, DealOptions(context_tokens=10, kv_cache="q8"), False, 0) == 3
    assert holds_layers(computer("a", 421), uneven4, DealOptions(context_tokens=10, kv_cache="q8"), False, 0) == 4


def test_a_layer_budget_is_what_a_device_lends_less_the_hosts_extras():
    from planner.deal import layer_budget_bytes
    assert layer_budget_bytes(computer("a", 1000), with_embedding(), DealOptions(), False) == 1000
    assert layer_budget_bytes(computer("a", 3 * GiB), with_embedding(), DealOptions(), True) == GiB
    assert layer_budget_bytes(computer("a", GiB), with_embedding(), DealOptions(), True) == 0  # never below 0
    no_gpu = Device(id="g", kind="computer", lends_bytes=10 * GiB, webgpu=False)
    assert layer_budget_bytes(no_gpu, with_embedding(), DealOptions(), False) == 0


def test_max_context_is_what_is_left_after_the_weights_over_the_kv_a_token():
    from planner.deal import Stage, max_context
    # two layers of 1000 B, 10 B of f16 KV a token each: 20 B a token; 4000 B lent less
    # 2000 B of weights leave 2000 B: 100 tokens
    m = spec(4, 1000, kv_per_token=10)
    assert max_context(computer("a", 4000), Stage("a", 0, 2), False, m, DealOptions()) == 100
    assert max_context(computer("a", 3999), Stage("a", 0, 2), False, m, DealOptions()) == 99
    assert max_context(computer("a", 4000), None, False, m, DealOptions()) is None  # a guest keeps no KV


def test_the_stage_of_a_device_is_its_own():
    from planner.deal import Deal, Stage
    d = Deal(host="h", split="pinned", stages=(Stage("h", 0, 1), Stage("w", 1, 3)), guests=("g",), fits=True, notes=())
    assert (d.stage_of("h"), d.stage_of("w"), d.stage_of("g")) == (Stage("h", 0, 1), Stage("w", 1, 3), None)


# --- the speed split's order, the host's layer, and the holds it starts from ------------

def test_the_speed_split_fills_the_device_that_holds_more_first():
    # a hosts (forced) with 4 of 10 layers; c holds 5, b 3, at the same (unmeasured) speed:
    # fewest hops puts c next (it holds more), then b gets the last layer
    room = [computer("a", 4 * GiB), computer("b", 3 * GiB), computer("c", 5 * GiB)]
    d = deal(room, spec(10, GiB), DealOptions(host="a"))
    assert shown(d) == {"a": "1-4", "c": "5-9", "b": "10"}


def test_a_host_given_one_layer_by_the_rule_takes_it_from_the_device_with_most():
    # two layers of 1 GiB and a 2 GiB embedding: the forced host a (2 GiB) holds none
    # beside it, b holds both; the host keeps one layer, taken from b, which keeps the other
    room = [computer("a", 2 * GiB), computer("b", 4 * GiB)]
    d = deal(room, with_embedding(2), DealOptions(host="a"))
    assert shown(d) == {"a": "1", "b": "2"}
    assert "a keeps one layer (the model host always does); taken from b" in d.notes
    assert not d.fits  # a needs 3 GiB for it


def test_a_host_holds_from_the_first_layer_a_worker_from_the_mean_layer():
    # layers of 4, 1, 1, 1 MiB (mean 1.75): a host of 2 MiB cannot hold layer 1, however
    # small the rest: alone it holds no layer
    m = spec(4, 7 * MiB // 4, sizes=(4 * MiB, MiB, MiB, MiB))
    with pytest.raises(DealError, match=r"^no device can hold a layer: a lends 2 MiB, needs 4 MiB for one layer"):
        deal([computer("a", 2 * MiB)], m, DealOptions())
    # a worker's range starts later: b (2 MiB) holds one layer at the mean size, so the room
    # is dealt. holds a 0, b 1: leftover 3 by lends (3 : 2 MiB) gives a 2, b 1 -> a 1-2,
    # b 3-4; again from those starts (a 0, b 2: layers 3-4 fit in 2 MiB): leftover 2 gives
    # a 1, b 1 -> a 1, b 2-4; from there (b from layer 2: 2 of 3 MiB fit) nothing changes
    d = deal([computer("a", 3 * MiB), computer("b", 2 * MiB)], m, DealOptions())
    assert shown(d) == {"a": "1", "b": "2-4"} and not d.fits
    assert "the room holds 2 of 4 layers: leftover 2 layers spread by memory" in d.notes


def test_a_re_dealt_host_still_counts_its_embedding():
    # layers of 4 and 2 MiB, 0.5 MiB of f16 KV each (512 B x 1024 positions), a 1 MiB
    # embedding: b (host, 7 MiB) holds layer 1 beside it (1 + 4.5 = 5.5; 8 with layer 2),
    # a (6.5 MiB) layer 2 (2.5)
    m = spec(2, 2 * MiB, kv_per_token=512, sizes=(4 * MiB, 2 * MiB), embedding=MiB)
    d = deal([computer("a", 13 * MiB // 2), computer("b", 7 * MiB)], m, DealOptions(context_tokens=1024))
    assert d.host == "b" and shown(d) == {"b": "1", "a": "2"} and d.fits


# --- the memory split: caps, one layer each, and bytes with their KV --------------------

def test_the_memory_split_caps_each_share_at_what_it_holds():
    # 5 layers of 2 MiB + 0.5 MiB KV (2.5 MiB): b (host, 10 MiB) holds 4, a (4.5 MiB) 1.
    # By what they lend (10 : 4.5) the quotas are 3.45 and 1.55: floors 3 and 1, and the
    # layer left would go to a (0.55 short of its quota), but a is at its cap: b gets it
    m = spec(5, 2 * MiB, kv_per_token=512)
    d = deal([computer("a", 9 * MiB // 2), computer("b", 10 * MiB)], m,
             DealOptions(context_tokens=1024, split="memory"))
    assert shown(d) == {"b": "1-4", "a": "5"} and d.fits


def test_the_memory_split_gives_every_taker_one_layer_at_least():
    # 3 layers: a lends 10 MiB, b 1 MiB: quotas 2.73 and 0.27; b still gets one
    d = deal([computer("a", 10 * MiB), computer("b", MiB)], spec(3, MiB), DealOptions(split="memory"))
    assert shown(d) == {"a": "1-2", "b": "3"}


def test_a_device_lending_one_byte_takes_a_layer_when_the_room_cannot_hold_the_model():
    # 10 layers of 1 GiB: a (host) holds 6 beside its 2 GiB embedding, b lends 1 byte;
    # the memory split then deals every lender at least one layer: a 9, b 1 (over)
    d = deal([computer("a", 8 * GiB), computer("b", 1)], with_embedding(10), DealOptions(split="memory"))
    assert shown(d) == {"a": "1-9", "b": "10"} and not d.fits


def test_the_memory_split_of_uneven_layers_moves_a_cut_to_fit_the_budgets():
    # layers of 1, 3, 2 MiB; a (host, forced) may use 3.75 MiB, b 5 MiB. The quota
    # 6 x 3.75 / 8.75 = 2.57 MiB is nearest the cut after layer 2 (4 MiB, over a's 3.75);
    # b has room for layer 2 (2 + 3 = 5): the cut moves back, a 1, b 2-3
    m = spec(3, 2 * MiB, sizes=(MiB, 3 * MiB, 2 * MiB))
    d = deal([computer("a", 15 * MiB // 4), computer("b", 5 * MiB)], m, DealOptions(split="memory", host="a"))
    assert shown(d) == {"a": "1", "b": "2-3"} and d.fits


def test_the_memory_split_of_uneven_layers_counts_each_layers_kv():
    # layers of 1, 3, 2 MiB with 1 MiB of q8 KV each (1024 B x 2048 positions / 2): costs
    # 2, 4, 3 MiB. a (host, 9 MiB) and b (11 MiB): quota 9 x 9/20 = 4.05 MiB, nearer the
    # cut after layer 2 (6) than after layer 1 (2): a 1-2, b 3. (With f16 KV the costs
    # would be 3, 5, 4 and the quota 5.4, nearer 3: a 1.)
    m = spec(3, 2 * MiB, kv_per_token=1024, sizes=(MiB, 3 * MiB, 2 * MiB))
    d = deal([computer("a", 9 * MiB), computer("b", 11 * MiB)], m,
             DealOptions(context_tokens=2048, kv_cache="q8", split="memory", host="a"))
    assert shown(d) == {"a": "1-2", "b": "3"} and d.fits
    # layers of 2, 1, 3 MiB with 1 MiB of f16 KV: costs 3, 2, 4; both 5 MiB: quota 4.5 is
    # nearer 5 (after layer 2) than 3: a 1-2 (5 MiB), b 3 (4 MiB)
    m = spec(3, 2 * MiB, kv_per_token=512, sizes=(2 * MiB, MiB, 3 * MiB))
    d = deal([computer("a", 5 * MiB), computer("b", 5 * MiB)], m,
             DealOptions(context_tokens=2048, split="memory", host="a"))
    assert shown(d) == {"a": "1-2", "b": "3"} and d.fits
