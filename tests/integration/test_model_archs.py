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

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from runtime.backends import StageSpec, make_stage, wgpu_unsupported  # noqa: E402
from runtime.config import ModelConfig, UnsupportedModel, describe  # noqa: E402
from runtime.generate import generate_greedy, prefill  # noqa: E402
from runtime.precision import Precision  # noqa: E402
from runtime.weights import prepare_model, prepare_native  # noqa: E402
from tests.tinymodels import greedy_reference, make_model, write_gguf  # noqa: E402

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


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{arch: (hf model, safetensors dir, gguf model dir)}; conversions cached under tmp."""
    root = tmp_path_factory.mktemp("archs")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPLITROOM_CACHE", str(root / "cache"))
        for i, (key, make) in enumerate(CONFIGS.items()):
            model = make_model(make(), i)
            d = root / key
            model.save_pretrained(d)
            write_gguf(model, root / f"{key}.gguf")
            out[key] = (model, prepare_model(d, progress=None), prepare_model(root / f"{key}.gguf", progress=None))
            prepare_native(root / f"{key}.gguf", progress=None)  # the same folder: adds the blocks' source
    return out


@pytest.fixture(scope="module")
def references(checkpoints):
    return {k: greedy_reference(m, PROMPT, STEPS) for k, (m, _, _) in checkpoints.items()}


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


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_held_as_stored_matches_transformers(checkpoints, references, arch):
    """weights: gguf reads the GGUF's own tensors (biases, q/k norms, RoPE factors, untied heads
    included) instead of the float32 conversion: the same transformers reference."""
    _, _, gg_dir = checkpoints[arch]
    ref_logits, ref_ids = references[arch]
    stages = [make_stage("numpy", gg_dir, StageSpec(a, b, host=(i == 0)), max_ctx=64, precision=Precision(weights="gguf"))
              for i, (a, b) in enumerate(zip(SPLITS["2-way"], SPLITS["2-way"][1:]))]
    got = stages[0].head(prefill(stages, PROMPT, chunk=5))
    ref = ref_logits[-got.shape[0]:]
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    for s in stages:
        s.rollback(0)
    assert generate_greedy(stages, PROMPT, max_new_tokens=STEPS, stop_ids=frozenset()).ids == ref_ids


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
