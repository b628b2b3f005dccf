"""wgpu on the architecture variants the numpy reference computes (Qwen2 biases, Qwen3 q/k norms
and a head width other than hidden, Mistral's sliding window, Llama-3 RoPE scaling, untied heads):
small random models, wgpu against :class:`runtime.backends.numpy_backend.NumpyStage` (itself
checked against transformers in the model tests), with both kernel sets. Runs on lavapipe.
"""

from __future__ import annotations

import numpy as np
import pytest

from runtime.backends import wgpu_unsupported
from runtime.backends.base import StageSpec
from runtime.backends.numpy_backend import NumpyStage
from runtime.config import ModelConfig
from runtime.precision import Precision
from tests.wgpu_models import random_checkpoint, rel

wgpu_backend = pytest.importorskip("runtime.backends.wgpu_backend")
pytestmark = pytest.mark.slow

BASE = dict(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=256, rope_theta=10000.0, rms_eps=1e-6)
CONFIGS = {
    "qwen2_bias_untied": ModelConfig(**BASE, qkv_bias=True, tie_embeddings=False),
    "qwen3_qknorm_wide_heads": ModelConfig(**BASE, head_dim=32, qk_norm=True, o_bias=True),
    "mistral_window_4": ModelConfig(**BASE, sliding_window=4),
    "llama3_rope_scaling": ModelConfig(**BASE, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
}


@pytest.mark.parametrize("fast", ["1", "0"], ids=["subgroup-kernels", "batch-kernels"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_numpy(name, fast, monkeypatch):
    monkeypatch.setenv("SPLITROOM_WGPU_FAST", fast)
    cfg = CONFIGS[name]
    assert wgpu_unsupported(cfg) == []
    w = random_checkpoint(cfg, 11)
    ref = NumpyStage(cfg, StageSpec(0, cfg.n_layers, True), dict(w), max_ctx=64)
    gpu = wgpu_backend.WgpuStage(cfg, StageSpec(0, cfg.n_layers, True), dict(w), max_ctx=64, precision=Precision())
    if fast == "1" and not gpu.fast:
        pytest.skip("adapter without subgroup operations")
    ids = [5, 9, 100, 3, 77, 200, 1, 42, 30, 17]
    a = gpu.head(gpu.embed_forward(ids, 0))
    b = ref.head(ref.embed_forward(ids, 0))
    assert rel(a, b) < 1e-5 and (a.argmax(-1) == b.argmax(-1)).all()
    # one-token steps past the window and the scaling's original context
    ha, hb = a[-1:], b[-1:]
    xa = gpu.embed_forward([7], len(ids))
    xb = ref.embed_forward([7], len(ids))
    want, got = [], []
    for i in range(10):
        ta, xa = gpu.head_embed_forward(xa, len(ids) + 1 + i)
        tb, xb = ref.head_embed_forward(xb, len(ids) + 1 + i)
        got.append(ta)
        want.append(tb)
        assert rel(xa, xb) < 1e-5
    assert got == want
