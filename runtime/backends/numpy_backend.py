"""Reference float32 forward of a Llama-family decoder in numpy, for one layer range.

Algorithm (the Hugging Face ``transformers`` ``LlamaForCausalLM`` forward, re-derived, with the
``Mistral``/``Qwen2``/``Qwen3`` variations switched on by :class:`runtime.config.ModelConfig`):

* RMSNorm: ``y = x / sqrt(mean(x**2) + eps) * w`` (Zhang & Sennrich 2019).
* RoPE, rotate-half form (Su et al. 2021; HF ``apply_rotary_pos_emb``): for head dim ``D``,
  ``inv_freq[i] = theta ** (-2i/D)``, angle ``pos * inv_freq``, ``cos``/``sin`` repeated twice,
  ``q' = q*cos + rotate_half(q)*sin`` with ``rotate_half([a, b]) = [-b, a]``.
* Grouped-query attention (Ainslie et al. 2023): query head ``h`` reads KV head
  ``h // (n_heads / n_kv_heads)``; causal mask; scale ``1/sqrt(D)``; softmax in float32.
* SwiGLU MLP (Shazeer 2020): ``down(silu(gate(x)) * up(x))``.
* Residual adds around attention and MLP; final RMSNorm; output head ``logits = y @ W^T`` with
  ``W`` the checkpoint's ``lm_head`` or, tied, the embedding ``E``.
* Variations: q/k/v (and o) biases added after the projections (Qwen2); an RMSNorm over each
  head of q and k before RoPE (Qwen3, weights ``[head_dim]``); RoPE inverse frequencies scaled
  (:func:`runtime.config.rope_inv_freq`: linear, Llama 3); keys more than ``sliding_window``
  positions back masked (Mistral v0.1: query ``i`` sees key ``j`` when ``i - window < j <= i``).

Storage (:class:`runtime.precision.Precision`): the four matrices of a layer and the head are
:class:`runtime.backends.kernels.Linear` objects in float32, float16, int8 per row, or the
GGUF's own blocks as stored (``gguf``: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, unpacked row by row); a
product of up to ``STREAM_MAX_ROWS`` rows (decode, a verify lap, the head over a lap's rows)
streams each weight row once (kernels.py says why), bigger blocks (prefill) go to BLAS. The KV
cache is float32 or float16. All arithmetic is float32; biases and norm weights stay float32.
"""

from __future__ import annotations

import numpy as np

from ..config import ModelConfig, rope_inv_freq
from ..precision import FLOAT32, Precision
from ..weights import EMBED, FINAL_NORM, LM_HEAD
from .base import Stage, StageSpec, check_hidden, check_ids
from .kernels import Linear

F32 = np.float32


def rope_tables(cfg: ModelConfig, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """``cos``, ``sin`` tables ``[n_pos, head_dim // 2]`` float32 for positions ``0..n_pos-1``.

    Angles are computed in float64 (``pos * inv_freq``, :func:`runtime.config.rope_inv_freq`,
    which applies the config's RoPE scaling) and rounded once to float32.
    """
    inv_freq = rope_inv_freq(cfg)
    ang = np.arange(n_pos, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(ang).astype(F32), np.sin(ang).astype(F32)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis. ``x`` ``[..., d]`` float32, ``w`` ``[d]`` float32 -> float32."""
    ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=F32)
    y = (x * (F32(1.0) / np.sqrt(ms + F32(eps)))) * w
    assert y.dtype == F32
    return y


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE. ``x`` ``[n, heads, D]``; ``cos``/``sin`` ``[n, D/2]`` -> ``[n, heads, D]`` float32."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def silu(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)`` in float32."""
    return x / (F32(1.0) + np.exp(-x))


def _matrix(fmt: str, *parts) -> Linear:
    """Row blocks ``parts`` (float32 ``[out_i, in]``, or with ``fmt == "gguf"`` also
    :class:`runtime.gguf_blocks.QTensor`) as one :class:`Linear` in ``fmt`` (``gguf``: each
    part as stored, :meth:`Linear.concat`)."""
    if fmt == "gguf":
        return Linear.concat([Linear.stored(t) for t in parts])
    return Linear.of(np.concatenate(parts) if len(parts) > 1 else parts[0], fmt)


class _Layer:
    __slots__ = ("ln1", "wqkv", "bqkv", "wo", "bo", "qn", "kn", "ln2", "wgu", "wd", "k", "v")

    def __init__(self, w: dict[str, np.ndarray], i: int, cfg: ModelConfig, fmt: str = "f32") -> None:
        p = f"model.layers.{i}."
        a = p + "self_attn."
        self.ln1 = w.pop(p + "input_layernorm.weight")
        self.ln2 = w.pop(p + "post_attention_layernorm.weight")
        self.wqkv = _matrix(fmt, w.pop(a + "q_proj.weight"), w.pop(a + "k_proj.weight"), w.pop(a + "v_proj.weight"))
        self.bqkv = (np.concatenate([w.pop(a + "q_proj.bias"), w.pop(a + "k_proj.bias"), w.pop(a + "v_proj.bias")])
                     if cfg.qkv_bias else None)
        self.wo = _matrix(fmt, w.pop(a + "o_proj.weight"))
        self.bo = w.pop(a + "o_proj.bias") if cfg.o_bias else None
        self.qn = w.pop(a + "q_norm.weight") if cfg.qk_norm else None
        self.kn = w.pop(a + "k_norm.weight") if cfg.qk_norm else None
        self.wgu = _matrix(fmt, w.pop(p + "mlp.gate_proj.weight"), w.pop(p + "mlp.up_proj.weight"))
        self.wd = _matrix(fmt, w.pop(p + "mlp.down_proj.weight"))
        self.k: np.ndarray | None = None  # [n_kv, capacity, D]
        self.v: np.ndarray | None = None


class NumpyStage(Stage):
    """Layers ``[spec.start, spec.end)`` in float32 numpy, with a KV cache for those layers only.

    Args:
        cfg: model shape.
        spec: layer range and host flag.
        weights: ``{hf_name: float32 array}`` from :func:`runtime.weights.load_range` (with
            ``precision.weights == "gguf"``: float32 arrays and QTensors from
            :func:`runtime.weights.load_range_native`, held as stored); consumed (entries are
            popped) so the stage does not hold a second copy.
        max_ctx: positions the KV cache may hold (it grows by doubling up to this).
        precision: storage of weights and KV (default float32; ``residual`` is the codec's).
    Memory: the range's weights (4, 2 or 9/8 B/param for f32, f16, q8, the file's bytes for gguf;
    norms float32) + KV cache ``2 * n_kv * D * (4 or 2) B`` per layer per position, for each
    cache slot used (:meth:`use_cache`: one per question in flight).
    """

    def __init__(self, cfg: ModelConfig, spec: StageSpec, weights: dict[str, np.ndarray], max_ctx: int = 2048,
                 precision: Precision = FLOAT32) -> None:
        if not (0 <= spec.start <= spec.end <= cfg.n_layers):
            raise ValueError(f"layer range [{spec.start}, {spec.end}) outside [0, {cfg.n_layers})")
        self.cfg, self.spec, self.max_ctx = cfg, spec, int(max_ctx)
        self.precision = precision
        self._kv_dtype = np.float16 if precision.kv == "f16" else F32
        fmt = precision.weights
        w = weights  # consumed: each tensor is popped so its memory can go once fused
        for a in w.values():
            assert (fmt == "gguf" and not isinstance(a, np.ndarray)) or a.dtype == F32, "weights must be float32"
        self.layers = [_Layer(w, i, cfg, fmt) for i in range(spec.start, spec.end)]
        self.embedding = self.norm = self.lm_head = None  # Linear, float32 vector, Linear
        if spec.host:
            self.embedding = _matrix(fmt, w.pop(EMBED))
            self.norm = w.pop(FINAL_NORM)
            self.lm_head = self.embedding if cfg.tie_embeddings else _matrix(fmt, w.pop(LM_HEAD))
        w.clear()
        self.cos, self.sin = rope_tables(cfg, self.max_ctx)
        self._pos = 0

    # ---------------------------------------------------------------- Stage API
    def embed(self, ids) -> np.ndarray:
        self._require_host()
        a = check_ids(ids, self.cfg.vocab)
        return self.embedding.rows(a)

    def head(self, hidden: np.ndarray) -> np.ndarray:
        self._require_host()
        x = check_hidden(hidden, self.cfg.hidden)
        logits = self.lm_head.apply(rms_norm(x, self.norm, self.cfg.rms_eps))
        assert logits.dtype == F32
        return logits

    def forward(self, hidden: np.ndarray, first_pos: int) -> np.ndarray:
        x = check_hidden(hidden, self.cfg.hidden).copy()
        n = x.shape[0]
        self._check_pos(first_pos, n)
        for layer in self.layers:
            x = self._layer(layer, x, first_pos)
        self._pos = first_pos + n
        assert x.dtype == F32
        return x

    def _swap_cache(self, old: int, new: int) -> None:
        """Each layer's ``k``/``v`` arrays of slot ``old`` put aside, slot ``new``'s taken
        back (none yet: allocated on first use)."""
        store = self.__dict__.setdefault("_kv_store", {})
        store[old] = [(L.k, L.v) for L in self.layers]
        back = store.pop(new, None)
        for i, L in enumerate(self.layers):
            L.k, L.v = back[i] if back is not None else (None, None)

    # ---------------------------------------------------------------- internals
    def _ensure_cache(self, layer: _Layer, need: int) -> None:
        c = self.cfg
        cap = 0 if layer.k is None else layer.k.shape[1]
        if need <= cap:
            return
        new_cap = min(self.max_ctx, max(need, 2 * cap, 64))
        k = np.zeros((c.n_kv_heads, new_cap, c.head_dim), self._kv_dtype)
        v = np.zeros_like(k)
        if cap:
            k[:, :cap] = layer.k
            v[:, :cap] = layer.v
        layer.k, layer.v = k, v

    def _layer(self, L: _Layer, x: np.ndarray, p0: int) -> np.ndarray:
        c = self.cfg
        n, D, H, KV = x.shape[0], c.head_dim, c.n_heads, c.n_kv_heads
        G = H // KV
        T = p0 + n
        cos, sin = self.cos[p0:T], self.sin[p0:T]

        h = rms_norm(x, L.ln1, c.rms_eps)
        qkv = L.wqkv.apply(h)  # [n, (H + 2KV) * D]
        if L.bqkv is not None:
            qkv = qkv + L.bqkv
        q = qkv[:, : H * D].reshape(n, H, D)
        k = qkv[:, H * D : (H + KV) * D].reshape(n, KV, D)
        if L.qn is not None:
            q, k = rms_norm(q, L.qn, c.rms_eps), rms_norm(k, L.kn, c.rms_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = qkv[:, (H + KV) * D :].reshape(n, KV, D)
        self._ensure_cache(L, T)
        L.k[:, p0:T] = k.transpose(1, 0, 2)
        L.v[:, p0:T] = v.transpose(1, 0, 2)
        K, V = L.k[:, :T], L.v[:, :T]  # [KV, T, D]
        if K.dtype != F32:  # float16 cache: attention computes in float32
            K, V = K.astype(F32), V.astype(F32)

        qg = q.reshape(n, KV, G, D).transpose(1, 2, 0, 3).reshape(KV, G * n, D)
        scores = (qg @ K.transpose(0, 2, 1)) * F32(1.0 / np.sqrt(D))  # [KV, G*n, T]
        scores = scores.reshape(KV, G, n, T)
        # causal: query i (position p0+i) sees keys j <= p0+i
        qpos = (p0 + np.arange(n))[:, None]
        mask = np.arange(T)[None, :] > qpos
        if c.sliding_window:
            mask |= np.arange(T)[None, :] <= qpos - c.sliding_window
        scores = np.where(mask, F32(-np.inf), scores)
        scores = scores - scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        o = (p.reshape(KV, G * n, T) @ V).reshape(KV, G, n, D).transpose(2, 0, 1, 3).reshape(n, H * D)
        o = L.wo.apply(o)
        x = x + (o + L.bo if L.bo is not None else o)

        h = rms_norm(x, L.ln2, c.rms_eps)
        gu = L.wgu.apply(h)
        f = c.ffn
        x = x + L.wd.apply(silu(gu[:, :f]) * gu[:, f:])
        assert x.dtype == F32
        return x
