#!/usr/bin/env python3
"""Write a random-weight Llama-shaped GGUF whose matrices are GGUF blocks (held as stored).

For the GPU runs (docs/benchmarks.md): checkpoints of billions of weights cannot be carried to
the device machine, so they are made there. The blocks are random bytes with their float16
scales set so every weight is about N(0, 1/in) (the spread of a trained layer's init), not a
quantization of float values (quantizing 3-8 billion weights in numpy would take longer than
the run; the kernels' speed does not depend on the values). Every tensor is written with
gguf-py's ``GGUFWriter`` (the format's reference writer), one tensor at a time.

Shapes (``--shape``): ``smollm2`` (SmolLM2-135M; its 576-wide rows take only the 32-weight formats), ``llama-3b`` (Llama-3.2-3B: 28 x 3072, 24 heads, 8 KV heads, FFN 8192,
vocab 128256, tied head), ``llama-8b`` (Llama-3-8B: 32 x 4096, 32 heads, 8 KV heads, FFN 14336,
vocab 128256, own head), ``tiny`` (tests). Mixes (``--mix``): one format for every matrix
(``q8_0``, ``q4_0``, ``q4_1``, ``q4_k``, ``q6_k``, ``f16``), or ``q4_k_m`` (llama.cpp's Q4_K_M
choice of types: Q6_K for ``attn_v`` and ``ffn_down`` in every other layer from the first and
for the head, Q4_K elsewhere; llama.cpp's ``llama_tensor_get_type`` picks which layers, a
simplification of its "use more bits" rule).

Tokenizer (``--tokenizer-from GGUF``): a random checkpoint has no tokenizer of its own, and a real
room takes its questions as text. This copies every ``tokenizer.*`` key of another GGUF (e.g. the
bundled SmolLM2's: byte-level BPE, 49,152 tokens, its chat template) into the new file and sizes the
embedding and head to that vocabulary, so the shape is the named one except for the vocabulary.
The answers are random tokens of that vocabulary; the speed does not depend on what they say.
``--tokenizer-only`` writes just those keys (no tensors): a small file to carry to a machine that
lacks the donor model.

Usage: ``python scripts/make_gguf.py --shape llama-3b --mix q4_k --out /tmp/llama3b-q4k.gguf``
(``--tokenizer-from smollm2.gguf`` for a checkpoint a real room can run)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime import gguf_blocks as gb  # noqa: E402

#: ``{name: (layers, hidden, heads, kv_heads, ffn, vocab, tied)}``
SHAPES = {
    "tiny": (3, 256, 4, 2, 512, 512, True),
    "smollm2": (30, 576, 9, 3, 1536, 49152, True),
    "llama-1b": (16, 2048, 32, 8, 8192, 128256, True),
    "llama-3b": (28, 3072, 24, 8, 8192, 128256, True),
    "llama-8b": (32, 4096, 32, 8, 14336, 128256, False),
}
MIXES = tuple(gb.FORMATS) + ("f16", "q4_k_m")


def random_blocks(fmt: str, out: int, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """``uint8 [out, row bytes]`` random blocks of ``fmt`` whose values are about N(0, 1/n_in)
    in spread: random codes, scales chosen for that spread (Q4_K: every 6-bit scale and min 32,
    ``dmin = 7.5 d`` so the codes centre on 0)."""
    if fmt == "f16":
        return (rng.standard_normal((out, n_in), np.float32) / np.float32(np.sqrt(n_in))).astype("<f2").view(np.uint8)
    _, bs, nb = gb.FORMATS[fmt]
    data = rng.integers(0, 256, size=(out * (n_in // bs), nb), dtype=np.uint8)
    std = 1.0 / np.sqrt(n_in)

    def put(off, vals):
        data[:, off:off + 2] = np.asarray(vals, dtype="<f2").reshape(-1, 1).view(np.uint8).reshape(-1, 2)

    nblk = data.shape[0]
    if fmt == "q8_0":  # int8 uniform: std 73.9
        put(0, np.full(nblk, std / 73.9))
    elif fmt == "q4_0":  # codes - 8 uniform: std 4.6
        put(0, np.full(nblk, std / 4.6))
    elif fmt == "q4_1":
        put(0, np.full(nblk, std / 4.6))
        put(2, np.full(nblk, -7.5 * std / 4.6))
    elif fmt == "q4_k":
        d = std / (32 * 4.6)
        put(0, np.full(nblk, d))
        put(2, np.full(nblk, 7.5 * d))
        data[:, 4:16] = 32  # the packed scales: 6-bit fields 32, their top bits 0 in every byte
    else:  # q6_k: codes - 32 uniform: std 18.5; int8 scales 16
        data[:, 192:208] = 16
        put(208, np.full(nblk, std / (16 * 18.5)))
    return data.reshape(out, -1)


def fmt_of(mix: str, kind: str, layer: int) -> str:
    """The format of matrix ``kind`` (``attn_v``, ``ffn_down``, ``output``, ``token_embd``, ...) in ``layer``."""
    if mix != "q4_k_m":
        return mix
    if kind == "output" or (kind in ("attn_v", "ffn_down") and layer % 2 == 0):
        return "q6_k"
    return "q4_k"


def tokenizer_fields(donor: str | Path) -> list[tuple[str, object, object, object]]:
    """``[(key, value, type, array element type)]`` of every ``tokenizer.*`` key of the GGUF
    ``donor``, values as gguf-py's reader gives them. Raises ValueError when it has none."""
    import gguf

    r = gguf.GGUFReader(str(donor))
    out = []
    for key, f in r.fields.items():
        if key.startswith("tokenizer."):
            sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
            out.append((key, f.contents(), f.types[0], sub))
    if not any(k == "tokenizer.ggml.tokens" for k, *_ in out):
        raise ValueError(f"{donor} has no tokenizer.ggml.tokens to copy")
    return out


def _add_fields(w, fields) -> int:
    """Put ``fields`` (:func:`tokenizer_fields`) into the writer ``w``; returns the token count."""
    n = 0
    for key, val, vtype, sub in fields:
        w.add_key_value(key, val, vtype, sub_type=sub)
        if key == "tokenizer.ggml.tokens":
            n = len(val)
    return n


def write_tokenizer_only(path: str | Path, donor: str | Path) -> int:
    """Write a GGUF holding only ``donor``'s ``tokenizer.*`` keys (no tensors); returns its size."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    _add_fields(w, tokenizer_fields(donor))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path).stat().st_size


def write(path: str | Path, shape: str = "tiny", mix: str = "q4_k", seed: int = 0,
          tokenizer_from: str | Path | None = None) -> int:
    """Write the GGUF; returns its size in bytes. ``tokenizer_from``: a GGUF whose tokenizer keys
    are copied (the vocabulary then is its token count). Raises ValueError for an unknown shape or
    mix, or a donor without a tokenizer."""
    import gguf

    if shape not in SHAPES or mix not in MIXES:
        raise ValueError(f"shape one of {', '.join(SHAPES)}, mix one of {', '.join(MIXES)}")
    L, H, NH, KV, F, V, tied = SHAPES[shape]
    fields = tokenizer_fields(tokenizer_from) if tokenizer_from is not None else []
    D = H // NH
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"random-{shape}-{mix}")
    w.add_block_count(L)
    w.add_context_length(8192)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_head_count(NH)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    if fields:
        V = _add_fields(w, fields)
    w.add_vocab_size(V)
    types = {f: getattr(gguf.GGMLQuantizationType, f.upper()) for f in MIXES if f != "q4_k_m"}

    def mat(name, kind, layer, out, n_in):
        f = fmt_of(mix, kind, layer)
        blocks = random_blocks(f, out, n_in, rng)
        w.add_tensor(name, blocks, raw_shape=(out, blocks.shape[1]), raw_dtype=types[f])

    mat("token_embd.weight", "token_embd", 0, V, H)
    w.add_tensor("output_norm.weight", np.ones(H, np.float32))
    if not tied:
        mat("output.weight", "output", 0, V, H)
    for i in range(L):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(H, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(H, np.float32))
        for kind, out, n_in in (("attn_q", NH * D, H), ("attn_k", KV * D, H), ("attn_v", KV * D, H),
                                ("attn_output", H, NH * D), ("ffn_gate", F, H), ("ffn_up", F, H), ("ffn_down", H, F)):
            mat(f"blk.{i}.{kind}.weight", kind, i, out, n_in)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path).stat().st_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=tuple(SHAPES), default="llama-3b")
    ap.add_argument("--mix", choices=MIXES, default="q4_k")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-from", help="copy this GGUF's tokenizer (and its vocabulary size)")
    ap.add_argument("--tokenizer-only", action="store_true", help="write only --tokenizer-from's tokenizer keys")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        if a.tokenizer_only:
            if not a.tokenizer_from:
                ap.error("--tokenizer-only needs --tokenizer-from")
            n = write_tokenizer_only(a.out, a.tokenizer_from)
            print(f"wrote {a.out}: {n / 1e6:.2f} MB (the tokenizer of {a.tokenizer_from})")
            return 0
        n = write(a.out, a.shape, a.mix, a.seed, a.tokenizer_from)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}: {n / 1e9:.2f} GB ({a.shape}, {a.mix})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
