"""Properties of the deal over many random rooms (issue 2), checked with hypothesis.

Rooms mix computers and phones, measured and unmeasured devices, devices lending 0,
devices without WebGPU, more devices than layers, and both split modes. What a device
"can hold" is computed here from the rules (weights + KV share per layer; the host
first gives up the embedding, output head and draft layer), not by the planner.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest

from planner.deal import DealError, deal, pick_host
from planner.model import ModelSpec
from planner.room import DealOptions, Device

LAYER_BYTES = 1000
CONTEXT = 100

#: SPLITROOM_DEAL_EXAMPLES=5000 for a longer hunt; the default keeps the file under 20 s.
FAST = settings(max_examples=int(os.environ.get("SPLITROOM_DEAL_EXAMPLES", "250")), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def models(draw) -> ModelSpec:
    """A model of 1-64 layers of 1000 B weights, optionally KV and host-only extras."""
    layers = draw(st.integers(1, 64))
    kv = draw(st.sampled_from([0, 0, 2, 5]))  # bytes per token per layer; x CONTEXT
    extra = draw(st.sampled_from([0, 0, 500, 1000, 3000]))
    return ModelSpec(id="prop", name="prop", layers=layers, hidden=16, layer_bytes=LAYER_BYTES,
                     layer_active_bytes=LAYER_BYTES, layer_flops_per_token=0.0, kv_bytes_per_token=kv,
                     embedding_bytes=extra, head_bytes=0, draft_bytes=0)


@st.composite
def devices(draw, min_size: int = 1, max_size: int = 12, max_lends: int = 40_000) -> list[Device]:
    """A room of distinct devices with random kind, WebGPU, lends, speed, copy speed."""
    ids = draw(st.lists(st.text("abcdefghij", min_size=1, max_size=3), min_size=min_size,
                        max_size=max_size, unique=True))
    out = []
    for i in ids:
        out.append(Device(
            id=i,
            kind=draw(st.sampled_from(["computer", "computer", "phone"])),
            webgpu=draw(st.sampled_from([True, True, True, True, False])),
            lends_bytes=draw(st.one_of(st.just(0), st.integers(0, max_lends // 250).map(lambda q: q * 250),
                                       st.integers(0, max_lends))),
            s_per_layer=draw(st.one_of(st.none(), st.sampled_from([0.5e-3, 1e-3, 2e-3, 4e-3, 20e-3]))),
            copy_speed_Bps=draw(st.one_of(st.none(), st.sampled_from([100e9, 150e9, 190e9, 390e9]))),
        ))
    return out


options = st.builds(DealOptions, context_tokens=st.just(CONTEXT), kv_cache=st.sampled_from(["f16", "q8"]),
                    split=st.sampled_from(["speed", "memory"]), phone_layers=st.booleans())


def per_layer(model: ModelSpec, opts: DealOptions) -> int:
    """Bytes of one layer: weights + KV at the context (int8 KV halves the KV part)."""
    kv = model.kv_bytes_per_token * opts.context_tokens
    return model.layer_bytes + (kv // 2 if opts.kv_cache == "q8" else kv)


def can_hold(d: Device, model: ModelSpec, opts: DealOptions, is_host: bool) -> int:
    """Layers ``d`` can hold in what it lends (the host first pays for the extras)."""
    if not d.webgpu:
        return 0
    free = d.lends_bytes - (model.embedding_bytes + model.head_bytes + model.draft_bytes if is_host else 0)
    return max(0, free // per_layer(model, opts))


def expected_error(room: list[Device], model: ModelSpec, opts: DealOptions) -> bool:
    """True when the room may not be dealt: nobody can hold a layer, or the host lends nothing."""
    host = pick_host(room, opts.host)[0]
    nobody = all(can_hold(d, model, opts, d.id == host) == 0 for d in room)
    host_dev = next(d for d in room if d.id == host)
    return nobody or host_dev.lends_bytes <= 0 or not host_dev.webgpu


def check_structure(d, room: list[Device], model: ModelSpec) -> None:
    """Every layer dealt once, contiguous non-empty stages, host first with >= 1 layer."""
    by_id = {x.id: x for x in room}
    assert d.stages, "a deal has at least the host's stage"
    assert d.stages[0].device == d.host and d.stages[0].start == 0
    assert d.stages[-1].end == model.layers
    for a, b in zip(d.stages, d.stages[1:]):
        assert a.end == b.start
    assert all(s.end > s.start for s in d.stages)
    stage_devs = [s.device for s in d.stages]
    assert len(stage_devs) == len(set(stage_devs)), "a device holds one contiguous range"
    covered = [i for s in d.stages for i in range(s.start, s.end)]
    assert covered == list(range(model.layers))
    # devices that lend nothing or lack WebGPU get no layers; everyone else is a guest
    for s in d.stages:
        assert by_id[s.device].lends_bytes > 0 and by_id[s.device].webgpu
    assert set(d.guests) | set(stage_devs) == set(by_id)
    assert not set(d.guests) & set(stage_devs)


@FAST
@given(models(), devices(), options, st.randoms(use_true_random=False))
def test_deal_properties(model, room, opts, rnd):
    """The deal's invariants on a random room, and its independence of device order."""
    if expected_error(room, model, opts):
        with pytest.raises(DealError):
            deal(room, model, opts)
        return
    d = deal(room, model, opts)
    check_structure(d, room, model)

    host = d.host
    holds = {x.id: can_hold(x, model, opts, x.id == host) for x in room}
    room_can_hold = sum(holds.values()) >= model.layers and holds[host] >= 1
    if room_can_hold:
        per = per_layer(model, opts)
        extra = model.embedding_bytes + model.head_bytes + model.draft_bytes
        for s in d.stages:
            dev = next(x for x in room if x.id == s.device)
            used = (s.end - s.start) * per + (extra if s.device == host else 0)
            assert used <= dev.lends_bytes, (s, dev.lends_bytes)
        assert d.fits

    shuffled = list(room)
    rnd.shuffle(shuffled)
    assert deal(shuffled, model, opts) == d


@FAST
@given(models(), devices(max_size=4, max_lends=0), options)
def test_room_that_holds_nothing_names_every_device(model, room, opts):
    """Nobody lends a layer's worth: a clear DealError naming each device."""
    with pytest.raises(DealError) as e:
        deal(room, model, opts)
    msg = str(e.value)
    assert "\n" not in msg
    for x in room:
        assert x.id in msg


@FAST
@given(models(), devices(), options)
def test_room_below_one_layer_each_names_every_device(model, room, opts):
    """Every device lends less than one layer: the error names each device's shortfall."""
    per = per_layer(model, opts)
    room = [Device(id=x.id, kind=x.kind, webgpu=x.webgpu, lends_bytes=x.lends_bytes % per) for x in room]
    with pytest.raises(DealError) as e:
        deal(room, model, opts)
    for x in room:
        assert x.id in str(e.value)


@FAST
@given(st.integers(1, 8), st.integers(1, 20), st.sampled_from(["speed", "memory"]))
def test_more_devices_than_layers(layers, extra_devices, split):
    """N layers over N + k equal computers: N one-layer stages or fewer, the rest guests."""
    model = ModelSpec(id="m", name="m", layers=layers, hidden=8, layer_bytes=LAYER_BYTES,
                      layer_active_bytes=LAYER_BYTES, layer_flops_per_token=0.0, kv_bytes_per_token=0)
    room = [Device(id=f"d{i:02d}", lends_bytes=LAYER_BYTES) for i in range(layers + extra_devices)]
    d = deal(room, model, DealOptions(split=split))
    check_structure(d, room, model)
    assert len(d.stages) == layers and len(d.guests) == extra_devices
