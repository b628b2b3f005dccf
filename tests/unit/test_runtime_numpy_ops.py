"""numpy backend building blocks against hand calculations."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.backends.numpy_backend import apply_rope, rms_norm, rope_tables, silu
from runtime.config import ModelConfig

CFG = ModelConfig(n_layers=2, hidden=8, n_heads=2, n_kv_heads=1, ffn=16, vocab=10, rope_theta=10000.0, rms_eps=1e-5)


def test_rms_norm_by_hand():
    x = np.array([[3.0, 4.0]], np.float32)  # mean square = 12.5
    y = rms_norm(x, np.array([1.0, 2.0], np.float32), eps=0.0)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, [[3 / np.sqrt(12.5), 8 / np.sqrt(12.5)]], rtol=1e-6)


def test_rope_tables_by_hand():
    cos, sin = rope_tables(CFG, 3)  # head_dim 4 -> inv_freq [1, 0.01]
    assert cos.dtype == np.float32 and cos.shape == (3, 2)
    np.testing.assert_allclose(cos[2], [np.cos(2.0), np.cos(0.02)], rtol=1e-6)
    np.testing.assert_allclose(sin[1], [np.sin(1.0), np.sin(0.01)], rtol=1e-6)


def test_rope_rotate_half_by_hand():
    # one head of dim 4: pairs (x0, x2) and (x1, x3) rotate by pos*inv_freq
    x = np.array([[[1.0, 0.0, 0.0, 1.0]]], np.float32)
    th = 0.3
    cos = np.array([[np.cos(th), 1.0]], np.float32)
    sin = np.array([[np.sin(th), 0.0]], np.float32)
    y = apply_rope(x, cos, sin)
    np.testing.assert_allclose(y[0, 0], [np.cos(th), 0.0, np.sin(th), 1.0], atol=1e-7)
    # position 0 is the identity
    c0, s0 = rope_tables(CFG, 1)
    assert np.array_equal(apply_rope(x, c0, s0), x)


def test_silu_by_hand():
    np.testing.assert_allclose(silu(np.array([0.0, 1.0], np.float32)), [0.0, 1 / (1 + np.exp(-1.0))], rtol=1e-6)


def test_attention_is_causal_and_single_key_is_value():
    """Tiny random model: output at position 0 must not depend on later tokens; first attention = V."""
    from runtime.backends.base import StageSpec
    from runtime.backends.numpy_backend import NumpyStage

    rng = np.random.default_rng(0)
    w = {}
    for i in range(2):
        p = f"model.layers.{i}."
        for n, shape in [
            ("input_layernorm.weight", (8,)),
            ("post_attention_layernorm.weight", (8,)),
            ("self_attn.q_proj.weight", (8, 8)),
            ("self_attn.k_proj.weight", (4, 8)),
            ("self_attn.v_proj.weight", (4, 8)),
            ("self_attn.o_proj.weight", (8, 8)),
            ("mlp.gate_proj.weight", (16, 8)),
            ("mlp.up_proj.weight", (16, 8)),
            ("mlp.down_proj.weight", (8, 16)),
        ]:
            w[p + n] = rng.standard_normal(shape).astype(np.float32)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    a = NumpyStage(CFG, StageSpec(0, 2), dict(w), max_ctx=8).forward(x, 0)
    x2 = x.copy()
    x2[1:] = 0
    b = NumpyStage(CFG, StageSpec(0, 2), dict(w), max_ctx=8).forward(x2, 0)
    assert a.dtype == np.float32
    np.testing.assert_allclose(a[0], b[0], rtol=1e-6)
    # one layer, one token: attention output = o_proj(v) since softmax over one key is 1
    s = NumpyStage(CFG, StageSpec(0, 1), dict(w), max_ctx=8)
    y = s.forward(x[:1], 0)
    h = rms_norm(x[:1], w["model.layers.0.input_layernorm.weight"], 1e-5)
    v = h @ w["model.layers.0.self_attn.v_proj.weight"].T  # [1, 4], one kv head shared by both heads
    x1 = x[:1] + np.concatenate([v, v], axis=1) @ w["model.layers.0.self_attn.o_proj.weight"].T
    h2 = rms_norm(x1, w["model.layers.0.post_attention_layernorm.weight"], 1e-5)
    g = h2 @ w["model.layers.0.mlp.gate_proj.weight"].T
    u = h2 @ w["model.layers.0.mlp.up_proj.weight"].T
    expect = x1 + (g / (1 + np.exp(-g)) * u) @ w["model.layers.0.mlp.down_proj.weight"].T
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-5)


def test_config_rejects_bad_heads():
    with pytest.raises(ValueError):
        ModelConfig(n_layers=1, hidden=10, n_heads=3, n_kv_heads=1, ffn=4, vocab=4, rope_theta=1e4, rms_eps=1e-5)
