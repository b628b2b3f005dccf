"""Tiny random-weight checkpoints made with ``transformers`` for the any-model tests: saved with
``save_pretrained`` and written as GGUF with the ``gguf`` package the way llama.cpp's
convert_hf_to_gguf.py writes them (the reference layout, not splitroom's reader).

Import only from tests that skip without torch/transformers/gguf.
"""

from __future__ import annotations

import json
import math

import numpy as np


def randomize(model, seed: int) -> None:
    """Weights with spread (transformers' init gives near-uniform logits): matrices N(0, 1/fan_in)
    (the embedding N(0, 1)), norm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                std = 1.0 if "embed" in name else 1.0 / math.sqrt(p.shape[1])
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)


def make_model(config, seed: int):
    """A float32 ``AutoModelForCausalLM`` of ``config`` with :func:`randomize`'d weights, in eval mode."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, seed + 100)
    return model.eval()


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, the reference for the stored layout."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(c) -> np.ndarray:
    """llama.cpp's rope_freqs for Llama 3 scaling (convert_hf_to_gguf.py, LlamaModel), per frequency."""
    rp = c.rope_parameters
    dim = c.head_dim
    freqs = 1.0 / (rp["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    old, low, high, factor = (rp["original_max_position_embeddings"], rp["low_freq_factor"],
                              rp["high_freq_factor"], rp["factor"])
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < old / high:
            out.append(1.0)
        elif wl > old / low:
            out.append(factor)
        else:
            s = (old / wl - low) / (high - low)
            out.append(1.0 / ((1 - s) / factor + s))
    return np.asarray(out, dtype=np.float32)


def small_vocab(tokenizer_json, keep: int = 3000):
    """SmolLM2's byte-level BPE cut to its first ``keep`` ids: ``(tokens, token types, merges)``
    with the merges among kept tokens and its control tokens typed 3 (llama.cpp CONTROL)."""
    d = json.loads(open(tokenizer_json, encoding="utf-8").read())
    tokens = sorted(d["model"]["vocab"], key=d["model"]["vocab"].get)[:keep]
    kept = set(tokens)
    merges = []
    for m in d["model"]["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in kept and b in kept and a + b in kept:
            merges.append(f"{a} {b}")
    control = {t["id"] for t in d["added_tokens"] if t["special"]}
    return tokens, [3 if i in control else 1 for i in range(keep)], merges


def add_tokenizer(w, vocab, pre: str, template: str | None, bos: int = 1, eos: int = 2) -> None:
    """Write a byte-level BPE tokenizer (``small_vocab``'s output) into GGUFWriter ``w``."""
    tokens, types, merges = vocab
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    if template:
        w.add_chat_template(template)


def write_gguf(model, path, name: str | None = None, tokenizer=None) -> None:
    """Write ``model`` as llama.cpp would: Mistral as the llama architecture with Q/K rows
    permuted there, Llama 3 scaling as a ``rope_freqs`` tensor, tied heads without ``output``.
    ``tokenizer``: ``(vocab, pre, template)`` for :func:`add_tokenizer`, or None."""
    import gguf

    c = model.config
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[c.model_type]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name or f"tiny-{c.model_type}")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(c.vocab_size)
    if c.model_type == "qwen3":
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    if c.model_type == "mistral" and getattr(c, "sliding_window", None):
        w.add_sliding_window(c.sliding_window)
    if tokenizer is not None:
        add_tokenizer(w, *tokenizer)
    tmap = gguf.get_tensor_name_map({"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
                                     "qwen3": gguf.MODEL_ARCH.QWEN3}[arch], c.num_hidden_layers)
    sd = model.state_dict()
    if c.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    for key, t in sd.items():
        a = t.detach().numpy().astype(np.float32)
        if arch == "llama" and key.endswith("q_proj.weight"):
            a = llama_cpp_permute(a, c.num_attention_heads)
        elif arch == "llama" and key.endswith("k_proj.weight"):
            a = llama_cpp_permute(a, c.num_key_value_heads)
        w.add_tensor(tmap.get_name(key, try_suffixes=(".weight", ".bias")), np.ascontiguousarray(a))
    if c.rope_parameters.get("rope_type") == "llama3":
        w.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", llama3_rope_factors(c))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def greedy_reference(model, prompt, steps: int):
    """transformers' logits of ``prompt`` and its greedy continuation (full recompute each step)."""
    import torch

    ids = list(prompt)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return logits, ids[len(prompt):]


def write_random_gguf(path, layers: int = 6, hidden: int = 64, heads: int = 4, kv_heads: int = 2, ffn: int = 96,
                      tokenizer=None, seed: int = 0) -> None:
    """A Llama GGUF of random float32 weights written without torch (for tests that need a
    checkpoint's shape, not a reference); ``tokenizer`` as in :func:`write_gguf` sets the vocabulary."""
    import gguf

    vocab = len(tokenizer[0][0]) if tokenizer is not None else 256
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-random")
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    if tokenizer is not None:
        add_tokenizer(w, *tokenizer)
    d = hidden // heads

    def t(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32))

    t("token_embd.weight", vocab, hidden)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        t(f"blk.{i}.attn_q.weight", heads * d, hidden)
        t(f"blk.{i}.attn_k.weight", kv_heads * d, hidden)
        t(f"blk.{i}.attn_v.weight", kv_heads * d, hidden)
        t(f"blk.{i}.attn_output.weight", hidden, heads * d)
        t(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        t(f"blk.{i}.ffn_up.weight", ffn, hidden)
        t(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
