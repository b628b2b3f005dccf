"""Weights: GGUF discovery, Q/K un-permutation, layer-range loading and its memory."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from runtime.config import ModelConfig
from runtime.weights import (
    EMBED,
    FINAL_NORM,
    WeightsError,
    ensure_safetensors,
    find_gguf,
    hf_name,
    load_range,
    range_tensor_names,
    tensor_nbytes,
    unpermute_rope_rows,
)


@pytest.fixture(scope="module")
def model_dir():
    return ensure_safetensors()


def llama_cpp_permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, copied as the reference."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(12 * 2, dtype=np.float32).reshape(12, 2)  # 3 heads of dim 4
    assert np.array_equal(unpermute_rope_rows(llama_cpp_permute(w, 3), 3), w)
    # by hand: one head of dim 4, HF rows [a0, a1, b0, b1] (halves a, b) are stored interleaved [a0, b0, a1, b1]
    hf = np.array([[0], [1], [2], [3]], np.float32)
    stored = np.array([[0], [2], [1], [3]], np.float32)
    assert np.array_equal(llama_cpp_permute(hf, 1), stored)
    assert np.array_equal(unpermute_rope_rows(stored, 1), hf)


def test_gguf_is_found_in_package_and_config_numbers(model_dir):
    assert find_gguf().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    cfg = ModelConfig.load(model_dir)
    assert (cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.ffn, cfg.vocab) == (30, 576, 9, 3, 1536, 49152)
    assert cfg.rope_theta == 100000.0 and cfg.rms_eps == pytest.approx(1e-5)
    assert cfg.head_dim == 64 and cfg.kv_dim == 192 and cfg.tie_embeddings
    hf_cfg = json.loads((model_dir / "config.json").read_text())
    assert hf_cfg["model_type"] == "llama" and hf_cfg["tie_word_embeddings"] is True


def test_env_override_must_exist(monkeypatch, tmp_path):
    monkeypatch.setenv("SPLITROOM_GGUF", str(tmp_path / "nope.gguf"))
    with pytest.raises(WeightsError):
        find_gguf()


def test_names():
    assert hf_name("blk.7.attn_q.weight") == "model.layers.7.self_attn.q_proj.weight"
    assert hf_name("token_embd.weight") == EMBED
    with pytest.raises(WeightsError):
        hf_name("blk.0.ssm_conv.weight")


def test_range_names_and_errors(model_dir):
    cfg = ModelConfig.load(model_dir)
    names = range_tensor_names(cfg, 3, 5, False, False)
    assert len(names) == 18 and all(n.startswith(("model.layers.3.", "model.layers.4.")) for n in names)
    assert set(range_tensor_names(cfg, 0, 0, True, True)) == {EMBED, FINAL_NORM}
    with pytest.raises(ValueError):
        range_tensor_names(cfg, 5, 31, False, False)


def test_load_range_shapes_dtype(model_dir):
    w = load_range(model_dir, 29, 30, with_embedding=True, with_head=True)
    assert w[EMBED].shape == (49152, 576)
    assert w["model.layers.29.self_attn.k_proj.weight"].shape == (192, 576)  # (out, in)
    assert w["model.layers.29.mlp.down_proj.weight"].shape == (576, 1536)
    assert all(a.dtype == np.float32 for a in w.values())
    assert not any(k.startswith("model.layers.28.") for k in w)


@pytest.mark.parametrize("start,end", [(0, 3), (10, 20)])
def test_resident_bytes_stay_near_the_range(model_dir, start, end):
    """Peak and held Python-heap bytes while loading a worker range: within 5 % of its tensors."""
    cfg = ModelConfig.load(model_dir)
    expect = tensor_nbytes(model_dir, range_tensor_names(cfg, start, end, False, False))
    # hand calculation: params per layer * 4 bytes
    assert expect == (end - start) * cfg.layer_params() * 4
    from runtime.backends import StageSpec
    from runtime.backends.numpy_backend import NumpyStage

    tracemalloc.start()
    try:
        w = load_range(model_dir, start, end, False, False)
        stage = NumpyStage(cfg, StageSpec(start, end), w, max_ctx=64)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stage.position == 0
    rope = 2 * 64 * 32 * 4
    assert expect * 0.98 <= held - rope <= expect * 1.05, (held, expect)
    # building the fused QKV / gate-up matrices briefly copies one layer, never the model
    assert peak <= expect * 1.05 + 2 * cfg.layer_params() * 4, (peak, expect)
    assert peak < 0.5 * (model_dir / "model.safetensors").stat().st_size
