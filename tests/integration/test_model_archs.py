"""Llama (Llama-3 RoPE scaling), Mistral (sliding window), Qwen2 (q/k/v biases) and Qwen3
(q/k norms, its own head width), tied and untied heads: tiny random-weight checkpoints made
here with ``transformers``, saved with ``save_pretrained`` and written as GGUF with the
``gguf`` package's ``GGUFWriter`` the way llama.cpp's convert_hf_to_gguf.py writes them
(Q/K rows permuted for the llama architecture, Llama-3 scaling as a ``rope_freqs`` tensor),
loaded by splitroom and compared with ``transformers`` (torch float32) as the reference:
logits within 1e-4 of the largest, greedy ids identical over 10 steps, whole and with the
layers split 2 and 3 ways (stages in one process, the residual passed between them).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from runtime.backends import StageSpec, make_stage, wgpu_unsupported  # noqa: E402
from runtime.config import ModelConfig, UnsupportedModel, describe  # noqa: E402
from runtime.generate import generate_greedy, prefill  # noqa: E402
from runtime.weights import prepare_model  # noqa: E402

N_LAYERS = 6
PROMPT = [5, 77, 3, 190, 42, 42, 9, 250, 11, 0, 133, 64]
STEPS = 10
SPLITS = {"whole": (0, 6), "2-way": (0, 3, 6), "3-way": (0, 2, 4, 6)}

COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=N_LAYERS, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, rms_norm_eps=1e-5, max_position_embeddings=256)
CONFIGS = {
    # Llama 3.x RoPE scaling: theta 100, head_dim 16 gives wavelengths 6.3 ... 3500 positions, so
    # with original 32 (high 4 -> 8, low 1 -> 32) some are kept, two blended and the rest divided
    "llama3": lambda: transformers.LlamaConfig(**COMMON, tie_word_embeddings=False, rope_parameters={
        "rope_type": "llama3", "rope_theta": 100.0, "factor": 4.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "llama-tied": lambda: transformers.LlamaConfig(**COMMON, tie_word_embeddings=True),
    # a window of 8 over a 22-position sequence: most queries see only part of their past
    "mistral": lambda: transformers.MistralConfig(**COMMON, tie_word_embeddings=False, sliding_window=8),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, tie_word_embeddings=True),
    # head_dim 24: the attention width 4 x 24 = 96 differs from hidden 64
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=24, tie_word_embeddings=False),
}


def _randomize(model, seed: int) -> None:
    """Weights with spread (transformers' init gives near-uniform logits): matrices N(0, 1/fan_in)
    (the embedding N(0, 1)), norm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2)."""
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


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, the reference for the stored layout."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_rope_factors(c) -> np.ndarray:
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


def _write_gguf(model, path) -> None:
    """Write the model as llama.cpp would: Mistral as the llama architecture, Q/K permuted there."""
    c = model.config
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[c.model_type]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{c.model_type}")
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
    if getattr(c, "sliding_window", None) and c.model_type == "mistral":
        w.add_sliding_window(c.sliding_window)
    tmap = gguf.get_tensor_name_map({"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
                                     "qwen3": gguf.MODEL_ARCH.QWEN3}[arch], c.num_hidden_layers)
    sd = model.state_dict()
    if c.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    for name, t in sd.items():
        a = t.detach().numpy().astype(np.float32)
        if arch == "llama" and name.endswith("q_proj.weight"):
            a = _llama_cpp_permute(a, c.num_attention_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            a = _llama_cpp_permute(a, c.num_key_value_heads)
        w.add_tensor(tmap.get_name(name, try_suffixes=(".weight", ".bias")), np.ascontiguousarray(a))
    if c.rope_parameters.get("rope_type") == "llama3":
        w.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", _llama3_rope_factors(c))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{arch: (hf model, safetensors dir, gguf model dir)}; conversions cached under tmp."""
    root = tmp_path_factory.mktemp("archs")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPLITROOM_CACHE", str(root / "cache"))
        for i, (key, make) in enumerate(CONFIGS.items()):
            torch.manual_seed(i)
            model = transformers.AutoModelForCausalLM.from_config(make(), dtype=torch.float32)
            _randomize(model, 100 + i)
            model.eval()
            d = root / key
            model.save_pretrained(d)
            _write_gguf(model, root / f"{key}.gguf")
            out[key] = (model, prepare_model(d, progress=None), prepare_model(root / f"{key}.gguf", progress=None))
    return out


def _reference(model, steps: int = STEPS) -> tuple[np.ndarray, list[int]]:
    """transformers' logits of PROMPT and its greedy continuation (full recompute each step)."""
    ids = list(PROMPT)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return logits, ids[len(PROMPT):]


@pytest.fixture(scope="module")
def references(checkpoints):
    return {k: _reference(m) for k, (m, _, _) in checkpoints.items()}


def _stages(model_dir, bounds):
    return [make_stage("numpy", model_dir, StageSpec(a, b, host=(i == 0)), max_ctx=64)
            for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_config_read_from_checkpoint(checkpoints, arch, fmt):
    model, st_dir, gg_dir = checkpoints[arch]
    c = model.config
    cfg = ModelConfig.load(st_dir if fmt == "safetensors" else gg_dir)
    assert (cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.ffn, cfg.vocab) == (6, 64, 4, 2, 96, 256)
    assert cfg.head_dim == (24 if arch == "qwen3" else 16)
    assert cfg.tie_embeddings == c.tie_word_embeddings
    assert cfg.qkv_bias == (arch == "qwen2") and cfg.qk_norm == (arch == "qwen3") and not cfg.o_bias
    assert cfg.sliding_window == (8 if arch == "mistral" else 0)
    if arch == "llama3":
        assert cfg.rope_scaling["rope_type"] == ("llama3" if fmt == "safetensors" else "factors")


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_matches_transformers(checkpoints, references, arch, split, fmt):
    _, st_dir, gg_dir = checkpoints[arch]
    ref_logits, ref_ids = references[arch]
    stages = _stages(st_dir if fmt == "safetensors" else gg_dir, SPLITS[split])
    got = stages[0].head(prefill(stages, PROMPT, chunk=5))  # 3 chunks: 5 + 5 + 2
    # prefill returns the last chunk's residual: compare those rows
    ref = ref_logits[-got.shape[0]:]
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    for s in stages:
        s.rollback(0)
    res = generate_greedy(stages, PROMPT, max_new_tokens=STEPS, stop_ids=frozenset())
    assert res.ids == ref_ids


def test_all_prompt_logits_and_spread(checkpoints, references):
    """Every prompt position's logits (one chunk), and the weights give a real ranking: the
    top two logits of each reference row differ by far more than the tolerance."""
    for arch, (_, st_dir, _) in checkpoints.items():
        ref_logits, _ = references[arch]
        st = _stages(st_dir, (0, 6))[0]
        got = st.head(st.embed_forward(PROMPT, 0))
        assert np.abs(got - ref_logits).max() <= 1e-4 * np.abs(ref_logits).max(), arch
        top2 = np.sort(ref_logits, axis=-1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0]).min() > 1e-3 * np.abs(ref_logits).max(), arch


def test_describe_gives_planner_record(checkpoints):
    """The planner's record counts the parameters the runtime loads: biases and q/k norms included."""
    from planner.model import spec_from_architecture
    from safetensors import safe_open

    for arch, (_, st_dir, _) in checkpoints.items():
        import json
        a, cfg = describe(json.loads((st_dir / "config.json").read_text()))
        spec = spec_from_architecture(arch, arch, a)
        with safe_open(str(st_dir / "model.safetensors"), framework="numpy") as f:
            per_layer = sum(int(np.prod(f.get_slice(n).get_shape())) for n in f.keys() if n.startswith("model.layers.0."))
            emb = int(np.prod(f.get_slice("model.embed_tokens.weight").get_shape()))
        assert spec.layer_bytes == per_layer * 4, arch
        assert spec.embedding_bytes == emb * 4
        assert spec.head_bytes == (0 if cfg.tie_embeddings else emb * 4), arch


def test_wgpu_computes_every_architecture(checkpoints, references):
    """The wgpu backend (lavapipe in CI) on each transformers-made checkpoint: logits of PROMPT
    within float32 tolerance of transformers' and the same next tokens."""
    for arch, (_, st_dir, _) in checkpoints.items():
        cfg = ModelConfig.load(st_dir)
        assert wgpu_unsupported(cfg) == [], arch
        st = make_stage("wgpu", st_dir, StageSpec(0, cfg.n_layers, host=True), max_ctx=64)
        got = st.head(st.embed_forward(list(PROMPT), 0))
        want = references[arch][0]
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4, arch
        assert (got.argmax(-1) == want.argmax(-1)).all(), arch


def test_unsupported_architecture_is_refused(tmp_path):
    import json
    d = tmp_path / "gemma"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gemma", "num_hidden_layers": 2}))
    with pytest.raises(UnsupportedModel, match="unsupported model_type 'gemma'"):
        prepare_model(d, progress=None)
