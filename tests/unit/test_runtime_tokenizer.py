"""Tokenizer built from the GGUF: round trips, special tokens, chat template, errors."""

from __future__ import annotations

import pytest

from runtime.tokenizer import ChatTokenizer, TokenizerError, build_tokenizer, render_chat_template
from runtime.weights import ensure_safetensors

ROUND_TRIP = [
    "plain words",
    " leading space, double  space,   triple",
    "tab\tseparated\tvalues\t",
    "crlf\r\nline\r\n\r\n",
    "digits 0123456789 and 3.14 and -42",
    "accents: éàüñ çœ ÅØ",
    "CJK: 漢字かなカナ 한국어",
    "emoji: 😀🎉👩‍👩‍👧 🇫🇷",
    "code: for (int i = 0; i < n; ++i) { s += a[i]; }\n\tif x:\n\t\treturn None",
]


@pytest.fixture(scope="module")
def tok():
    return ChatTokenizer.from_dir(ensure_safetensors())


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_digits_are_split_individually(tok):
    ids = tok.encode("2024")
    assert len(ids) == 4 and [tok.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_control_tokens_are_special(tok):
    assert tok.bos_id == 1 and tok.eos_id == 2
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
    assert tok.decode([1, 2]) == "" and tok.decode([1], skip_special=False) == "<|im_start|>"
    assert tok.stop_ids == {2}


def test_chat_template_renders_system_default(tok):
    text = tok.render_chat([{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode_chat("Hi")
    assert ids[0] == 1 and ids.count(1) == 3  # the template writes bos itself; encode adds none


def test_render_chat_template_raise_exception():
    from jinja2 import TemplateError

    with pytest.raises(TemplateError, match="bad role"):
        render_chat_template("{{ raise_exception('bad role') }}", [])


def test_stream_decoder_holds_partial_utf8(tok):
    ids = tok.encode("é🎉!")
    dec = tok.stream_decoder()
    pieces = [dec.push(i) for i in ids]
    assert "".join(pieces) + dec.flush() == "é🎉!"
    assert all("\ufffd" not in p for p in pieces)


def _meta(pre):
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.token_type": [1, 1, 1],
        "tokenizer.ggml.merges": ["a b"],
    }


def test_unknown_pre_tokenizer_is_an_error():
    with pytest.raises(TokenizerError, match="pre-tokenizer"):
        build_tokenizer(_meta("mystery-pre"))
    with pytest.raises(TokenizerError):
        build_tokenizer({**_meta("smollm"), "tokenizer.ggml.pre": None})
    with pytest.raises(TokenizerError):
        build_tokenizer({**_meta("smollm"), "tokenizer.ggml.model": "llama"})
    assert build_tokenizer(_meta("smollm")).encode("ab").ids == [2]
