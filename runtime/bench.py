"""Speed measurements of a backend on this machine: ``python -m runtime.bench --backend wgpu``.

Prints one JSON object: decode tokens/s (greedy, one full stage, the host's fused step),
ms per layer (one-token ``forward`` through all layers / layer count), prefill tokens/s
(16- and 64-token chunks), and the adapter. ``--random`` uses random weights of the real
shapes (speed does not depend on the values) when the GGUF is not available.
pytest-benchmark versions of these live in tests/benchmark/test_bench_model.py.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from .backends.base import StageSpec
from .config import ModelConfig
from .weights import range_tensor_names

SMOLLM2_135M = ModelConfig(n_layers=30, hidden=576, n_heads=9, n_kv_heads=3, ffn=1536, vocab=49152, rope_theta=100000.0, rms_eps=1e-5)


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 weights of the right names and shapes: N(0, 0.02) matrices, norms of ones."""
    rng = np.random.default_rng(seed)
    H, F, KV = cfg.hidden, cfg.ffn, cfg.kv_dim
    shapes = {
        "input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
        "self_attn.q_proj.weight": (H, H), "self_attn.k_proj.weight": (KV, H), "self_attn.v_proj.weight": (KV, H),
        "self_attn.o_proj.weight": (H, H), "mlp.gate_proj.weight": (F, H), "mlp.up_proj.weight": (F, H),
        "mlp.down_proj.weight": (H, F),
    }
    out = {}
    for name in range_tensor_names(cfg, 0, cfg.n_layers, True, True):
        if name == "model.embed_tokens.weight":
            shape = (cfg.vocab, H)
        elif name == "model.norm.weight":
            shape = (H,)
        else:
            shape = shapes[name.split(".", 3)[3]]
        if len(shape) == 1:
            out[name] = np.ones(shape, np.float32)
        else:
            out[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))
    return out


def build(backend: str, random: bool, max_ctx: int = 1024):
    """A full-model host stage of ``backend`` (real weights unless ``random``)."""
    if random:
        cfg, w = SMOLLM2_135M, random_weights(SMOLLM2_135M)
        spec = StageSpec(0, cfg.n_layers, True)
        if backend == "numpy":
            from .backends.numpy_backend import NumpyStage

            return NumpyStage(cfg, spec, w, max_ctx=max_ctx)
        from .backends.wgpu_backend import WgpuStage

        return WgpuStage(cfg, spec, w, max_ctx=max_ctx)
    from .backends import make_stage
    from .weights import ensure_safetensors

    d = ensure_safetensors()
    return make_stage(backend, d, StageSpec(0, ModelConfig.load(d).n_layers, True), max_ctx=max_ctx)


def measure(stage, decode_tokens: int = 64, prompt_len: int = 32, reps: int = 5) -> dict:
    """Time decode, one-token forward (ms per layer) and prefill chunks on ``stage`` (host, all layers)."""
    cfg = stage.cfg
    rng = np.random.default_rng(1)
    prompt = rng.integers(3, cfg.vocab, prompt_len).tolist()
    res: dict = {}
    # decode: prompt, then greedy steps (fused host step)
    stage.rollback(0)
    h = stage.embed_forward(prompt, 0)
    pos = stage.position
    tok, h = stage.head_embed_forward(h, pos)  # warm-up
    pos += 1
    t0 = time.perf_counter()
    for _ in range(decode_tokens):
        tok, h = stage.head_embed_forward(h, pos)
        pos += 1
    dt = time.perf_counter() - t0
    res["decode_tok_s"] = decode_tokens / dt
    res["decode_ms_per_token"] = dt / decode_tokens * 1e3
    res["decode_context"] = [prompt_len, pos]
    # one-token forward through all layers (no head): ms per layer
    x = rng.standard_normal((1, cfg.hidden)).astype(np.float32)
    stage.rollback(prompt_len)
    best = []
    for _ in range(reps):
        stage.rollback(prompt_len)
        t0 = time.perf_counter()
        for i in range(8):
            stage.forward(x, prompt_len + i)
        best.append((time.perf_counter() - t0) / 8)
    res["forward_1tok_ms"] = min(best) * 1e3
    res["ms_per_layer"] = min(best) * 1e3 / max(1, stage.end - stage.start)
    # prefill chunks from position 0
    for n in (16, 64):
        ids = rng.integers(3, cfg.vocab, n).tolist()
        ts = []
        for _ in range(reps):
            stage.rollback(0)
            t0 = time.perf_counter()
            stage.embed_forward(ids, 0)
            ts.append(time.perf_counter() - t0)
        res[f"prefill{n}_tok_s"] = n / min(ts)
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="numpy", choices=["numpy", "wgpu"])
    ap.add_argument("--random", action="store_true", help="random weights of the real shapes")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    stage = build(a.backend, a.random)
    out = {"backend": a.backend, "random_weights": a.random, "init_s": time.perf_counter() - t0, "machine": platform.processor() or platform.machine()}
    if a.backend == "wgpu":
        from .backends.wgpu_backend import adapter_summary

        out["adapter"] = adapter_summary()
    out.update(measure(stage, a.decode_tokens, reps=a.reps))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
