"""Tokenizer and chat template of a checkpoint, with the ``tokenizers`` library.

From a model directory (:meth:`ChatTokenizer.from_dir`): ``tokenizer.json`` as ``transformers``
writes it, with ``tokenizer_config.json`` (special tokens, chat template) and, since
transformers 5, ``chat_template.jinja``. From a GGUF (:func:`build_tokenizer`): the vocabulary
and merges of a byte-level BPE (``tokenizer.ggml.model = "gpt2"``), split before the byte-level
step as the file's ``tokenizer.ggml.pre`` says, as ``transformers``' GGUF loader and llama.cpp
do: ``smollm`` (digits one by one, then GPT-2's split), ``gpt2``/``default``, the Llama 3 split
(``llama-bpe`` and its aliases) and the Qwen2 split (``qwen2`` and its aliases). SentencePiece
GGUF vocabularies (``tokenizer.ggml.model = "llama"``, Llama 2 / Mistral v0.1) are refused
with :class:`TokenizerError`: give such a model's prompt as ids.

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

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

CONTROL = 3  # llama.cpp token type of control tokens
USER_DEFINED = 4


class TokenizerError(ValueError):
    """The GGUF describes a tokenizer this module does not build (never silently defaulted)."""


# The split patterns of byte-level BPE vocabularies, by llama.cpp's pre-tokenizer name
# (tokenizer.ggml.pre). Llama 3: Meta's tiktoken pattern (llama3 tokenizer.py), numbers in runs
# of up to three digits. Qwen2: the same with single digits (Qwen2's tokenizer.json,
# transformers' qwen2 PRETOKENIZE_REGEX).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
           "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}


def _pre_tokenizer(kind: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if kind == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if kind in ("gpt2", "default"):
        return byte_level
    if kind in _SPLITS:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_SPLITS[kind]), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raise TokenizerError(f"unknown GGUF pre-tokenizer type {kind!r}; known: smollm, gpt2, default, "
                         f"{', '.join(_SPLITS)}")


def build_tokenizer(meta: dict) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from GGUF metadata (``{key: value}`` as in :func:`runtime.config.gguf_metadata`).

    Raises:
        TokenizerError: ``tokenizer.ggml.model`` is not ``gpt2`` or ``tokenizer.ggml.pre`` is unknown.
    """
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerError(f"unsupported GGUF tokenizer model {kind!r}; only byte-level BPE ('gpt2') is built "
                             "(give the prompt as ids: --ids)")
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
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    cfg = {
        "chat_template": meta.get("tokenizer.chat_template"),
        "bos_token": tokens[int(bos)] if bos is not None else None,
        "eos_token": tokens[int(eos)] if eos is not None else None,
        "bos_token_id": int(bos) if bos is not None else None,
        "eos_token_id": int(eos) if eos is not None else None,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "pre_tokenizer": meta.get("tokenizer.ggml.pre"),
    }
    tmp = out / "tokenizer_config.json.tmp"
    tmp.write_text(json.dumps(cfg, indent=2))
    tmp.replace(out / "tokenizer_config.json")


def _generation_extension():
    """A jinja2 extension for ``{% generation %}...{% endgeneration %}`` (the tag public
    templates use to mark what the assistant wrote): the body renders as it is, as in
    ``transformers``, which only records where it lies (for training masks)."""
    import jinja2
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    return Generation


_ENV = None


def _chat_env():
    """The jinja2 environment of chat templates, as ``transformers``' ``apply_chat_template``
    makes it: sandboxed, ``trim_blocks``/``lstrip_blocks``, loop controls, the ``generation``
    tag, ``raise_exception``, ``strftime_now(fmt)`` (local time now), and a ``tojson`` that
    keeps non-ASCII characters and takes ``indent``/``separators``/``sort_keys``."""
    global _ENV
    if _ENV is None:
        from datetime import datetime

        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[_generation_extension(), "jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        _ENV = env
    return _ENV


def render_chat_template(template: str, messages: Sequence[dict], add_generation_prompt: bool = True, **extra) -> str:
    """Render a Hugging Face style chat template with jinja2, as ``transformers`` does (see :func:`_chat_env`).

    Args:
        template: jinja2 source, e.g. the GGUF's ``tokenizer.chat_template``.
        messages: ``[{"role": "user"|"system"|"assistant", "content": str}, ...]``.
        add_generation_prompt: end with the assistant turn opener.
        extra: more template variables (``bos_token``, ``eos_token``, ``tools``, ...).
    Raises:
        jinja2.TemplateError: the template is invalid or calls ``raise_exception``.
    """
    return _chat_env().from_string(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                                    **extra)


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
        """Load ``tokenizer.json`` + ``tokenizer_config.json`` (written by :mod:`runtime.weights`
        or by ``transformers``' ``save_pretrained``), the chat template from
        ``chat_template.jinja`` when there is one, and the stop ids: the tokenizer's eos and the
        model's eos ids (config.json, generation_config.json).

        Raises:
            FileNotFoundError: no ``tokenizer.json`` there.
        """
        d = Path(model_dir)
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        cfgp = d / "tokenizer_config.json"
        cfg = json.loads(cfgp.read_text()) if cfgp.is_file() else {}
        template = cfg.get("chat_template")
        if (d / "chat_template.jinja").is_file():
            template = (d / "chat_template.jinja").read_text()
        elif isinstance(template, list):  # several named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)

        def spelled(key: str) -> str | None:
            v = cfg.get(key)
            return v.get("content") if isinstance(v, dict) else v

        def tid(key: str, text: str | None) -> int:
            if cfg.get(key + "_id") is not None:
                return int(cfg[key + "_id"])
            i = tok.token_to_id(text) if text else None
            return -1 if i is None else int(i)

        bos, eos = spelled("bos_token"), spelled("eos_token")
        bos_id, eos_id = tid("bos_token", bos), tid("eos_token", eos)
        stops = {eos_id} - {-1}
        if (d / "config.json").is_file():
            from .config import ModelConfig

            try:
                m = ModelConfig.load(d)
            except ValueError:
                m = None
            if m is not None:
                stops |= {i for i in m.all_stop_ids if i >= 0}
                if eos_id < 0 and m.eos_id >= 0:
                    eos_id, eos = m.eos_id, tok.id_to_token(m.eos_id)
                if bos_id < 0 and m.bos_id >= 0 and not cfg:
                    bos_id, bos = m.bos_id, tok.id_to_token(m.bos_id)
        return cls(tokenizer=tok, chat_template=template, bos_token=bos or "", eos_token=eos or "",
                   bos_id=bos_id, eos_id=eos_id, stop_ids=frozenset(stops))

    @classmethod
    def from_gguf(cls, gguf_path: Path | str) -> "ChatTokenizer":
        """Build straight from a GGUF file's metadata (no cache files)."""
        import gguf

        from .config import gguf_metadata

        meta = gguf_metadata(gguf.GGUFReader(str(gguf_path)))
        tokens = meta["tokenizer.ggml.tokens"]
        bos = int(meta.get("tokenizer.ggml.bos_token_id", -1))
        eos = int(meta.get("tokenizer.ggml.eos_token_id", -1))
        stops = {int(meta[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                        "tokenizer.ggml.eom_token_id") if k in meta}
        return cls(build_tokenizer(meta), meta.get("tokenizer.chat_template"), tokens[bos] if bos >= 0 else "",
                   tokens[eos] if eos >= 0 else "", bos, eos, frozenset(stops))

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
