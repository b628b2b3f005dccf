"""numpy backend and tokenizer against Hugging Face ``transformers`` loaded from the same GGUF.

``transformers`` dequantizes the GGUF itself (its own code, not ours) into a float32
``LlamaForCausalLM``, and builds its own tokenizer from the GGUF metadata: an independent
reference. Loaded once per module.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from runtime.backends import StageSpec, make_stage  # noqa: E402
from runtime.generate import generate_greedy  # noqa: E402
from runtime.tokenizer import ChatTokenizer  # noqa: E402
from runtime.weights import ensure_safetensors, find_gguf  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that adds two numbers.",
    "List three colours of the rainbow, one per line.",
]

STRINGS = [
    "Hello world",
    "  two leading spaces and\ttabs\t\there",
    "windows\r\nline\r\nendings\n",
    "digits 0 12 345 6789 3.14159 1,000,000",
    "accents: café, naïve, Ångström, über",
    "CJK: 東京は日本の首都です。中文测试。한국어",
    "emoji: 🎉🚀 👩‍💻 ❤️",
    "def f(x):\n    return {'a': [x ** 2, x // 3]}  # comment\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "It's 'quoted' and \"double\" — dash… ellipsis",
    "",
]


@pytest.fixture(scope="module")
def hf():
    """transformers' tokenizer and float32 model of the bundled GGUF.

    transformers reads the file three times (tokenizer, config, weights: gguf-py's
    ``GGUFReader``, about 9 s each here for SmolLM2's 49,152 tokens and 48,900 merges) and
    builds gguf-py's tensor-name map once per tensor (397 times, 12 s): while loading,
    both are memoized (one reader of the file and one map per architecture serve every
    call). Both are pure: the reader memory-maps the same bytes, and the map is only
    looked up; the values (dequantized weights, token ids) are transformers' and gguf-py's
    own."""
    import functools

    import gguf
    g = find_gguf()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=None)(gguf.GGUFReader))
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        tok = transformers.AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(g.parent), gguf_file=g.name,
                                                                  dtype=torch.float32)
    model.eval()
    return tok, model


@pytest.fixture(scope="module")
def model_dir():
    return ensure_safetensors()


@pytest.fixture(scope="module")
def ours(model_dir):
    return ChatTokenizer.from_dir(model_dir)


@pytest.mark.parametrize("text", STRINGS)
def test_token_ids_match_transformers(hf, ours, text):
    hf_tok, _ = hf
    assert ours.encode(text) == hf_tok.encode(text, add_special_tokens=False)


def test_chat_prompt_ids_match_transformers(hf, ours):
    hf_tok, _ = hf
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[0]}]
    expected = hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(expected, dict) or hasattr(expected, "keys"):
        expected = expected["input_ids"]
    assert ours.encode_chat(msgs) == list(expected)


def test_step0_logits_within_1e4_relative(hf, ours, model_dir):
    _, model = hf
    ids = ours.encode_chat(PROMPTS[0])
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    stage = make_stage("numpy", model_dir, StageSpec(0, 30, host=True))
    got = stage.head(stage.embed_forward(ids, 0))
    assert got.dtype == np.float32 and got.shape == ref.shape
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel < 1e-4, rel
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_ids_identical_to_transformers(hf, ours, model_dir, prompt):
    _, model = hf
    ids = ours.encode_chat(prompt)
    n_new = 16
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=n_new, do_sample=False, eos_token_id=2, pad_token_id=2
        )[0, len(ids) :].tolist()
    stage = make_stage("numpy", model_dir, StageSpec(0, 30, host=True))
    res = generate_greedy([stage], ids, max_new_tokens=n_new, stop_ids={2})
    assert res.ids == out


def test_france_answer_is_paris(ours, model_dir):
    stage = make_stage("numpy", model_dir, StageSpec(0, 30, host=True))
    res = generate_greedy([stage], ours.encode_chat(PROMPTS[0]), max_new_tokens=40)
    assert res.stopped and res.ids[-1] == 2
    assert ours.decode(res.ids) == "The capital of France is Paris."
