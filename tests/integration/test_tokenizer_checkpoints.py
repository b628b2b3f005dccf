"""Tokenizers and chat templates from checkpoints, against ``transformers``.

GGUF: byte-level BPE vocabularies labelled with the Llama 3 (``llama-bpe``) and Qwen2
(``qwen2``) pre-tokenizers, written here with ``gguf.GGUFWriter`` from a 3,000-token cut of
SmolLM2's vocabulary (its merges among those tokens, its 17 control tokens, its chat template);
``transformers`` builds its own tokenizer from each file (its GGUF loader, not our code).
Safetensors directory: that tokenizer saved by ``transformers``' ``save_pretrained``
(``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``). Ids must be equal on a
fixed string set with special tokens, digits, CJK and emoji; chat prompts equal to
``apply_chat_template``; templates using ``{% generation %}`` and ``strftime_now`` render as
``transformers`` renders them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from runtime.tokenizer import ChatTokenizer, TokenizerError, render_chat_template  # noqa: E402
from runtime.weights import ensure_safetensors, prepare_model  # noqa: E402
from tests.tinymodels import add_tokenizer, small_vocab  # noqa: E402

STRINGS = [
    "Hello world",
    "digits 0 12 345 6789 3.14159 1,000,000",
    "CJK: 東京は日本の首都です。中文测试。한국어",
    "emoji: 🎉🚀 👩‍💻 ❤️",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|>text<repo_name>x",
    "  two leading spaces and\ttabs\n\n\nnewlines",
    "It's 'quoted' and they'll — dash… ellipsis",
    "",
]
KEEP = 3000
PRES = {"llama-bpe": "llama", "qwen2": "qwen2"}


@pytest.fixture(scope="module")
def vocab():
    """SmolLM2's tokenizer cut to its first KEEP ids, and its chat template."""
    d = ensure_safetensors()
    return small_vocab(d / "tokenizer.json", KEEP), json.loads((d / "tokenizer_config.json").read_text())["chat_template"]


def _write(path, arch, pre, vocab):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(0)  # a model of no layers: embedding, final norm and tied head only
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    add_tokenizer(w, vocab[0], pre, vocab[1])
    w.add_tensor("token_embd.weight", np.zeros((KEEP, 8), np.float32))
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory, vocab):
    root = tmp_path_factory.mktemp("tok")
    out = {}
    for pre, arch in PRES.items():
        _write(root / f"{pre}.gguf", arch, pre, vocab)
        hf = transformers.AutoTokenizer.from_pretrained(str(root), gguf_file=f"{pre}.gguf")
        saved = root / f"{pre}-hf"
        hf.save_pretrained(saved)
        out[pre] = (root / f"{pre}.gguf", hf, saved)
    return out


@pytest.mark.parametrize("pre", list(PRES))
def test_gguf_tokenizer_ids_equal_transformers(files, pre):
    path, hf, _ = files[pre]
    ours = ChatTokenizer.from_gguf(path)
    for s in STRINGS:
        assert ours.encode(s) == hf.encode(s, add_special_tokens=False), s
        assert ours.decode(ours.encode(s), skip_special=False) == s


@pytest.mark.parametrize("pre", list(PRES))
def test_saved_directory_ids_and_chat_equal_transformers(files, pre):
    _, _, saved = files[pre]
    hf = transformers.AutoTokenizer.from_pretrained(str(saved))
    ours = ChatTokenizer.from_dir(saved)
    assert ours.eos_id == hf.eos_token_id == 2 and 2 in ours.stop_ids
    for s in STRINGS:
        assert ours.encode(s) == hf.encode(s, add_special_tokens=False), s
    msgs = [{"role": "system", "content": "Be brief. 東京 🎉"}, {"role": "user", "content": "What is 12 + 345?"}]
    want = hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ours.encode_chat(msgs) == list(want)


def test_gguf_converted_into_model_dir(files, tmp_path, monkeypatch):
    """A GGUF given by path becomes a model directory whose tokenizer equals the file's."""
    monkeypatch.setenv("SPLITROOM_CACHE", str(tmp_path))
    path, hf, _ = files["qwen2"]
    d = prepare_model(path, progress=None)
    ours = ChatTokenizer.from_dir(d)
    for s in STRINGS:
        assert ours.encode(s) == hf.encode(s, add_special_tokens=False), s


def test_sentencepiece_gguf_is_refused():
    with pytest.raises(TokenizerError, match="--ids"):
        from runtime.tokenizer import build_tokenizer
        build_tokenizer({"tokenizer.ggml.model": "llama"})


TEMPLATES = {
    # the tag some public templates use to mark what the assistant wrote
    "generation": ("{% for m in messages %}<|{{ m.role }}|>"
                   "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
                   "{% else %}{{ m.content }}{% endif %}\n{% endfor %}"
                   "{% if add_generation_prompt %}<|assistant|>{% endif %}"),
    # as Llama 3.x templates date their system turn
    "strftime_now": ("{{ bos_token }}Cutting Knowledge Date: December 2023\nToday Date: "
                     "{{ strftime_now('%d %b %Y') }}\n{% for m in messages %}{{ m.role }}: {{ m.content }}\n"
                     "{% endfor %}"),
    "tojson": "{% for m in messages %}{{ m | tojson }}{{ m.content | tojson(indent=2) }}{% endfor %}",
}


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_chat_templates_render_as_transformers(files, name):
    _, hf, _ = files["qwen2"]
    msgs = [{"role": "user", "content": "Café 東京 \"q\" <b>"}, {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "and Rome?"}]
    want = hf.apply_chat_template(msgs, chat_template=TEMPLATES[name], tokenize=False, add_generation_prompt=True)
    got = render_chat_template(TEMPLATES[name], msgs, True, bos_token=hf.bos_token, eos_token=hf.eos_token)
    assert got == want
