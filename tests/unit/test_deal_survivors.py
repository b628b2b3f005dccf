"""planner/deal.py by hand: the values and sentences its functions give, each computed
from the rules in the module and function docs, not from running the planner.

Grouped by function. Toy models have layers of round sizes and, unless a test says
otherwise, no embedding, head, draft or KV cache, so what a device "holds" is what it
lends divided by the layer size. Options use ``DealOptions()``'s headroom of 0.

Some functions here loop until a count is reached (:func:`planner.deal.apportion`,
:func:`planner.deal.cut_by_bytes`, :func:`planner.deal.deal`'s KV caches); those tests
run under :func:`within`, so a loop that never ends fails the test in seconds instead
of hanging it.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import pytest

from planner.deal import (Deal, DealError, DeviceShare, Stage, _holds_from, _speed_estimates, apportion,
                          cut_by_bytes, deal, deal_for, format_bytes, max_context, speed_ratio)
from planner.model import ModelSpec
from planner.room import (DEFAULT_SAMPLE_S_PER_TOKEN, Decoding, DealOptions, Device, Network, PinnedStage,
                          Scenario)
from tests.fuzzing import Hang, time_limit

GiB = 2**30
TiB = 2**40


class TookTooLong(AssertionError):
    """A call that should take microseconds was still running after the guard's limit."""


@contextmanager
def within(seconds: float = 5.0):
    """Fail (raise :class:`TookTooLong`) when the block runs longer than ``seconds`` of
    wall-clock time (tests.fuzzing.time_limit's alarm; pytest runs tests in the main thread)."""
    try:
        with time_limit(seconds):
            yield
    except Hang:
        raise TookTooLong(f"still running after {seconds} s") from None


@pytest.fixture(autouse=True)
def _bounded():
    """Every test of this file under :func:`within`: each takes milliseconds, and a loop
    that never ends (apportion's fill, deal's KV-cache search) then fails instead of hanging."""
    with within(10.0):
        yield


def toy(layers: int = 40, layer_bytes: int = GiB, kv: int = 0, **kw) -> ModelSpec:
    """``layers`` layers of ``layer_bytes`` each, ``kv`` bytes of f16 KV per token per layer."""
    return ModelSpec(id=f"toy-{layers}", name=f"toy-{layers}", layers=layers, hidden=64,
                     layer_bytes=layer_bytes, layer_active_bytes=layer_bytes,
                     layer_flops_per_token=0.0, kv_bytes_per_token=kv, **kw)


def computer(id_: str, lends: float, ms: float | None = None, **kw) -> Device:
    """A WebGPU computer lending ``lends`` bytes (optionally measured ``ms`` per layer)."""
    return Device(id=id_, kind="computer", lends_bytes=int(lends),
                  s_per_layer=None if ms is None else ms / 1000, **kw)


def phone(id_: str, lends: float, ms: float | None = None, **kw) -> Device:
    """A WebGPU phone lending ``lends`` bytes."""
    return Device(id=id_, kind="phone", lends_bytes=int(lends),
                  s_per_layer=None if ms is None else ms / 1000, **kw)


def ranges(d: Deal) -> dict[str, str]:
    """device -> 1-based inclusive range, as people read it."""
    return {s.device: s.shown for s in d.stages}


# --- Deal.pinned ---------------------------------------------------------------------

def test_a_pinned_deal_is_split_pinned_with_no_guests_fits_and_no_notes():
    d = Deal.pinned("a", [("a", 0, 3), ("b", 3, 5)])
    assert d.host == "a"
    assert d.split == "pinned"
    assert d.stages == (Stage("a", 0, 3), Stage("b", 3, 5))
    assert d.guests == () and isinstance(d.guests, tuple)
    assert d.fits is True
    assert d.notes == () and isinstance(d.notes, tuple)
    assert d.shares == () and d.predicted is None and d.kv_caches is None


# --- Deal.to_json --------------------------------------------------------------------

def _small_deal(predicted: dict | None = None) -> Deal:
    return Deal(host="a", split="speed", stages=(Stage("a", 0, 2), Stage("b", 2, 5)), guests=("c",), fits=False,
                notes=("first note", "second note"),
                shares=(DeviceShare("a", "model host", 2, 3, 2000, 4000, "layers 1-2", 700),
                        DeviceShare("b", "worker", 3, 2, 3000, 2500, "layers 3-5; over", 500),
                        DeviceShare("c", "guest", 0, 0, 0, 100, "not needed")),
                predicted=predicted, kv_caches=2)


def test_to_json_writes_every_key_of_a_small_deal():
    # max_context: the smallest of the stages' (700, 500) -> 500; the guest's None is no stage
    expected = {
        "host": "a",
        "split": "speed",
        "stages": [{"device": "a", "start": 0, "end": 2, "max_context": 700},
                   {"device": "b", "start": 2, "end": 5, "max_context": 500}],
        "guests": ["c"],
        "fits": False,
        "max_context": 500,
        "kv_caches": 2,
        "notes": ["first note", "second note"],
        "devices": [
            {"device": "a", "role": "model host", "layers": 2, "holds_layers": 3, "used_bytes": 2000,
             "lends_bytes": 4000, "why": "layers 1-2", "max_context": 700},
            {"device": "b", "role": "worker", "layers": 3, "holds_layers": 2, "used_bytes": 3000,
             "lends_bytes": 2500, "why": "layers 3-5; over", "max_context": 500},
            {"device": "c", "role": "guest", "layers": 0, "holds_layers": 0, "used_bytes": 0,
             "lends_bytes": 100, "why": "not needed", "max_context": None},
        ],
    }
    got = _small_deal().to_json()
    assert "predicted" not in got  # only for a deal that has a prediction
    assert got == expected


def test_to_json_has_predicted_only_when_the_deal_has_one():
    got = _small_deal(predicted={"lap_s": 0.5, "tokens_per_s": 2.0}).to_json()
    assert got["predicted"] == {"lap_s": 0.5, "tokens_per_s": 2.0}
    assert sorted(got) == sorted(["host", "split", "stages", "guests", "fits", "max_context", "kv_caches",
                                  "notes", "predicted", "devices"])


# --- format_bytes --------------------------------------------------------------------

def test_format_bytes_reads_tebibytes_and_stays_in_them_beyond_1024():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(512 * 2**20) == "512 MiB"
    assert format_bytes(1.5 * GiB) == "1.5 GiB"
    assert format_bytes(1023 * GiB) == "1023 GiB"
    assert format_bytes(TiB) == "1 TiB"               # 2^40 / 1024^4 = 1
    assert format_bytes(1.5 * TiB) == "1.5 TiB"
    assert format_bytes(1536 * GiB) == "1.5 TiB"      # 1536 / 1024 = 1.5
    assert format_bytes(2048 * TiB) == "2048 TiB"     # no unit above TiB
    assert format_bytes(1024.5 * TiB) == "1024.5 TiB"


# --- speed_ratio ---------------------------------------------------------------------

def test_speed_ratio_names_each_basis():
    # copy speeds 300 / 100 GB/s -> 3x
    assert speed_ratio(computer("f", GiB, copy_speed_Bps=300e9), computer("s", GiB, copy_speed_Bps=100e9)) == \
        (3.0, "copies GPU memory")
    # no copy speeds: bandwidths 400 / 100 GB/s -> 4x
    assert speed_ratio(computer("f", GiB, memory_bandwidth_Bps=400e9), computer("s", GiB, memory_bandwidth_Bps=100e9)) \
        == (4.0, "has the memory bandwidth (copy speed estimated from it)")
    # only measured time per layer: 2 ms against 8 ms -> 8 / 2 = 4x (inverse ratio)
    ratio, basis = speed_ratio(computer("f", GiB, ms=2.0), computer("s", GiB, ms=8.0))
    assert ratio == pytest.approx(4.0)
    assert basis == "runs a layer (copy speed estimated from ms per layer)"
    assert speed_ratio(computer("f", GiB), computer("s", GiB, ms=8.0)) is None


# --- _used_bytes (through the deal's shares) --------------------------------------------

@pytest.mark.parametrize("kv_cache, lends, used", [
    # 4 layers of 1000 B, 1 B of f16 KV a token at 1,000 tokens: KV 1000 B a layer (f16),
    # 1000 // 2 = 500 (q8), 2000 (f32); one device lending exactly 4 layers' worth
    ("q8", 4 * 1500, 4 * 1500),
    ("f16", 4 * 2000, 4 * 2000),
    ("f32", 4 * 3000, 4 * 3000),
])
def test_used_bytes_count_the_kv_at_the_rooms_kv_precision(kv_cache, lends, used):
    model = toy(4, 1000, kv=1)
    d = deal([computer("solo", lends)], model, DealOptions(context_tokens=1000, kv_cache=kv_cache))
    (share,) = d.shares
    assert share.used_bytes == used
    assert d.fits
    assert share.why == "layers 1-4"


# --- max_context ---------------------------------------------------------------------

def _ctx(lends: int, stage: Stage | None, is_host: bool = False, kv_cache: str = "f16", kv_caches: int = 1,
         model: ModelSpec | None = None) -> int | None:
    model = model or toy(4, 1000, kv=10)
    return max_context(computer("d", lends), stage, is_host, model,
                       DealOptions(kv_cache=kv_cache, kv_caches=kv_caches))


def test_max_context_by_hand_for_each_kv_precision():
    two = Stage("d", 0, 2)  # 2 layers of 1000 B weights, 10 B of f16 KV a token each
    # free = 10000 - 2000 = 8000; KV a token: 2 * 10 = 20 (f16), 10 (q8), 40 (f32)
    assert _ctx(10000, two, kv_cache="f16") == 8000 // 20 == 400
    assert _ctx(10000, two, kv_cache="q8") == 8000 // 10 == 800
    assert _ctx(10000, two, kv_cache="f32") == 8000 // 40 == 200
    # 8010 free: 8010 / 40 = 200.25 -> 200 whole tokens
    assert _ctx(10010, two, kv_cache="f32") == 200


def test_max_context_of_the_host_counts_its_extras_and_each_cache_in_flight():
    model = toy(4, 1000, kv=10, embedding_bytes=500, head_bytes=300, draft_bytes=200)
    two = Stage("d", 0, 2)
    # free = 10000 - 2000 - (500 + 300 + 200) = 7000; 7000 // 20 = 350
    assert _ctx(10000, two, is_host=True, model=model) == 350
    # two caches in flight: 8000 // (20 * 2) = 200 positions each
    assert _ctx(10000, two, kv_caches=2) == 200


def test_max_context_is_zero_when_the_weights_do_not_fit_or_leave_less_than_a_token():
    two = Stage("d", 0, 2)
    assert _ctx(1500, two) == 0   # 1500 - 2000 < 0
    assert _ctx(2010, two) == 0   # 10 free < 20 a token
    assert _ctx(2020, two) == 1   # 20 free: one token


def test_max_context_is_none_without_kv():
    assert _ctx(10000, None) is None            # a coordinator: no layers
    assert _ctx(10000, Stage("d", 2, 2)) is None  # a range of 0 layers
    assert _ctx(10000, Stage("d", 0, 2), model=toy(4, 1000, kv=0)) is None


def test_max_context_of_one_byte_of_kv_a_token_is_bounded():
    # 1 layer, 1 B of f16 KV a token: 1500 - 1000 = 500 free -> 500 tokens
    assert _ctx(1500, Stage("d", 0, 1), model=toy(4, 1000, kv=1)) == 500
    # q8 halves it: 0.5 B a token -> 1000 tokens
    assert _ctx(1500, Stage("d", 0, 1), kv_cache="q8", model=toy(4, 1000, kv=1)) == 1000


def test_max_context_is_exact_in_whole_tokens_beyond_float_precision():
    # 3 B of KV a token, free = 3 * 2^54 - 1 bytes (more than a float's 53 bits):
    # 3 * 2^54 - 1 = 3 * (2^54 - 1) + 2, so 2^54 - 1 whole tokens fit, not 2^54.
    model = toy(4, 1, kv=3)
    got = _ctx(3 * 2**54 - 1 + 1, Stage("d", 0, 1), model=model)  # lends = free + 1 B of weights
    assert got == 2**54 - 1
    assert got * 3 <= 3 * 2**54 - 1


# --- apportion (Hamilton's largest remainder) ------------------------------------------

def test_apportion_by_hand():
    with within(1.0):  # a loop that never ends fails in a second
        # 10 by 5:3:2 -> quotas 5, 3, 2 exactly
        assert apportion(10, [5, 3, 2]) == [5, 3, 2]
        # 3 by 20:15:2 -> quotas 1.62, 1.22, 0.16 -> floors 1, 1, 0; the one left to .62
        assert apportion(3, [20, 15, 2]) == [2, 1, 0]
        # weights summing to 1: 4 by 0.25:0.75 -> quotas 1, 3
        assert apportion(4, [0.25, 0.75]) == [1, 3]
        assert apportion(4, [1.0, 0.0]) == [4, 0]
        assert apportion(0, []) == []


def test_apportion_of_zero_weights_splits_evenly_the_earlier_first():
    with within(1.0):
        # quotas 3 / 2 = 1.5 each -> floors 1, 1; the one left: a tie, to index 0
        assert apportion(3, [0, 0]) == [2, 1]
        assert apportion(4, [0, 0]) == [2, 2]
        assert apportion(5, [0, 0, 0]) == [2, 2, 1]


def test_apportion_at_exactly_n_times_the_minimum_gives_each_the_minimum():
    with within(1.0):  # a loop that never ends fails in a second
        # 4 items, 2 shares, minimum 2: each its minimum (2 + 2 = 4)
        assert apportion(4, [1, 1], minimum=2) == [2, 2]
        assert apportion(4, [9, 1], minimum=2) == [2, 2]
        assert apportion(3, [5, 1, 1], minimum=1) == [1, 1, 1]


def test_apportion_below_the_minimums_gives_one_each_to_the_heaviest():
    with within(1.0):  # a loop that never ends fails in a second
        # 1 item, minimum 1 for 3 shares: the heaviest (5) gets it
        assert apportion(1, [1, 5, 3], minimum=1) == [0, 1, 0]
        # 2 items for 4 shares: weights 3, 1, 3, 3 -> the two heaviest, earlier on the tie: 0 and 2
        assert apportion(2, [3, 1, 3, 3], minimum=1) == [1, 0, 1, 0]


def test_apportion_takes_back_what_the_minimums_pushed_over_from_the_most_above_quota():
    with within(1.0):
        # 7 by 30:50:1:1:1 (sum 83), minimum 1: quotas 2.530, 4.217, 0.084 x3
        # -> floors 2, 4, 0, 0, 0 -> minimums 2, 4, 1, 1, 1 = 9, two over.
        # Most above quota (out - quota): index 1 (-0.217) -> 3 (now -1.217);
        # then index 0 (-0.530) -> 1. The three at their minimum give nothing.
        assert apportion(7, [30, 50, 1, 1, 1], minimum=1) == [1, 3, 1, 1, 1]


def test_apportion_takes_back_from_the_earlier_index_on_a_tie():
    with within(1.0):
        # 4 by 3:3:0, minimum 1: quotas 2, 2, 0 -> 2, 2, 1 = 5, one over; indexes 0 and 1
        # are both 0 above quota: the earlier one gives the item back
        assert apportion(4, [3, 3, 0], minimum=1) == [1, 2, 1]


def test_apportion_respects_caps_that_hold_the_total_and_ignores_those_that_cannot():
    with within(1.0):
        # 10 by 1:1:1, caps 2, 10, 10: quotas 3.33 -> 2 (cap), 3, 3 = 8; two left, each to
        # the furthest below quota under its cap: index 1 (0.33, earlier on the tie), then 2
        assert apportion(10, [1, 1, 1], caps=[2, 10, 10]) == [2, 4, 4]
        # caps 1 + 1 cannot hold 6: ignored
        assert apportion(6, [1, 1], caps=[1, 1]) == [3, 3]


# --- _speed_estimates ----------------------------------------------------------------

def test_speed_estimates_from_measured_computers():
    room = [computer("a", GiB, ms=2.0), computer("b", GiB, ms=4.0), computer("c", GiB, ms=9.0),
            computer("d", GiB), phone("e", GiB), phone("f", GiB, ms=100.0)]
    got = _speed_estimates(room)
    # measured keep theirs; the median computer (2, 4, 9 ms -> 4 ms) for an unmeasured
    # computer; an unmeasured phone 20x that: 80 ms
    assert got == pytest.approx({"a": 0.002, "b": 0.004, "c": 0.009, "d": 0.004, "e": 0.080, "f": 0.100})


def test_speed_estimates_when_only_phones_are_measured():
    room = [phone("p1", GiB, ms=100.0), phone("p2", GiB, ms=300.0), phone("p3", GiB), computer("c", GiB)]
    got = _speed_estimates(room)
    # median phone (100, 300 -> 200 ms) is 20x an unmeasured computer: 10 ms; an
    # unmeasured phone 20x that again: 200 ms
    assert got == pytest.approx({"p1": 0.100, "p2": 0.300, "p3": 0.200, "c": 0.010})


def test_speed_estimates_when_nothing_is_measured_count_a_phone_20x_a_computer():
    got = _speed_estimates([computer("c1", GiB), computer("c2", GiB), phone("p", GiB)])
    assert got["c1"] == got["c2"]
    assert got["p"] == pytest.approx(20 * got["c1"])


# --- _holds_from ---------------------------------------------------------------------

def _sized(sizes: tuple[int, ...], **kw) -> ModelSpec:
    return ModelSpec(id="sized", name="sized", layers=len(sizes), hidden=64,
                     layer_bytes=-(-sum(sizes) // len(sizes)), layer_active_bytes=1,
                     layer_flops_per_token=0.0, kv_bytes_per_token=0, layer_sizes=sizes, **kw)


def test_a_host_tail_range_counts_earlier_layers_beside_its_extras():
    # 4 layers of 2 B, 3 B of embedding; the host lends 9: 9 - 3 = 6 B for layers.
    # From layer 3 (index 2): layers 3-4 (4 B) reach the end, 2 B spare -> layer 2 too
    # (2 B), nothing left for layer 1 -> 3 (= 6 // 2)
    model = _sized((2, 2, 2, 2), embedding_bytes=3)
    assert _holds_from(computer("h", 9), model, DealOptions(), True, 2) == 3
    # as a worker (no extras): 9 - 4 = 5 spare -> layers 2 and 1 (2 + 2) -> 4
    assert _holds_from(computer("h", 9), model, DealOptions(), False, 2) == 4


def test_a_device_without_webgpu_holds_nothing_wherever_its_range_starts():
    model = _sized((1, 1, 1, 1))
    assert _holds_from(computer("x", 100, webgpu=False), model, DealOptions(), False, 2) == 0


def test_holds_from_on_layers_of_one_size_is_what_fits():
    # 20 B over layers of 1 B: 20, counted as holds_layers counts it (not capped at the 5 left)
    assert _holds_from(computer("x", 20), toy(10, 1), DealOptions(), False, 5) == 20


# --- cut_by_bytes --------------------------------------------------------------------

def test_cut_by_bytes_backward_pass_starts_an_over_range_later():
    with within():
        # 6 layers of 1 B by 1:2:3 -> cuts at the running quotas 1 and 3: counts 1, 2, 3.
        # Budgets 1, 3, 2: the last range (3) is over 2 and the middle (2) has room for one
        # more (2 + 1 <= 3): the last starts one layer later -> 1, 3, 2
        assert cut_by_bytes([1] * 6, [1, 2, 3], [1, 3, 2]) == [1, 3, 2]


# --- _deal_speed: its notes -----------------------------------------------------------

HOST_NOTE = "alpha hosts by memory: WebGPU, computer, lends the most"


def test_speed_notes_name_who_asks_only_and_why_nothing_measured():
    # alpha and beta lend 30 layers' worth each, gamma 5, a phone 2; nobody measured:
    # computers first (the host, then most held), the phone 20x slower last.
    # alpha 1-30, beta 31-40; gamma is not needed, the phone neither (computers hold it)
    room = [computer("alpha", 30 * GiB), computer("beta", 30 * GiB), computer("gamma", 5 * GiB),
            phone("phone", 2 * GiB)]
    d = deal(room, toy())
    assert ranges(d) == {"alpha": "1-30", "beta": "31-40"}
    assert d.notes == (HOST_NOTE,
                       "split speed: filled by fewest hops (nothing measured yet)",
                       "gamma asks only: not needed",
                       "phone asks only: computers hold the model")


def test_speed_notes_when_measured():
    # the same room, every computer at 1 ms a layer: the same order, filled by measurement
    room = [computer("alpha", 30 * GiB, ms=1.0), computer("beta", 30 * GiB, ms=1.0),
            computer("gamma", 5 * GiB, ms=1.0), phone("phone", 2 * GiB)]
    d = deal(room, toy())
    assert ranges(d) == {"alpha": "1-30", "beta": "31-40"}
    assert d.notes == (HOST_NOTE,
                       "split speed: filled by measured time per layer",
                       "gamma asks only: not needed",
                       "phone asks only: computers hold the model")


def test_a_room_that_holds_exactly_the_model_is_filled_not_spread():
    # 30 + 10 = 40 layers held: filled, nothing left over
    d = deal([computer("alpha", 30 * GiB), computer("beta", 10 * GiB)], toy())
    assert ranges(d) == {"alpha": "1-30", "beta": "31-40"}
    assert d.notes == (HOST_NOTE, "split speed: filled by fewest hops (nothing measured yet)")
    assert d.fits


def test_one_layer_left_over_is_one_layer_in_the_note_and_the_host_is_the_model_host():
    # 20 + 19 = 39 of 40: 1 left over by memory 20:19 -> quotas 0.51, 0.49 -> to alpha.
    # alpha 1-21 (21 GiB in 20: 1 GiB over), beta 22-40
    d = deal([computer("alpha", 20 * GiB), computer("beta", 19 * GiB)], toy())
    assert ranges(d) == {"alpha": "1-21", "beta": "22-40"}
    assert d.notes == (HOST_NOTE,
                       "the room holds 39 of 40 layers: leftover 1 layer spread by memory",
                       "the room cannot hold the model in what it lends: some devices are over")
    assert d.shares == (
        DeviceShare("alpha", "model host", 21, 20, 21 * GiB, 20 * GiB, "layers 1-21; over what it lends by 1 GiB"),
        DeviceShare("beta", "worker", 19, 19, 19 * GiB, 19 * GiB, "layers 22-40"),
    )


# --- _count_and_lay_out --------------------------------------------------------------

def test_the_host_keeps_one_layer_taken_from_the_device_with_the_most():
    # host forced, measured slowest (10 ms); alpha (1 ms) takes 30, beta (2 ms) the 10 left,
    # the host none: it keeps one, taken from alpha (30 layers, the most) -> alpha 29
    room = [computer("host", 30 * GiB, ms=10.0), computer("alpha", 30 * GiB, ms=1.0),
            computer("beta", 20 * GiB, ms=2.0)]
    d = deal(room, toy(), DealOptions(host="host"))
    assert [(s.device, s.shown) for s in d.stages] == [("host", "1"), ("alpha", "2-30"), ("beta", "31-40")]
    assert d.notes == ("host hosts: forced by the scenario",
                       "split speed: filled by measured time per layer",
                       "host keeps one layer (the model host always does); taken from alpha")


def test_memory_split_ties_go_to_the_host_even_when_it_is_slower():
    # 5 layers by 10:10 -> quotas 2.5 each -> 2, 2; the one left: a tie, to the host (first
    # in the chain), though the measured order puts fast (1 ms) before it (2 ms)
    room = [computer("host", 10 * GiB, ms=2.0), computer("fast", 10 * GiB, ms=1.0)]
    d = deal(room, toy(5), DealOptions(split="memory", host="host"))
    assert [(s.device, s.shown) for s in d.stages] == [("host", "1-3"), ("fast", "4-5")]


# --- _finish: a coordinator host -------------------------------------------------------

def test_a_coordinator_host_that_lends_exactly_its_extras_fits():
    # the host "hub" holds no layers (pinned stages) and lends exactly its 1 GiB embedding
    model = toy(40, GiB, embedding_bytes=GiB)
    room = [computer("hub", GiB), computer("w", 40 * GiB)]
    d = deal(room, model, DealOptions(host="hub", stages=(PinnedStage("w", 0, 40),)))
    assert d.fits
    assert d.guests == ()
    assert d.shares == (
        DeviceShare("w", "worker", 40, 40, 40 * GiB, 40 * GiB, "layers 1-40"),
        DeviceShare("hub", "model host", 0, 0, GiB, GiB, "coordinator, no layers"),
    )
    assert d.notes == ("hub hosts: forced by the scenario", "stages pinned by the scenario",
                       "hub holds no layers: a coordinator (embedding, head, sampling, drafting)")


# --- deal: KV caches of questions in flight ---------------------------------------------

# 4 layers of 1000 B, 1 B of f16 KV a token, a context of 1,000: a layer needs
# 1000 + 1000 * n bytes with n caches (2000 with one, 3000 with two)
KV_MODEL = toy(4, 1000, kv=1)
TWO = DealOptions(context_tokens=1000, kv_caches=2)
FEWER = "1 of the 2 questions in flight fit: each keeps a KV cache of 1,000 positions on every stage"


def test_two_caches_that_fit_are_kept():
    with within():
        d = deal([computer("solo", 12000)], KV_MODEL, TWO)  # 4 * 3000 = 12000
    assert d.kv_caches == 2 and d.fits
    assert not any("questions in flight fit" in n for n in d.notes)


def test_two_caches_that_do_not_fit_are_dealt_as_one():
    with within():
        # 9000 B: 3 layers with two caches (4 * 3000 = 12000 > 9000); 4 with one (8000)
        d = deal([computer("solo", 9000)], KV_MODEL, TWO)
    assert d.kv_caches == 1 and d.fits
    assert d.notes[-1] == FEWER


def test_a_room_that_cannot_hold_a_layer_with_two_caches_is_dealt_one():
    with within():
        # 2500 B: no layer with two caches (3000), one with one (2000); the host takes
        # all 4 (8000 B in 2500): dealt, does not fit
        d = deal([computer("solo", 2500)], KV_MODEL, TWO)
    assert d.kv_caches == 1 and not d.fits
    assert d.notes[-1] == FEWER


def test_a_room_that_cannot_hold_a_layer_with_one_cache_raises():
    with within():
        with pytest.raises(DealError, match="no device can hold a layer"):
            deal([computer("solo", 1500)], KV_MODEL, TWO)  # 1500 < 2000


# --- deal_for --------------------------------------------------------------------------

def _scenario(devices, model, options=DealOptions(), network=Network(), return_path="direct") -> Scenario:
    return Scenario(name="t", seed=0, model=model, devices=tuple(devices), options=options, network=network,
                    decoding=Decoding(return_path=return_path))


def test_deal_for_deals_over_the_devices_and_options_given():
    room = [computer("alpha", 30 * GiB), computer("beta", 30 * GiB), computer("gamma", 30 * GiB)]
    scn = _scenario(room, toy())
    assert ranges(deal_for(scn)) == {"alpha": "1-30", "beta": "31-40"}
    # without beta: gamma takes its place
    assert ranges(deal_for(scn, devices=[room[0], room[2]])) == {"alpha": "1-30", "gamma": "31-40"}
    # split memory: 40 by 30:30:30 -> 13.33 each -> 13, 13, 13; the one left to the host
    d = deal_for(scn, options=DealOptions(split="memory"))
    assert d.split == "memory"
    assert ranges(d) == {"alpha": "1-14", "beta": "15-27", "gamma": "28-40"}


@pytest.mark.parametrize("return_path, hops", [("direct", 3), ("via_stages", 4)])
def test_deal_for_predicts_the_optimal_lap_on_the_scenarios_return_path(return_path, hops):
    # three computers lend 10 layers' worth each of 30: all three hold 10 layers, 1 ms each.
    # Hops: host -> b -> c -> host (direct: 3) or host -> b -> c -> b -> host (via_stages: 4),
    # each 20 ms / 2 + a 32-byte frame header over 125 MB/s; no head bytes, only sampling.
    room = [computer(i, 10 * GiB, ms=1.0) for i in ("a", "b", "c")]
    scn = _scenario(room, toy(30), DealOptions(split="optimal"), Network(rtt_s=0.020, bandwidth_Bps=125e6),
                    return_path)
    d = deal_for(scn)
    hop = 0.020 / 2 + 32 / 125e6
    assert d.predicted["lap_s"] == pytest.approx(DEFAULT_SAMPLE_S_PER_TOKEN + 30 * 0.001 + hops * hop, rel=1e-9)
    assert len(d.stages) == 3
