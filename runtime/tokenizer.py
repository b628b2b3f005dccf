"""Tokenizer and chat template built from a GGUF's metadata, with the ``tokenizers`` library.

SmolLM2's GGUF says ``tokenizer.ggml.model = "gpt2"`` (byte-level BPE, vocabulary and merges
stored as byte-level strings such as ``"Ġthe"``) and ``tokenizer.ggml.pre = "smollm"``.
The "smollm" pre-tokenizer (llama.cpp ``LLAMA_VOCAB_PRE_TYPE_SMOLLM``; the original
HuggingFaceTB/SmolLM2 ``tokenizer.json``) first isolates every digit, then applies the GPT-2
byte-level split. Tokens of type 3 (CONTROL: ids 0..16, ``<|endoftext|>``, ``<|im_start|>``,
``<|im_end|>``, ``<repo_name>``...) are special: matched whole in text, dropped by ``decode``.

The chat template (``tokenizer.chat_template``) is rendered with jinja2 the way
``transformers`` does it (sandboxed, ``trim_blocks``/``lstrip_blocks``). It writes bos
(``<|im_start|>``, id 1) itself; no BOS is prepended by ``encode``. Generation stops on
eos = ``<|im_end|>`` (id 2).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CONTROL = 3  # llama.cpp token type of control tokens
USER_DEFINED = 4


class TokenizerError(ValueError):
    """The GGUF describes a tokenizer this module does not build (never silently defaulted)."""


def _pre_tokenizer(kind: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if kind == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if kind in ("gpt2", "default"):
        return byte_level
    raise TokenizerError(f"unknown GGUF pre-tokenizer type {kind!r}; known: smollm, gpt2, default")


def build_tokenizer(meta: dict) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from GGUF metadata (``{key: value}`` as in :func:`runtime.config.gguf_metadata`).

    Raises:
        TokenizerError: ``tokenizer.ggml.model`` is not ``gpt2`` or ``tokenizer.ggml.pre`` is unknown.
    """
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerError(f"unsupported GGUF tokenizer model {kind!r}; only byte-level BPE ('gpt2') is built")
    pre = meta.get("tokenizer.ggml.pre")
    if pre is None:
        raise TokenizerError("GGUF has no tokenizer.ggml.pre; refusing to guess the pre-tokenizer")
    tokens: Sequence[str] = meta["tokenizer.ggml.tokens"]
    types: Sequence[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    return tok


def write_tokenizer_files(meta: dict, out_dir: Path | str) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (chat template, bos/eos) into ``out_dir``."""
    out = Path(out_dir)
    tok = build_tokenizer(meta)
    tmp = out / "tokenizer.json.tmp"
    tok.save(str(tmp))
    tmp.replace(out / "tokenizer.json")
    tokens = meta["tokenizer.ggml.tokens"]
    bos = int(meta.get("tokenizer.ggml.bos_token_id", 1))
    eos = int(meta.get("tokenizer.ggml.eos_token_id", 2))
    cfg = {
        "chat_template": meta.get("tokenizer.chat_template"),
        "bos_token": tokens[bos],
        "eos_token": tokens[eos],
        "bos_token_id": bos,
        "eos_token_id": eos,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "pre_tokenizer": meta.get("tokenizer.ggml.pre"),
    }
    tmp = out / "tokenizer_config.json.tmp"
    tmp.write_text(json.dumps(cfg, indent=2))
    tmp.replace(out / "tokenizer_config.json")


def render_chat_template(template: str, messages: Sequence[dict], add_generation_prompt: bool = True, **extra) -> str:
    """Render a Hugging Face style chat template with jinja2 (sandboxed, as ``transformers`` does).

    Args:
        template: jinja2 source, e.g. the GGUF's ``tokenizer.chat_template``.
        messages: ``[{"role": "user"|"system"|"assistant", "content": str}, ...]``.
        add_generation_prompt: end with the assistant turn opener.
    Raises:
        jinja2.TemplateError: the template is invalid or calls ``raise_exception``.
    """
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt, **extra)


@dataclass
class ChatTokenizer:
    """Tokenizer + chat template of one model.

    Build with :meth:`from_dir` (files written by :func:`runtime.weights.ensure_safetensors`)
    or :meth:`from_gguf`. Ids are Python ints in ``[0, vocab)``.
    """

    tokenizer: Tokenizer
    chat_template: str | None
    bos_token: str
    eos_token: str
    bos_id: int
    eos_id: int
    stop_ids: frozenset[int] = field(default_factory=frozenset)
    _plain: Tokenizer | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.stop_ids:
            self.stop_ids = frozenset({self.eos_id})

    @classmethod
    def from_dir(cls, model_dir: Path | str) -> "ChatTokenizer":
        """Load ``tokenizer.json`` + ``tokenizer_config.json``. Raises FileNotFoundError if absent."""
        d = Path(model_dir)
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        return cls(
            tokenizer=Tokenizer.from_file(str(d / "tokenizer.json")),
            chat_template=cfg.get("chat_template"),
            bos_token=cfg["bos_token"],
            eos_token=cfg["eos_token"],
            bos_id=int(cfg["bos_token_id"]),
            eos_id=int(cfg["eos_token_id"]),
        )

    @classmethod
    def from_gguf(cls, gguf_path: Path | str) -> "ChatTokenizer":
        """Build straight from a GGUF file's metadata (no cache files)."""
        import gguf

        from .config import gguf_metadata

        meta = gguf_metadata(gguf.GGUFReader(str(gguf_path)))
        tokens = meta["tokenizer.ggml.tokens"]
        bos = int(meta.get("tokenizer.ggml.bos_token_id", 1))
        eos = int(meta.get("tokenizer.ggml.eos_token_id", 2))
        return cls(build_tokenizer(meta), meta.get("tokenizer.chat_template"), tokens[bos], tokens[eos], bos, eos)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in the text are matched whole; no BOS added.
        For trusted text only (a chat template's output): user text goes through :meth:`encode_text`."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text: a special token's spelling typed in it
        (``<|im_end|>``, ``<|im_start|>system``) is encoded as its characters, never as
        the special token, so user text cannot end a turn or open a system turn. No BOS."""
        if self._plain is None:
            plain = Tokenizer.from_str(self.tokenizer.to_str())
            plain.encode_special_tokens = True  # added special tokens are not matched in the text
            self._plain = plain
        return self._plain.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids`` (byte-level decoding; invalid UTF-8 pieces become U+FFFD)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` per the model's chat template.

        Raises:
            TokenizerError: the model has no chat template.
        """
        if not self.chat_template:
            raise TokenizerError("this model has no chat template")
        return render_chat_template(
            self.chat_template, messages, add_generation_prompt, bos_token=self.bos_token, eos_token=self.eos_token
        )

    def encode_chat(self, messages: Sequence[dict] | str, add_generation_prompt: bool = True) -> list[int]:
        """Ids of the rendered chat prompt; a plain string is one user message.

        Only the template's own text can give special tokens (its turn markers); every
        message's ``content`` is plain text (:meth:`encode_text`), so a ``<|im_end|>``
        typed by a user stays text. The contents are rendered as placeholders, the
        template's special tokens are cut out of its text, and each stretch of ordinary
        text between them (template text and contents joined) is encoded as one: the ids
        equal encoding the whole rendered prompt whenever no content spells a special token.

        Raises:
            TokenizerError: the model has no chat template.
        """
        import re

        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        contents = [str(m.get("content", "")) for m in messages]
        mark = "\ue000" + secrets.token_hex(8) + "\ue001"  # a private-use fence no content holds
        while any(mark in c for c in contents):  # pragma: no cover - 2^-64
            mark = "\ue000" + secrets.token_hex(8) + "\ue001"
        text = self.render_chat([dict(m, content=f"{mark}{i}{mark}") for i, m in enumerate(messages)],
                                add_generation_prompt)
        specials = {t.content: i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
        cut = re.compile("(" + "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")")
        ids: list[int] = []
        run: list[str] = []  # ordinary text since the last special token
        for j, piece in enumerate(text.split(mark)):
            if j % 2:
                run.append(contents[int(piece)])
                continue
            for k, part in enumerate(cut.split(piece) if specials else [piece]):
                if k % 2:
                    ids += self.encode_text("".join(run)) if any(run) else []
                    run = []
                    ids.append(specials[part])
                elif part:
                    run.append(part)
        if any(run):
            ids += self.encode_text("".join(run))
        return ids

    def stream_decoder(self) -> "StreamDecoder":
        """A fresh incremental decoder for streaming output token by token."""
        return StreamDecoder(self)


class StreamDecoder:
    """Turns ids arriving one at a time into text pieces without splitting UTF-8 characters.

    A piece is held back while the decoded text ends in U+FFFD (an incomplete multi-byte
    character); ``push`` returns ``""`` then.
    """

    def __init__(self, tok: ChatTokenizer) -> None:
        self._tok = tok
        self._ids: list[int] = []
        self._emitted = 0

    def push(self, token_id: int) -> str:
        """Add one id; return the newly completed text (possibly empty)."""
        self._ids.append(int(token_id))
        text = self._tok.decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        new = text[self._emitted :]
        self._emitted = len(text)
        return new

    def flush(self) -> str:
        """Whatever is still held back (replacement characters included)."""
        text = self._tok.decode(self._ids)
        new = text[self._emitted :]
        self._emitted = len(text)
        return new
