"""wgpu kernels on a small random model, every weight format, against the numpy reference.

The reference is :class:`runtime.backends.numpy_backend.NumpyStage` with the same
:class:`runtime.precision.Precision` (its own f16/q8 products, numba kernels), so both sides
store the same weight values and differ only by float32 summation order. Runs on lavapipe in CI.
"""

from __future__ import annotations

import numpy as np
import pytest

from runtime.backends.base import StageSpec
from runtime.backends.numpy_backend import NumpyStage
from runtime.config import ModelConfig
from runtime.precision import Precision, PrecisionError
from tests.wgpu_models import random_checkpoint, rel

wgpu_backend = pytest.importorskip("runtime.backends.wgpu_backend")
pytestmark = pytest.mark.slow

CFG = ModelConfig(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=384, rope_theta=10000.0, rms_eps=1e-5)


def weights(seed: int) -> dict[str, np.ndarray]:
    return random_checkpoint(CFG, seed)


# (format, subgroup kernels, SPLITROOM_WGPU_WIDE, SPLITROOM_WGPU_RS: rows a subgroup computes at once,
# SPLITROOM_WGPU_SPLIT: rows a workgroup of the workgroup-shared form, "0" for none)
PAIRS = [(f, k, "8", "1", "0") for f in ("f32", "f16", "q8") for k in ("1", "0")]
PAIRS += [("f16", "1", "0", "1", "0"), ("f16", "1", "0", "2", "0"), ("f16", "1", "8", "2", "0"), ("f32", "1", "8", "4", "0"),
          ("q8", "1", "8", "2", "0")]
# the workgroup-shared form: f16 in 16-byte pieces, f32 and q8 through their vec4 loaders; rows of
# 64 and 128 weights are 8 and 16 pieces in f16, fewer than the 32 threads (masked)
PAIRS += [("f16", "1", "0", "1", "8"), ("f16", "1", "0", "1", "1"), ("f32", "1", "0", "1", "4"), ("q8", "1", "0", "1", "2")]


@pytest.fixture(scope="module", params=PAIRS,
                ids=lambda p: f"{p[0]}-{'subgroup' if p[1] == '1' else 'batch'}-kernels{'-vec2-loads' if p[2] == '0' else ''}"
                              f"{'-rows' + p[3] if p[3] != '1' else ''}{'-split' + p[4] if p[4] != '0' else ''}")
def pair(request):
    fmt, fast, wide, rs, split = request.param
    w = weights(7)
    mp = pytest.MonkeyPatch()
    mp.setenv("SPLITROOM_WGPU_FAST", fast)
    mp.setenv("SPLITROOM_WGPU_WIDE", wide)  # f16 one-token products: 16-byte pieces (8) or vec2 loads (0)
    mp.setenv("SPLITROOM_WGPU_RS", rs)
    mp.setenv("SPLITROOM_WGPU_SPLIT", f"{fmt}:{split}")
    request.addfinalizer(mp.undo)
    ref = NumpyStage(CFG, StageSpec(0, CFG.n_layers, True), dict(w), max_ctx=96, precision=Precision(weights=fmt))
    try:
        gpu = wgpu_backend.WgpuStage(CFG, StageSpec(0, CFG.n_layers, True), w, max_ctx=96, precision=Precision(weights=fmt))
        if fast == "1" and not gpu.fast:
            pytest.skip("adapter without subgroup operations")
        # the rows asked for are the ones built
        assert not gpu.fast or (gpu.kernel_form(fmt)["rs"], gpu.kernel_form(fmt).get("split", 0)) == (int(rs), int(split))
    except wgpu_backend.WgpuUnavailable as e:
        pytest.skip(str(e))
    return fmt, gpu, ref


def test_f16_kv_cache_is_refused_in_one_line():
    with pytest.raises(PrecisionError, match="wgpu backend keeps the KV cache as f32"):
        wgpu_backend.WgpuStage(CFG, StageSpec(0, 1, False), {}, precision=Precision(kv="f16"))


def test_prefill_and_decode_match_reference(pair):
    fmt, gpu, ref = pair
    ids = [5, 9, 100, 3, 77, 200, 1, 42, 300, 17, 8]
    for s in (gpu, ref):
        s.rollback(0)
    a = gpu.head(gpu.embed_forward(ids, 0))
    b = ref.head(ref.embed_forward(ids, 0))
    assert rel(a, b) < 1e-5 and (a.argmax(-1) == b.argmax(-1)).all()
    # one-token steps (the subgroup kernels where the adapter has them)
    x = np.random.default_rng(1).standard_normal((1, CFG.hidden)).astype(np.float32)
    assert rel(gpu.forward(x, len(ids)), ref.forward(x, len(ids))) < 1e-5
    a1 = gpu.head(gpu.embed_forward([250], len(ids) + 1))
    b1 = ref.head(ref.embed_forward([250], len(ids) + 1))
    assert rel(a1, b1) < 1e-5


def test_greedy_steps_equal_stepwise_and_reference(pair):
    fmt, gpu, ref = pair
    ids = [11, 22, 33, 44]
    for s in (gpu, ref):
        s.rollback(0)
    hg = gpu.embed_forward(ids, 0)
    hr = ref.embed_forward(ids, 0)
    want, x = [], hr
    for i in range(20):
        t, x = ref.head_embed_forward(x, 4 + i)
        want.append(t)
    assert len(set(want)) > 3  # a sequence that moves, not one repeated token
    got, h = gpu.greedy_steps(hg, 4, 20)
    assert got == want
    assert rel(h, x) < 1e-5
    gpu.rollback(4)
    gpu.wait_mode = "map"  # wgpu-py's map_sync for every read-back instead of the submission index
    try:
        got_map, h_map = gpu.greedy_steps(hg, 4, 20)
    finally:
        gpu.wait_mode = "index"
    assert got_map == want and rel(h_map, x) < 1e-5
    gpu.rollback(4)
    step, y = [], hg
    for i in range(20):
        t, y = gpu.head_embed_forward(y, 4 + i)
        step.append(t)
    assert step == want
    if gpu.fast:  # several steps per command buffer, positions copied in between
        gpu.rollback(4)
        got4, h4 = gpu.greedy_steps(hg, 4, 20, per_submit=6)
        assert got4 == want and rel(h4, x) < 1e-5


@pytest.mark.parametrize("setting", ["ATT_CHUNK=16+ATT_GROUPS=0", "", "ATT_GROUPS=1+ATT=32"])
def test_attention_over_several_chunks(monkeypatch, setting):
    """Context 70 > chunk 16: the running-max softmax across chunks; or the key-group kernel (the
    default: 2 keys a round, 64 groups of 4 lanes; 1 a round, 8 groups: 9 rounds)."""
    env = dict(kv.split("=") for kv in filter(None, setting.split("+")))
    for k, v in env.items():
        monkeypatch.setenv(f"SPLITROOM_WGPU_{k}", v)
    monkeypatch.setenv("SPLITROOM_WGPU_FAST", "1")
    w = weights(9)
    gpu = wgpu_backend.WgpuStage(CFG, StageSpec(0, CFG.n_layers, True), dict(w), max_ctx=96)
    if not gpu.fast:
        pytest.skip("adapter without subgroup operations")
    assert gpu.attention_form["groups"] == int(env.get("ATT_GROUPS", "2"))  # the kernel asked for is the one built
    ref = NumpyStage(CFG, StageSpec(0, CFG.n_layers, True), w, max_ctx=96)
    ids = list(range(3, 73))
    hg, hr = gpu.embed_forward(ids, 0), ref.embed_forward(ids, 0)
    a = gpu.head(gpu.embed_forward([7], 70))
    b = ref.head(ref.embed_forward([7], 70))
    assert rel(a, b) < 1e-5
    assert rel(hg, hr) < 1e-5


@pytest.mark.parametrize("fast", ["1", "0"])
def test_worker_stage_of_one_layer(monkeypatch, fast):
    """A worker holding one middle layer: the one-token pass writes the whole residual back."""
    monkeypatch.setenv("SPLITROOM_WGPU_FAST", fast)
    w = weights(5)
    gpu = wgpu_backend.WgpuStage(CFG, StageSpec(1, 2, False), dict(w), max_ctx=32, precision=Precision(weights="q8"))
    ref = NumpyStage(CFG, StageSpec(1, 2, False), w, max_ctx=32, precision=Precision(weights="q8"))
    rng = np.random.default_rng(2)
    for pos in range(3):
        x = rng.standard_normal((1, CFG.hidden)).astype(np.float32)
        assert rel(gpu.forward(x, pos), ref.forward(x, pos)) < 1e-5


def test_shared_rows_per_product_match_reference(monkeypatch):
    """SPLITROOM_WGPU_SPLIT_ROWS gives each one-token product its own rows a workgroup of the
    shared form (f16 here: QKV 1 row pair, O 4 from SPLIT, gate/up 2, down 4, head 8): the kernels
    built and the workgroups dispatched are those (rows / rows a workgroup), and greedy decode
    equals the numpy reference's."""
    monkeypatch.setenv("SPLITROOM_WGPU_FAST", "1")
    monkeypatch.setenv("SPLITROOM_WGPU_SPLIT", "f16:4")
    monkeypatch.setenv("SPLITROOM_WGPU_SPLIT_ROWS", "gate_up:2,head:8,qkv:1")
    w = weights(5)
    ref = NumpyStage(CFG, StageSpec(0, CFG.n_layers, True), dict(w), max_ctx=64, precision=Precision(weights="f16"))
    gpu = wgpu_backend.WgpuStage(CFG, StageSpec(0, CFG.n_layers, True), w, max_ctx=64, precision=Precision(weights="f16"))
    if not gpu.fast:
        pytest.skip("adapter without subgroup operations")
    assert [gpu.kernel_form("f16", product=p)["split"] for p in ("qkv", "o", "gate_up", "down", "head")] == [1, 4, 2, 4, 8]
    groups = {lab: g for lab, _, _, g in gpu.plan1[:5]}
    qkv_pairs = (CFG.n_heads + 2 * CFG.n_kv_heads) * CFG.head_dim // 2
    assert groups == {"qkv_rope": qkv_pairs, "attention": CFG.n_heads, "o_add": CFG.hidden // 4, "gate_up": CFG.ffn // 2,
                      "down_add": CFG.hidden // 4}
    assert gpu.fhead_x[3] == CFG.vocab // 8
    ids = [11, 22, 33, 44]
    hr = ref.embed_forward(ids, 0)
    want, x = [], hr
    for i in range(12):
        t, x = ref.head_embed_forward(x, 4 + i)
        want.append(t)
    got, h = gpu.greedy_steps(gpu.embed_forward(ids, 0), 4, 12)
    assert got == want and rel(h, x) < 1e-5


@pytest.mark.parametrize("fmt,rows", [("f16", "4"), ("f16", "1"), ("f16", "8"), ("f32", "2")])
def test_attention_fused_into_qkv_matches_reference(monkeypatch, fmt, rows):
    """SPLITROOM_WGPU_FUSE_ATT=1: the one-token attention runs in the QKV + RoPE product's dispatch
    (4 dispatches a layer). Greedy decode over 40 steps (each head's count must go back to 0 after
    every step, else its attention would not run again) and a step at position 70 (several rounds
    of key groups) equal the numpy reference's; 1, 4 and 8 row pairs a workgroup (a head of 8)."""
    monkeypatch.setenv("SPLITROOM_WGPU_FAST", "1")
    monkeypatch.setenv("SPLITROOM_WGPU_SPLIT", f"{fmt}:{rows}")
    monkeypatch.setenv("SPLITROOM_WGPU_FUSE_ATT", "1")
    w = weights(5)
    ref = NumpyStage(CFG, StageSpec(0, CFG.n_layers, True), dict(w), max_ctx=96, precision=Precision(weights=fmt))
    gpu = wgpu_backend.WgpuStage(CFG, StageSpec(0, CFG.n_layers, True), w, max_ctx=96, precision=Precision(weights=fmt))
    if not gpu.fast:
        pytest.skip("adapter without subgroup operations")
    labels = [lab for lab, *_ in gpu.plan1]
    assert labels == ["qkv_rope_att", "o_add", "gate_up", "down_add"] * CFG.n_layers
    ids = [11, 22, 33, 44]
    hr = ref.embed_forward(ids, 0)
    want, x = [], hr
    for i in range(40):
        t, x = ref.head_embed_forward(x, 4 + i)
        want.append(t)
    got, h = gpu.greedy_steps(gpu.embed_forward(ids, 0), 4, 40)
    assert got == want and rel(h, x) < 1e-5
    for s in (gpu, ref):
        s.rollback(0)
    long = list(range(3, 73))
    assert rel(gpu.embed_forward(long, 0), ref.embed_forward(long, 0)) < 1e-5
    a = gpu.head(gpu.forward(ref.embed([7]), 70))
    b = ref.head(ref.forward(ref.embed([7]), 70))
    assert rel(a, b) < 1e-5


def test_shared_rows_setting_is_checked():
    assert wgpu_backend.split_rows_settings("2") == dict.fromkeys(wgpu_backend.PRODUCTS, 2)
    with pytest.raises(ValueError, match="unknown product 'gate'"):
        wgpu_backend.split_rows_settings("gate:2")
    with pytest.raises(ValueError, match="at least 1"):
        wgpu_backend.split_rows_settings("head:0")
